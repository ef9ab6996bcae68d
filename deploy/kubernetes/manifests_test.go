// Package kubernetes holds the manifests that run Sandcell behind a Kubernetes
// Deployment; this test validates them offline.
package kubernetes_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	"github.com/sandcell/sandcell/supervisor/api"
	"github.com/sandcell/sandcell/supervisor/config"
)

// decode strictly decodes the manifest file into out: YAML to JSON, then
// encoding/json with unknown fields refused (a misspelt or misplaced key fails, as
// `kubectl apply --validate=strict` would), one document per file, and the kind
// and apiVersion must be want's.
func decode(t *testing.T, file, apiVersion, kind string, out any) {
	t.Helper()
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(raw), "\n---") {
		t.Fatalf("%s: one object per file", file)
	}
	js, err := yaml.YAMLToJSONStrict(raw)
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	if err := dec.Decode(out); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	var tm struct{ APIVersion, Kind string }
	json.Unmarshal(js, &tm)
	if tm.APIVersion != apiVersion || tm.Kind != kind {
		t.Fatalf("%s: %s %s, want %s %s", file, tm.APIVersion, tm.Kind, apiVersion, kind)
	}
}

func TestEveryManifestIsChecked(t *testing.T) {
	files, _ := filepath.Glob("*.yaml")
	slices.Sort(files)
	want := []string{"deployment.yaml", "hpa.yaml", "pdb.yaml", "secret.yaml", "service.yaml"}
	if !slices.Equal(files, want) {
		t.Fatalf("manifests %v; this test checks %v", files, want)
	}
}

