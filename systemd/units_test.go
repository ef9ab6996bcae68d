package systemd

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"

	"github.com/coreos/go-systemd/v22/unit"
)

func options(t *testing.T, name string) map[string][]string {
	t.Helper()
	f, err := os.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	opts, err := unit.DeserializeOptions(f)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string][]string{}
	for _, o := range opts {
		m[o.Section+"."+o.Name] = append(m[o.Section+"."+o.Name], o.Value)
	}
	return m
}

// The settings the daemon depends on, and the ones it must never have.
func TestServiceSettings(t *testing.T) {
	svc := options(t, "sandcell.service")
	for key, want := range map[string]string{
		"Service.Type": "notify", "Service.NotifyAccess": "main", "Service.User": "sandcell",
		"Service.Restart": "on-failure", "Service.ExecStartPre": "/usr/bin/sandcell config validate",
		"Service.StateDirectory": "sandcell", "Service.CacheDirectory": "sandcell", "Service.RuntimeDirectory": "sandcell",
		"Service.NoNewPrivileges": "yes", "Unit.Requires": "sandcell.socket",
	} {
		if got := svc[key]; len(got) != 1 || got[0] != want {
			t.Errorf("%s = %v, want %s", key, got, want)
		}
	}
	for _, key := range []string{"Service.WatchdogSec", "Service.MemoryMax", "Service.TasksMax", "Service.RestrictNamespaces"} {
		if len(svc[key]) == 0 {
			t.Errorf("%s is not set", key)
		}
	}
	// wasmtime reserves large virtual ranges (no LimitAS=) and maps compiled code
	// executable (no MemoryDenyWriteExecute=).
	for _, key := range []string{"Service.LimitAS", "Service.MemoryDenyWriteExecute", "Service.PrivateUsers"} {
		if len(svc[key]) != 0 {
			t.Errorf("%s must not be set: %v", key, svc[key])
		}
	}
	sock := options(t, "sandcell.socket")
	for key, want := range map[string]string{"Socket.ListenStream": "/run/sandcell/sandcell.sock",
		"Socket.SocketMode": "0660", "Socket.SocketGroup": "sandcell", "Socket.FileDescriptorName": "api"} {
		if got := sock[key]; len(got) != 1 || got[0] != want {
			t.Errorf("%s = %v, want %s", key, got, want)
		}
	}
}

// analyze runs systemd-analyze, skipping where systemd's tools are not installed.
func analyze(t *testing.T, args ...string) (string, error) {
	t.Helper()
	tool, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze is not installed (Debian package systemd)")
	}
	out, err := exec.Command(tool, args...).CombinedOutput()
	return string(out), err
}

// systemd-analyze verify prints nothing for the units, in a root that holds them,
// the commands they run and the targets they name.
func TestUnitsVerify(t *testing.T) {
	root := t.TempDir()
	for _, d := range []string{"usr/bin", "bin", "etc/systemd/system", "lib/systemd/system"} {
		os.MkdirAll(filepath.Join(root, d), 0o755)
	}
	for _, u := range []string{"sandcell.service", "sandcell.socket"} {
		b, _ := os.ReadFile(u)
		os.WriteFile(filepath.Join(root, "etc/systemd/system", u), b, 0o644)
	}
	os.WriteFile(filepath.Join(root, "usr/bin/sandcell"), []byte("#!/bin/sh\n"), 0o755)
	os.WriteFile(filepath.Join(root, "bin/kill"), []byte("#!/bin/sh\n"), 0o755)
	for _, target := range []string{"sysinit.target", "sockets.target", "basic.target", "shutdown.target", "multi-user.target"} {
		b, err := os.ReadFile(filepath.Join("/lib/systemd/system", target))
		if err != nil {
			t.Skipf("no %s on this host to verify against: %v", target, err)
		}
		os.WriteFile(filepath.Join(root, "lib/systemd/system", target), b, 0o644)
	}
	out, err := analyze(t, "verify", "--man=no", "--root="+root, "sandcell.service", "sandcell.socket")
	if err != nil || out != "" {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
}

// maxExposure is the exposure the service reaches: what remains is what the worker's
// own sandbox needs (creating user, mount, network, PID, IPC and UTS namespaces;
// the new mount API, pivot_root and capset; Unix sockets; no W^X for the JIT) and
// PrivateUsers=, which would turn every client's SO_PEERCRED uid into nobody. docs/operator.md
// ("Verified readiness and systemd") gives each remaining item.
const maxExposure = 1.3

func TestExposure(t *testing.T) {
	out, err := analyze(t, "security", "--offline=yes", "sandcell.service")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	m := regexp.MustCompile(`Overall exposure level for sandcell.service: ([0-9.]+)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no exposure level in:\n%s", out)
	}
	if v, _ := strconv.ParseFloat(m[1], 64); v > maxExposure {
		t.Fatalf("exposure %s, more than %.1f:\n%s", m[1], maxExposure, out)
	}
	t.Logf("exposure %s", m[1])
}
