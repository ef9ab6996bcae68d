package sandbox_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandcell/sandcell/sandbox"
	"github.com/sandcell/sandcell/sandbox/policy"
	"github.com/sandcell/sandcell/sandbox/protocol"
)

// nativeWarmRequest is a native run of code in ws with the default policy.
func nativeWarmRequest(t *testing.T, ws, code string) protocol.Request {
	t.Helper()
	pol := policy.Default()
	limits, err := pol.Resolve(protocol.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	return protocol.Request{Backend: protocol.BackendNative, RootDir: nativeRoot(t), Code: code, Workspace: ws,
		Limits: limits, Hardening: pol.NativeHardening(limits)}
}

// warmNativeSpawner is a spawner that keeps one warm native worker, with the
// daemon's default preimports, until the test ends.
func warmNativeSpawner(t *testing.T) *sandbox.Spawner {
	t.Helper()
	sp := sandbox.NewSpawner()
	if err := sp.WarmNative(sandbox.NativeWarmOptions{Size: 1, Preimport: []string{"numpy", "pandas", "matplotlib.pyplot"}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sp.WarmNative(sandbox.NativeWarmOptions{}) })
	return sp
}

// waitNativeIdle waits until sp holds n idle warm native workers.
func waitNativeIdle(t *testing.T, sp *sandbox.Spawner, n int) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for sp.NativeWarmStats().Idle != n {
		if time.Now().After(deadline) {
			t.Fatalf("no warm native worker: %+v", sp.NativeWarmStats())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A warm native worker: the first native run in a workspace starts cold and leaves
// a worker prepared (the stack imported) for the next one there, which runs in it
// with every layer in force, its own stdin, arguments and CPU limit (counted from
// the claim: the imports are not charged to it), the warning filters its imports
// installed (numpy's), and its workspace's own module where one shadows a module
// the worker imported. The imports' objects are frozen (gc.freeze), the program's
// are not, and its files are flushed at the end even where only a frozen object
// holds one. A run elsewhere, or under another policy, starts cold.
func TestNativeWarm(t *testing.T) {
	t.Parallel()
	sp := warmNativeSpawner(t)
	ws := t.TempDir()
	run := func(req protocol.Request) protocol.Result {
		t.Helper()
		res, err := sp.Run(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	probe := `import sys, os, time
print("pandas" in sys.modules, sys.argv, sys.stdin.read(), os.getcwd())
`
	res := run(nativeWarmRequest(t, ws, probe))
	wantOutput(t, res, "False ['-c']  /ws\n")
	waitNativeIdle(t, sp, 1)

	if err := os.WriteFile(filepath.Join(ws, "json.py"), []byte("MINE = 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	req := nativeWarmRequest(t, ws, probe+`import json, resource
print(getattr(json, "MINE", 0), time.process_time() > 0.2)
soft, hard = resource.getrlimit(resource.RLIMIT_CPU)
print(soft - int(time.process_time()) <= 11, hard == soft + 1)
import pandas as pd, warnings
print(pd.DataFrame({"a": [1, 2]}).sum().iloc[0], any("size changed" in str(f[1]) for f in warnings.filters))
open("warm.txt", "w").write("w")
import matplotlib.pyplot as plt
plt.plot([1, 2])
import gc
print(gc.get_freeze_count() > 10_000)
class Cycle: pass
c = Cycle(); c.me, c.f = c, open("cycle.txt", "w")
c.f.write("flushed at exit")
pd.DataFrame.f = open("hung.txt", "w")
pd.DataFrame.f.write("held by a frozen class")
`)
	req.Args, req.Stdin = []string{"x y"}, []byte("in")
	req.Limits.CPUMS = 10_000
	req.Hardening = policy.Default().NativeHardening(req.Limits)
	res = run(req)
	wantOutput(t, res, "True ['-c', 'x y'] in /ws\n1 True\nTrue True\n3 True\nTrue\n")
	if st := sp.NativeWarmStats(); st.Hits != 1 {
		t.Fatalf("not served warm: %+v", st)
	}
	if b, err := os.ReadFile(filepath.Join(ws, "warm.txt")); err != nil || string(b) != "w" {
		t.Fatalf("warm.txt: %q %v", b, err)
	}
	// The imports' objects are frozen (the collector and the finalization at the
	// end skip them), the program's are not: a file in a cycle of its own is still
	// flushed when the interpreter ends.
	if b, err := os.ReadFile(filepath.Join(ws, "cycle.txt")); err != nil || string(b) != "flushed at exit" {
		t.Fatalf("cycle.txt: %q %v", b, err)
	}
	// A file only a frozen object holds (a class of an import's) is flushed too.
	if b, err := os.ReadFile(filepath.Join(ws, "hung.txt")); err != nil || string(b) != "held by a frozen class" {
		t.Fatalf("hung.txt: %q %v", b, err)
	}
	if len(res.Displays) != 1 || res.Displays[0].Type != "image/png" {
		t.Fatalf("displays %+v %v", res.Displays, res.Diagnostics)
	}
	e := res.Enforcement
	if e == nil || e.Backend != protocol.BackendNative || len(e.Missing(protocol.Layers())) > 0 || e.Rlimits["CPU"] < 10 {
		t.Fatalf("contract %+v", e)
	}

	// The CPU limit is the run's, from its claim.
	waitNativeIdle(t, sp, 1)
	req = nativeWarmRequest(t, ws, "import pandas\nwhile True: pass\n")
	req.Limits.CPUMS = 1000
	req.Hardening = policy.Default().NativeHardening(req.Limits)
	start := time.Now()
	res = run(req)
	if res.Reason != protocol.CPULimit || sp.NativeWarmStats().Hits != 2 {
		t.Fatalf("reason %s %v after %v; %+v", res.Reason, res.Diagnostics, time.Since(start), sp.NativeWarmStats())
	}

	// Another policy (an environment: none is prepared after it either), another
	// directory at the workspace's path or another workspace: cold.
	waitNativeIdle(t, sp, 1)
	req = nativeWarmRequest(t, ws, probe)
	req.Env = map[string]string{"A": "1"}
	wantOutput(t, run(req), "False ['-c']  /ws\n")
	if st := sp.NativeWarmStats(); st.Idle != 0 {
		t.Fatalf("a worker prepared after a run with an environment: %+v", st)
	}
	wantOutput(t, run(nativeWarmRequest(t, ws, probe)), "False ['-c']  /ws\n")
	waitNativeIdle(t, sp, 1)
	if err := os.Rename(ws, ws+".old"); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	wantOutput(t, run(nativeWarmRequest(t, ws, probe+"print(os.listdir())\n")), "False ['-c']  /ws\n[]\n")
	other := nativeWarmRequest(t, t.TempDir(), probe)
	wantOutput(t, run(other), "False ['-c']  /ws\n")
	if st := sp.NativeWarmStats(); st.Hits != 2 || st.Failures != 0 {
		t.Fatalf("%+v", st)
	}
}

// A warm worker reads nothing of its workspace before its run: matplotlib, which it
// imports, evaluates values of a matplotlibrc in its working directory (and a value
// can run code), so the imports are made from "/", and a workspace that has a
// matplotlibrc gets a cold worker, whose matplotlib reads it as a plain python3's
// would.
func TestNativeWarmReadsNoWorkspaceFile(t *testing.T) {
	t.Parallel()
	sp := sandbox.NewSpawner()
	if err := sp.WarmNative(sandbox.NativeWarmOptions{Size: 1, Preimport: []string{"matplotlib.pyplot"}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sp.WarmNative(sandbox.NativeWarmOptions{}) })
	ws := t.TempDir()
	// A value matplotlib's restricted eval lets through, which reaches the real
	// builtins through a generator's frames and writes a file.
	rc := "axes.prop_cycle: [g := (g.gi_frame.f_back.f_back.f_builtins for _ in [1]), b := [*g][0], " +
		"b['exec'](\"open('/ws/EVALUATED', 'w').write('x')\", {'__builtins__': b}), cycler(color=['r'])][-1]\n"
	if err := os.WriteFile(filepath.Join(ws, "matplotlibrc"), []byte(rc), 0o644); err != nil {
		t.Fatal(err)
	}
	res, err := sp.Run(context.Background(), nativeWarmRequest(t, ws, "print(1)"))
	if err != nil {
		t.Fatal(err)
	}
	wantOutput(t, res, "1\n")
	// None is prepared for it: its next run would be served cold.
	time.Sleep(2 * time.Second)
	if st := sp.NativeWarmStats(); st.Idle != 0 || st.Failures != 0 {
		t.Fatalf("a worker prepared for a workspace with a matplotlibrc: %+v", st)
	}
	// One prepared all the same imports nothing of the workspace's.
	sandbox.PrepareDespiteMatplotlibrc(sp)
	res, err = sp.Run(context.Background(), nativeWarmRequest(t, ws, "print(1)"))
	if err != nil {
		t.Fatal(err)
	}
	wantOutput(t, res, "1\n")
	waitNativeIdle(t, sp, 1)
	if _, err := os.Stat(filepath.Join(ws, "EVALUATED")); err == nil {
		t.Fatal("the warm worker's imports evaluated the workspace's matplotlibrc")
	}
	res, err = sp.Run(context.Background(), nativeWarmRequest(t, ws, "import sys; print('matplotlib' in sys.modules)"))
	if err != nil {
		t.Fatal(err)
	}
	wantOutput(t, res, "False\n")
	if st := sp.NativeWarmStats(); st.Hits != 0 {
		t.Fatalf("a workspace with a matplotlibrc was served warm: %+v", st)
	}
	// The cold run's own matplotlib reads it, as python3's would.
	res, err = sp.Run(context.Background(), nativeWarmRequest(t, ws, "import matplotlib, os; print(os.path.exists('EVALUATED'))"))
	if err != nil {
		t.Fatal(err)
	}
	wantOutput(t, res, "True\n")
}

// A native session opened in a workspace that holds a warm worker runs its cells in
// it: the stack already imported, its contract every layer's with the session's CPU
// limit from the claim, state kept across cells, a workspace module that shadows a
// preimported one the cells' own, a cell past its time rolled back, and the
// session stopped between cells as a cold one is. Opening it leaves a worker prepared for the workspace's next session or
// run.
func TestNativeWarmSession(t *testing.T) {
	t.Parallel()
	sp := warmNativeSpawner(t)
	ws := t.TempDir()
	res, err := sp.Run(context.Background(), nativeWarmRequest(t, ws, "print(1)"))
	if err != nil {
		t.Fatal(err)
	}
	wantOutput(t, res, "1\n")
	waitNativeIdle(t, sp, 1)
	if err := os.WriteFile(filepath.Join(ws, "json.py"), []byte("MINE = 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	req := nativeWarmRequest(t, ws, "")
	ss, err := sp.OpenSession(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	defer ss.Close()
	if st := sp.NativeWarmStats(); st.Hits != 1 {
		t.Fatalf("not opened warm: %+v", st)
	}
	e := ss.Enforcement()
	if e.Backend != protocol.BackendNative || len(e.Missing(protocol.Layers())) > 0 ||
		e.Rlimits["CPU"] < uint64(sandbox.SessionCPU/time.Second) {
		t.Fatalf("contract %+v", e)
	}
	lim := protocol.Limits{TimeoutMS: 30_000, CPUMS: 10_000, MaxStdoutBytes: 1 << 20, MaxStderrBytes: 1 << 20}
	cell := func(code, want string) {
		t.Helper()
		c, err := ss.Run(context.Background(), protocol.Request{Limits: lim, Code: code})
		if err != nil || c.Reason != protocol.Exited || c.ExitCode != 0 || string(c.Stdout) != want {
			t.Fatalf("%v %+v %q %s", err, c.Result, c.Stdout, c.Stderr)
		}
	}
	cell(`import sys, os, json
print("pandas" in sys.modules, os.getcwd(), getattr(json, "MINE", 0))
import pandas as pd
df = pd.DataFrame({"a": [1, 2]})`, "True /ws 1\n")
	cell(`print(df["a"].sum())`, "3\n")
	// A cell past its time is rolled back, as in a cold session.
	c, err := ss.Run(context.Background(), protocol.Request{Code: "df = None\nimport time; time.sleep(30)",
		Limits: protocol.Limits{TimeoutMS: 300, MaxStdoutBytes: 1 << 20, MaxStderrBytes: 1 << 20}})
	if err != nil || c.Reason != protocol.Timeout || !c.RolledBack {
		t.Fatalf("a cell past its time: %v %+v", err, c.Result)
	}
	cell(`print(df["a"].sum())`, "3\n")
	if st := sp.NativeWarmStats(); st.Hits != 1 {
		t.Fatalf("%+v", st)
	}
	// Stopped between cells, as a cold session is (SIGSTOP: the state follows).
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", ss.PID()))
		if err == nil && strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))[0] == "T" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the idle session's interpreter is not stopped: %q %v", b, err)
		}
	}
	waitNativeIdle(t, sp, 1) // prepared after the session opened
}