// TestDeployment checks the restricted Pod Security Standard
// (https://kubernetes.io/docs/concepts/security/pod-security-standards/), the probes,
// resources and the daemon's settings.
func TestDeployment(t *testing.T) {
	var d appsv1.Deployment
	decode(t, "deployment.yaml", "apps/v1", "Deployment", &d)
	pod := d.Spec.Template.Spec
	if d.Spec.Selector == nil || d.Spec.Selector.MatchLabels["app.kubernetes.io/name"] != d.Spec.Template.Labels["app.kubernetes.io/name"] {
		t.Fatal("the selector does not match the pod template's labels")
	}
	if d.Spec.Replicas == nil || *d.Spec.Replicas < 2 {
		t.Error("fewer than 2 replicas: the PodDisruptionBudget would block every drain")
	}
	if pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
		t.Error("automountServiceAccountToken must be false: the pod has no use for API credentials")
	}
	psc := pod.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser != 65532 {
		t.Error("pod: runAsNonRoot with uid 65532 (the image's user)")
	}
	if psc == nil || psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Error("pod: seccompProfile RuntimeDefault")
	}
	if pod.HostNetwork || pod.HostPID || pod.HostIPC {
		t.Error("host namespaces are forbidden by the restricted standard")
	}
	if len(pod.Containers) != 1 || len(pod.InitContainers) != 0 {
		t.Fatalf("one container, no init containers; got %d and %d", len(pod.Containers), len(pod.InitContainers))
	}
	c := pod.Containers[0]
	sc := c.SecurityContext
	switch {
	case sc == nil:
		t.Fatal("container: no securityContext")
	case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
		t.Error("container: allowPrivilegeEscalation must be false")
	case sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
		t.Error("container: readOnlyRootFilesystem must be true")
	case sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) != 0:
		t.Error("container: capabilities must drop ALL and add none")
	case sc.Privileged != nil && *sc.Privileged:
		t.Error("container: privileged")
	case sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault:
		t.Error("container: seccompProfile RuntimeDefault")
	case sc.ProcMount != nil && *sc.ProcMount != corev1.DefaultProcMount:
		t.Error("container: procMount must be Default under the restricted standard")
	case sc.RunAsNonRoot != nil && !*sc.RunAsNonRoot, sc.RunAsUser != nil && *sc.RunAsUser == 0:
		t.Error("container: runAsNonRoot false or runAsUser 0 overrides the pod's non-root user")
	}
	for _, p := range c.Ports {
		if p.HostPort != 0 {
			t.Errorf("port %s: hostPort is forbidden", p.Name)
		}
	}
	for _, v := range pod.Volumes {
		if v.HostPath != nil {
			t.Errorf("volume %s: hostPath is forbidden", v.Name)
		}
		// The daemon refuses a tokens file writable by group or others.
		if v.Secret != nil && (v.Secret.DefaultMode == nil || *v.Secret.DefaultMode&0o022 != 0) {
			t.Errorf("volume %s: defaultMode must leave the files writable by no one but the owner", v.Name)
		}
	}

	for name, p := range map[string]*corev1.Probe{"startupProbe": c.StartupProbe, "readinessProbe": c.ReadinessProbe, "livenessProbe": c.LivenessProbe} {
		want := "/readyz"
		if name == "livenessProbe" {
			want = "/livez"
		}
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != want || p.HTTPGet.Port != intstr.FromString("api") {
			t.Errorf("%s: want httpGet %s on port api", name, want)
		}
	}
	if p := c.StartupProbe; p != nil && int(p.PeriodSeconds)*int(p.FailureThreshold) < 120 {
		t.Errorf("startupProbe allows %d s; the first start compiles a module (allow 2 min)", p.PeriodSeconds*p.FailureThreshold)
	}
	for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		req, lim := c.Resources.Requests[r], c.Resources.Limits[r]
		if req.IsZero() || lim.IsZero() || req.Cmp(lim) > 0 {
			t.Errorf("resources %s: request %s, limit %s", r, req.String(), lim.String())
		}
	}

	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	if len(c.Ports) != 1 || c.Ports[0].Name != "api" || !strings.HasSuffix(env["SANDCELL_TCP_LISTEN"], fmt.Sprintf(":%d", c.Ports[0].ContainerPort)) {
		t.Errorf("SANDCELL_TCP_LISTEN %q does not listen on the container port named api", env["SANDCELL_TCP_LISTEN"])
	}
	// The daemon's grace must fit in the pod's.
	cfg := config.Default()
	if g := env["SANDCELL_RUNS_SHUTDOWN_GRACE"]; g != "" {
		if err := cfg.Runs.ShutdownGrace.UnmarshalText([]byte(g)); err != nil {
			t.Fatal(err)
		}
	}
	var preStop float64
	if l := c.Lifecycle; l == nil || l.PreStop == nil || l.PreStop.Sleep == nil || l.PreStop.Sleep.Seconds < 1 {
		t.Error("no preStop sleep: connections the Service still sends after SIGTERM would be refused")
	} else {
		preStop = float64(l.PreStop.Sleep.Seconds)
	}
	if pod.TerminationGracePeriodSeconds == nil || preStop+cfg.Runs.ShutdownGrace.Seconds()+5 > float64(*pod.TerminationGracePeriodSeconds) {
		t.Errorf("terminationGracePeriodSeconds must exceed the preStop sleep and runs.shutdown_grace (%v) by 5 s", cfg.Runs.ShutdownGrace)
	}
	// Memory: every run at once at its largest, its worker, and the daemon.
	concurrent, maxMiB := 1, cfg.Limits.Max.MemoryMiB
	fmt.Sscan(env["SANDCELL_RUNS_MAX_CONCURRENT"], &concurrent)
	fmt.Sscan(env["SANDCELL_LIMITS_MAX_MEMORY_MIB"], &maxMiB)
	if concurrent < 1 || maxMiB < 1 {
		t.Fatal("SANDCELL_RUNS_MAX_CONCURRENT and SANDCELL_LIMITS_MAX_MEMORY_MIB must be set (the defaults follow the node's CPUs and allow 4 GiB per run)")
	}
	need := int64(concurrent)*(maxMiB+64)<<20 + 384<<20
	if lim := c.Resources.Limits[corev1.ResourceMemory]; lim.Value() < need {
		t.Errorf("memory limit %s < %d MiB: %d runs of %d MiB, their workers and the daemon", lim.String(), need>>20, concurrent, maxMiB)
	}
	if cpu := c.Resources.Limits[corev1.ResourceCPU]; cpu.Value() < int64(concurrent) {
		t.Errorf("CPU limit %s below runs.max_concurrent %d", cpu.String(), concurrent)
	}
	mounts := map[string]corev1.VolumeMount{}
	for _, m := range c.VolumeMounts {
		mounts[m.MountPath] = m
	}
	tokens := filepath.Dir(env["SANDCELL_TCP_TOKENS_FILE"])
	if m, ok := mounts[tokens]; !ok || !m.ReadOnly {
		t.Errorf("the tokens file's directory %s is not a read-only mount", tokens)
	} else if !secretVolume(pod, m.Name, "sandcell-tokens") {
		t.Errorf("%s is not the Secret sandcell-tokens", tokens)
	}
	for _, dir := range []string{cfg.State.Dir, "/run", "/tmp"} {
		if _, ok := mounts[dir]; !ok {
			t.Errorf("%s needs a writable volume (the root filesystem is read-only)", dir)
		}
	}
}

func secretVolume(pod corev1.PodSpec, volume, secret string) bool {
	for _, v := range pod.Volumes {
		if v.Name == volume {
			return v.Secret != nil && v.Secret.SecretName == secret
		}
	}
	return false
}

