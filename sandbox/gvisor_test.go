package sandbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandcell/sandcell/sandbox"
	"github.com/sandcell/sandcell/sandbox/policy"
	"github.com/sandcell/sandcell/sandbox/protocol"
	"golang.org/x/sys/unix"
)

// gvisorRequire is a native policy's require list with the gvisor layer: it and
// every other layer but Landlock, which gVisor's kernel does not have.
func gvisorRequire() []string {
	out := []string{protocol.LayerGVisor}
	for _, l := range protocol.Layers() {
		if l != protocol.LayerLandlock {
			out = append(out, l)
		}
	}
	return out
}

// gvisorSpawner returns a spawner whose native runs may go through runsc, skipping
// the test (saying why) where runsc is not installed or the kernel cannot run it.
func gvisorSpawner(t *testing.T) *sandbox.Spawner {
	t.Helper()
	if _, err := exec.LookPath("runsc"); err != nil {
		t.Skip("no runsc (apt-get install runsc): the gvisor layer is not offered here")
	}
	dir := filepath.Join(t.TempDir(), "gvisor")
	// What a run of a process that died left is removed; a live process's run and
	// anything else are not.
	live := fmt.Sprintf("run-%d-x", os.Getppid())
	for _, d := range []string{"run-999999999-x/bundle", live, "kept"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	g, err := sandbox.NewGVisor("runsc", dir)
	if err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 2 || ents[0].Name() != "kept" || ents[1].Name() != live {
		t.Fatalf("%s after NewGVisor: %v", dir, ents)
	}
	os.Remove(filepath.Join(dir, "kept"))
	os.Remove(filepath.Join(dir, live))
	// Not a directory of this user's: refused (a link planted in a shared /tmp).
	link := filepath.Join(t.TempDir(), "link")
	os.Symlink(t.TempDir(), link)
	if _, err := sandbox.NewGVisor("runsc", link); err == nil {
		t.Fatal("NewGVisor took a symbolic link as its directory")
	}
	sp := sandbox.NewSpawner()
	sp.GVisor = g
	return sp
}

// runGVisor runs code on the native backend under gVisor (policy's require list
// gvisorRequire, changed by edit) in a fresh workspace.
func runGVisor(t *testing.T, sp *sandbox.Spawner, code string, edit func(*protocol.Request, *policy.Policy)) (protocol.Result, string) {
	t.Helper()
	req := nativeRequest(t, code, func(r *protocol.Request, p *policy.Policy) {
		p.NativeRequire = gvisorRequire()
		if edit != nil {
			edit(r, p)
		}
	})
	res, err := sp.Run(context.Background(), req)
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	return res, req.Workspace
}

// TestGVisor runs the stack under gVisor: the program, its stdin, arguments and
// workspace as on the native backend, the contract naming gVisor, the native
// seccomp profile in force inside (no socket, no fork, no executable memory of the
// guest's), the limits, displays, and nothing of runsc left once a run ends.
func TestGVisor(t *testing.T) {
	sp := gvisorSpawner(t)
	gdir := sp.GVisor.Dir
	rootBefore, err := os.ReadDir(nativeRoot(t))
	if err != nil {
		t.Fatal(err)
	}

	res, ws := runGVisor(t, sp, `import sys, os, mmap, socket
import numpy, pandas as pd
import matplotlib.pyplot as plt
print(sys.argv, os.getcwd(), sys.stdin.read())
print(pd.DataFrame({"a": [1, 2]}).sum().to_dict())
open("out.txt", "w").write("hi")
import threading, select
t = threading.Thread(target=select.select, args=([], [], [], 0.01))
t.start()
t.join()
print("thread and select ok")
for name, f in [("socket", lambda: socket.socket()), ("fork", os.fork),
                ("exec memory", lambda: mmap.mmap(-1, 4096, prot=7)),
                ("outside", lambda: open("/etc/passwd", "a")),
                ("exec", lambda: os.execv("/usr/bin/getconf", ["getconf", "PAGESIZE"]))]:
    try:
        f()
        print(name, "allowed")
    except OSError as e:
        print(name, "refused", e.errno)
os.close(0)  # stdin: the runner's channel stays open (its report names the figure)
plt.plot([1, 2, 3])
`, func(r *protocol.Request, _ *policy.Policy) {
		r.Stdin = []byte("from stdin")
		r.Args = []string{"a1"}
	})
	wantExit(t, res, 0)
	out := string(res.Stdout)
	for _, want := range []string{"['-c', 'a1'] /ws from stdin", "{'a': 3}", "thread and select ok", "socket refused 1", "fork refused 1",
		"exec memory refused 1", "outside refused", "exec refused 1"} {
		if !strings.Contains(out, want) {
			t.Errorf("stdout lacks %q:\n%s\nstderr %s", want, out, res.Stderr)
		}
	}
	if b, err := os.ReadFile(filepath.Join(ws, "out.txt")); err != nil || string(b) != "hi" {
		t.Errorf("out.txt: %q %v", b, err)
	}
	e := res.Enforcement
	if e == nil || e.GVisor == nil || !e.GVisor.Active || e.GVisor.Platform != sandbox.GVisorPlatform ||
		len(e.GVisor.Spec) != 64 || !strings.HasPrefix(e.GVisor.Version, "runsc version") {
		t.Fatalf("contract %+v", e)
	}
	if missing := e.Missing(gvisorRequire()); len(missing) > 0 || e.Landlock.Active || e.Errors[protocol.LayerLandlock] == "" {
		t.Errorf("contract: missing %v, landlock %+v, errors %v", missing, e.Landlock, e.Errors)
	}
	if e.Rlimits["AS"] == 0 || e.Rlimits["CORE"] != 0 || !e.NoNewPrivs || e.Capabilities != "=" || !e.Seccomp.Active {
		t.Errorf("contract %+v", e)
	}
	if len(res.Displays) != 1 || res.Displays[0].Type != "image/png" {
		t.Errorf("displays %+v", res.Displays)
	}

	// The limits: memory (RLIMIT_AS), CPU (the daemon's watch), the wall clock.
	res, _ = runGVisor(t, sp, `b = bytearray(512 << 20)`, func(r *protocol.Request, _ *policy.Policy) {
		r.Limits.MemoryBytes = 256 << 20
	})
	if res.Reason != protocol.MemoryLimit {
		t.Errorf("512 MiB in 256: %s %d %q %v", res.Reason, res.ExitCode, res.Stderr, res.Diagnostics)
	}
	// Files in memory count too: runsc's writable /dev is bounded by the
	// sandbox's memory limit (memory, /tmp and the headroom), /dev/shm is none.
	res, _ = runGVisor(t, sp, `import os
try:
    open("/dev/shm/x", "wb")
except OSError as e:
    print("shm", e.errno, flush=True)
with open("/dev/x", "wb") as f:
    for i in range(1024):
        f.write(b"x" * (1 << 20))
`, func(r *protocol.Request, _ *policy.Policy) { r.Limits.MemoryBytes = 256 << 20 })
	if res.Reason != protocol.Trap || !strings.Contains(strings.Join(res.Diagnostics, " "), "memory limit") ||
		!strings.Contains(string(res.Stdout), "shm 30") {
		t.Errorf("1 GiB written to /dev: %s %q %v", res.Reason, res.Stdout, res.Diagnostics)
	}
	// A signal is a trap, as on the native backend; the environment arrives after
	// the contract (the dynamic loader never sees the caller's LD_PRELOAD).
	res, _ = runGVisor(t, sp, `import os, signal
print(os.environ["SANDCELL_TEST"], os.environ.get("LD_PRELOAD"), flush=True)
os.kill(os.getpid(), signal.SIGSEGV)`, func(r *protocol.Request, _ *policy.Policy) {
		r.Env = map[string]string{"SANDCELL_TEST": "from the caller", "LD_PRELOAD": "/ws/none.so"}
	})
	if res.Reason != protocol.Trap || string(res.Stdout) != "from the caller /ws/none.so\n" || strings.Contains(string(res.Stderr), "preload") {
		t.Errorf("SIGSEGV: %s %q %q %v", res.Reason, res.Stdout, res.Stderr, res.Diagnostics)
	}
	start := time.Now()
	res, _ = runGVisor(t, sp, `while True: pass`, func(r *protocol.Request, _ *policy.Policy) {
		r.Limits.CPUMS, r.Limits.TimeoutMS = 1000, 60000
	})
	if res.Reason != protocol.CPULimit || time.Since(start) > 30*time.Second {
		t.Errorf("busy loop, 1 s of CPU: %s after %v %v", res.Reason, time.Since(start), res.Diagnostics)
	}
	res, _ = runGVisor(t, sp, `import time; time.sleep(60)`, func(r *protocol.Request, _ *policy.Policy) {
		r.Limits.TimeoutMS = 3000
	})
	if res.Reason != protocol.Timeout {
		t.Errorf("sleep past the wall clock: %s %v", res.Reason, res.Diagnostics)
	}

	// Nothing of a run is left: runsc's state and bundles are removed, its
	// processes gone, the root as it was (runsc makes missing mount points in it).
	time.Sleep(500 * time.Millisecond)
	if ents, err := os.ReadDir(gdir); err != nil || len(ents) != 0 {
		t.Errorf("%s holds %v (%v)", gdir, ents, err)
	}
	if out, _ := exec.Command("pgrep", "-f", "--", "--root "+gdir).Output(); len(out) > 0 {
		t.Errorf("runsc processes left: %s", out)
	}
	if rootAfter, err := os.ReadDir(nativeRoot(t)); err != nil || len(rootAfter) != len(rootBefore) {
		t.Errorf("the native root changed: %v, now %v (%v)", rootBefore, rootAfter, err)
	}
}

// TestGVisorRequiredAbsent: where policy requires gVisor and the daemon has no
// runsc, no code runs, and a session is not opened.
func TestGVisorRequiredAbsent(t *testing.T) {
	res, ws := runGVisor(t, sandbox.NewSpawner(), `open("ran", "w")`, nil)
	if res.Reason != protocol.Rejected || !strings.Contains(strings.Join(res.Diagnostics, " "), "runsc") {
		t.Fatalf("%s %v", res.Reason, res.Diagnostics)
	}
	if _, err := os.Stat(filepath.Join(ws, "ran")); err == nil {
		t.Fatal("the program ran")
	}
}

// gvisorLetsThrough are the probes that gVisor lets through, and why: the
// difference from the native backend without gVisor, which docs/security.md states.
var gvisorLetsThrough = map[string]string{
	// The sentry's mmap ignores the mount's noexec (runsc 20221219): the guest can
	// run machine code it wrote, which meets the same filter and the sentry.
	"map a /ws file executable": "the sentry's mmap does not honour noexec",
}

// TestGVisorEscape runs the native escape suite (native_escape_test.go) under
// gVisor, as a policy requiring it runs every native program: no probe escapes,
// the host's listeners see nothing, and the log shows what stopped each.
func TestGVisorEscape(t *testing.T) {
	if warmMode {
		t.Skip("native runs are never served warm: the cold pass of `make test` runs this")
	}
	sp := gvisorSpawner(t)
	wt, check := escapeTargets(t)
	var root unix.Stat_t
	if err := unix.Stat("/", &root); err != nil {
		t.Fatal(err)
	}
	tg := nativeTarget{target: wt, HostRoot: [2]uint64{uint64(root.Dev), root.Ino}}
	tg.HostDir = filepath.Join(tg.HostDir, "all") // where check looks, as for the matrix's "all"
	os.Mkdir(tg.HostDir, 0o755)
	os.WriteFile(filepath.Join(tg.HostDir, "secret"), []byte(secretText), 0o644)
	os.Symlink("secret", filepath.Join(tg.HostDir, "link"))
	arg, _ := json.Marshal(tg)
	res, _ := runGVisor(t, sp, nativeEscapeProgram, func(r *protocol.Request, _ *policy.Policy) {
		r.Args = []string{string(arg)}
		r.Limits.TimeoutMS = 120_000
	})
	wantExit(t, res, 0)
	check()
	var got map[string]string
	if err := json.Unmarshal(res.Stdout, &got); err != nil {
		t.Fatalf("%v: %s\nstderr: %.3000s", err, res.Stdout, res.Stderr)
	}
	delete(got, "(seconds)")
	delete(got, "(isolated)")
	names := nativeProbeNames(t, nativeEscapeProgram)
	var m strings.Builder
	for _, p := range names {
		o := got[p]
		fmt.Fprintf(&m, "%-50s %s\n", p, nativeCell("gvisor", o))
		if why, known := gvisorLetsThrough[p]; o == "" || o == "ESCAPED" && !known {
			t.Errorf("%q under gVisor: %q", p, o)
		} else if o == "ESCAPED" {
			t.Logf("%q is let through by gVisor: %s", p, why)
		}
	}
	t.Logf("under gVisor:\n%s", m.String())
}
