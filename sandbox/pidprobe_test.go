package sandbox

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandcell/sandcell/sandbox/protocol"
)

// TestPidProbeKeepsOnlyTheKernelsAnswer: a probe that ends without the kernel's
// answer (killed at its timeout on a loaded machine, crashed) decides nothing: workers
// still get a pid namespace and the next launch probes again. Before, one such probe
// took the pid namespace from every later worker of the spawner, and each run that
// required it was rejected ("pidns: the worker does not have a namespace of its
// own" in a CI run of the warm suite). A refusal (ProbeRefused) is kept, with its
// reason.
func TestPidProbeKeepsOnlyTheKernelsAnswer(t *testing.T) {
	if err := exec.Command("unshare", "--user", "--pid", "--fork", "true").Run(); err != nil {
		t.Skipf("no user and pid namespaces here (unshare: %v): the probe is not run", err)
	}
	dir := t.TempDir()
	script := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	// (The probe is pid 1 of its namespace, where a signal from inside is ignored:
	// a crash stands for every end that is not an answer.)
	s := &Spawner{Exe: script("crashed", "exit 2")}
	for i := range 2 {
		if !s.pidNamespace() || s.pidProbed {
			t.Fatalf("probe %d, crashed: pid namespace %v, decided %v", i, s.pidNamespace(), s.pidProbed)
		}
	}
	if s.pidRetry.IsZero() {
		t.Fatal("no backoff after a probe without an answer")
	}
	s.pidRetry = time.Time{} // probe again now
	s.Exe = script("failed", "exit 1")
	if !s.pidNamespace() || s.pidProbed {
		t.Fatalf("a probe that exited 1: pid namespace %v, decided %v", s.pidNamespace(), s.pidProbed)
	}
	s.pidRetry = time.Time{}
	s.Exe = script("refused", "echo 'mount proc for this pid namespace: operation not permitted' >&2; exit "+
		strconv.Itoa(protocol.ProbeRefused))
	if s.pidNamespace() || !s.pidProbed {
		t.Fatalf("a refused probe: pid namespace %v, decided %v", s.pidNamespace(), s.pidProbed)
	}
	if why := s.pidnsErr.Load(); why == nil || !strings.Contains(*why, "operation not permitted") {
		t.Fatalf("reason %v", why)
	}
	s.Exe = script("allowed", "exit 0")
	if s.pidNamespace() {
		t.Fatal("the kernel's refusal was forgotten")
	}
}