func TestService(t *testing.T) {
	var s corev1.Service
	decode(t, "service.yaml", "v1", "Service", &s)
	var d appsv1.Deployment
	decode(t, "deployment.yaml", "apps/v1", "Deployment", &d)
	if s.Spec.Type != corev1.ServiceTypeClusterIP {
		t.Error("the API stays inside the cluster (ClusterIP)")
	}
	for k, v := range s.Spec.Selector {
		if d.Spec.Template.Labels[k] != v {
			t.Errorf("selector %s=%s does not select the Deployment's pods", k, v)
		}
	}
	if len(s.Spec.Ports) != 1 || s.Spec.Ports[0].TargetPort != intstr.FromString("api") {
		t.Error("one port, targeting the container port named api")
	}
}

// TestPodDisruptionBudget: the budget selects the pods and lets at least one go at
// the fewest replicas there can be (a budget that allows none blocks every drain).
func TestPodDisruptionBudget(t *testing.T) {
	var p policyv1.PodDisruptionBudget
	decode(t, "pdb.yaml", "policy/v1", "PodDisruptionBudget", &p)
	var h autoscalingv2.HorizontalPodAutoscaler
	decode(t, "hpa.yaml", "autoscaling/v2", "HorizontalPodAutoscaler", &h)
	if p.Spec.Selector == nil || p.Spec.Selector.MatchLabels["app.kubernetes.io/name"] != "sandcell" {
		t.Error("the budget does not select the pods")
	}
	fewest := 1
	if h.Spec.MinReplicas != nil {
		fewest = int(*h.Spec.MinReplicas)
	}
	var allowed int
	switch {
	case p.Spec.MaxUnavailable != nil && p.Spec.MinAvailable == nil:
		v, err := intstr.GetScaledValueFromIntOrPercent(p.Spec.MaxUnavailable, fewest, false)
		if err != nil {
			t.Fatal(err)
		}
		allowed = v
	case p.Spec.MinAvailable != nil && p.Spec.MaxUnavailable == nil:
		v, err := intstr.GetScaledValueFromIntOrPercent(p.Spec.MinAvailable, fewest, true)
		if err != nil {
			t.Fatal(err)
		}
		allowed = fewest - v
	default:
		t.Fatal("exactly one of maxUnavailable and minAvailable")
	}
	if allowed < 1 {
		t.Errorf("at %d replicas the budget allows %d disruptions: node drains would block", fewest, allowed)
	}
}

func TestHorizontalPodAutoscaler(t *testing.T) {
	var h autoscalingv2.HorizontalPodAutoscaler
	decode(t, "hpa.yaml", "autoscaling/v2", "HorizontalPodAutoscaler", &h)
	if r := h.Spec.ScaleTargetRef; r.Kind != "Deployment" || r.Name != "sandcell" {
		t.Errorf("scales %s %s", r.Kind, r.Name)
	}
	if h.Spec.MinReplicas == nil || *h.Spec.MinReplicas < 2 || h.Spec.MaxReplicas < *h.Spec.MinReplicas {
		t.Error("minReplicas at least 2 (the budget allows one down), maxReplicas above it")
	}
	if len(h.Spec.Metrics) != 1 || h.Spec.Metrics[0].Resource == nil || h.Spec.Metrics[0].Resource.Name != corev1.ResourceCPU {
		t.Error("scales on CPU")
	}
}

// TestTokenSecret: the Secret ships no usable token (no known secret in a
// repository), and its entries, once filled in, are what the daemon loads.
func TestTokenSecret(t *testing.T) {
	var s corev1.Secret
	decode(t, "secret.yaml", "v1", "Secret", &s)
	body, ok := s.StringData["tokens.toml"]
	if !ok || s.Name != "sandcell-tokens" {
		t.Fatal("Secret sandcell-tokens with key tokens.toml")
	}
	// As the daemon loads it: the template has no entry (it refuses to start);
	// the commented example, filled in, is a valid entry.
	dir := t.TempDir()
	write := func(body string) string {
		p := filepath.Join(dir, "tokens.toml")
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	if tokens, err := api.LoadTokens(write(body)); err == nil && len(tokens) > 0 {
		t.Errorf("the template holds a live token: %v", tokens)
	}
	example := strings.NewReplacer("# ", "", "<64 hex digits from sandcell token new>", strings.Repeat("ab", 32)).Replace(body)
	if tokens, err := api.LoadTokens(write(example)); err != nil || len(tokens) != 1 || tokens[0].Name != "ci" {
		t.Errorf("the commented example is not a valid [[token]] entry: %v %v", err, tokens)
	}
}
