package sandbox_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandcell/sandcell/bundle/bundletest"
	"github.com/sandcell/sandcell/sandbox"
	"github.com/sandcell/sandcell/sandbox/engine"
	"github.com/sandcell/sandcell/sandbox/policy"
	"github.com/sandcell/sandcell/sandbox/protocol"
)

// warmMode runs the whole suite through warm workers (`make test` runs it both
// ways): every run a pool can serve is served by a pool of one worker prepared for
// exactly that request, and the test fails unless it was.
var warmMode = os.Getenv("SANDCELL_TEST_WARM") == "1"

// systemTempDir is the temporary directory this process was started with (TestMain
// replaces it, see privateTempDir).
var systemTempDir = os.TempDir()

// privateTempDir makes the suite's temporary directory (os.TempDir, t.TempDir, and
// so the warm pools' root, tempRoot) a new directory beneath the system's that only
// this user can create anything in (0755: the unprivileged escape suite has its own
// subdirectory, whose ancestors its workspace check opens). No other program's mount
// lies beneath it, as one may beneath the system's (a chroot's /proc, a user's FUSE
// mount), which would leave the pools without their root (see sandbox.CheckRoots).
// It returns what removes it.
func privateTempDir() (func(), error) {
	dir, err := os.MkdirTemp(systemTempDir, "sandcell-sandbox-test-")
	if err == nil {
		err = os.Chmod(dir, 0o755)
	}
	if err == nil {
		err = os.Setenv("TMPDIR", dir)
	}
	if err != nil {
		return nil, err
	}
	return func() { os.RemoveAll(dir) }, nil
}

// tempRoot is the directory the tests' workspaces lie in (t.TempDir's parent).
func tempRoot(t *testing.T) string {
	t.Helper()
	r, err := filepath.EvalSymlinks(os.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// spawnerFor returns the spawner to run req with: a plain one, or in warm mode one
// with a worker ready for req when a pool can serve it. done checks (in warm mode)
// that the run was served warm, and stops the pool.
func spawnerFor(t *testing.T, req protocol.Request, command string) (sp *sandbox.Spawner, done func()) {
	t.Helper()
	sp = sandbox.NewSpawner()
	sp.Command = command
	if !warmMode || !req.Hardening.Namespaces || req.Limits.Fuel > 0 || req.Backend == protocol.BackendNative {
		// No warm worker serves these: a fuelled run's engine differs, and a native
		// run always starts its own worker (the pool holds wasm workers only).
		return sp, func() {}
	}
	waitWarm(t, sp, sandbox.PoolOptions{Template: req, Roots: []string{tempRoot(t)}, Size: 1}, 1)
	return sp, func() {
		t.Helper()
		if st := sp.PoolStats(); st.Hits != 1 {
			t.Errorf("the run was not served warm: %+v", st)
		}
		sp.Warm(sandbox.PoolOptions{})
	}
}

// waitWarm starts sp's pool and waits until n workers are idle.
func waitWarm(t *testing.T, sp *sandbox.Spawner, opts sandbox.PoolOptions, n int) {
	t.Helper()
	if err := sp.Warm(opts); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for sp.PoolStats().Idle < n {
		if time.Now().After(deadline) {
			t.Fatalf("the pool did not fill: %+v", sp.PoolStats())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// defaultRequest is a request with the default policy, limits and interpreter (the
// epochless module for its run, as the daemon's).
func defaultRequest(t *testing.T, code string) protocol.Request {
	limits := policy.Default().Default
	return protocol.Request{Code: code, Workspace: t.TempDir(), Limits: limits, Hardening: policy.Default().Hardening(limits),
		ModulePath: bundletest.Module(t, false), EpochlessModulePath: bundletest.VariantModule(t, engine.Epochless),
		LibDir: bundletest.LibDir(t)}
}

// Nothing crosses runs in a pool: each warm worker serves one run. The first run
// leaves everything it can behind; the second, in another workspace, finds none of
// it. (Run with both ways in one pool, so they differ only in what came before.)
func TestWarmRunsShareNothing(t *testing.T) {
	sp := sandbox.NewSpawner()
	first := defaultRequest(t, `
import builtins, os, sys
builtins.print = lambda *a, **k: sys.stdout.write("patched\n")
LEFT = 1
os.environ["LEFT"] = "1"
open("/ws/left.txt", "w").write("left")
open("/tmp/left.txt", "w").write("left")
sys.stdin.read(1)  # the rest of stdin stays unread
print("first")
`)
	first.Stdin = []byte("xleftover stdin")
	second := defaultRequest(t, `
import builtins, os, sys
assert "LEFT" not in globals(), "a global"
assert "LEFT" not in os.environ, "an environment variable"
assert sys.stdin.read() == "", "leftover stdin"
assert os.listdir("/ws") == [], os.listdir("/ws")
assert sorted(os.listdir("/")) == ["tmp", "ws"], os.listdir("/")
assert os.listdir("/tmp") == [], os.listdir("/tmp")
assert not os.path.exists("/ws/left.txt"), "a file of the other workspace"
builtins.print("clean")
`)
	waitWarm(t, sp, sandbox.PoolOptions{Template: first, Roots: []string{tempRoot(t)}, Size: 2}, 2)
	defer sp.Warm(sandbox.PoolOptions{})
	res, err := sp.Run(context.Background(), first)
	if err != nil {
		t.Fatal(err)
	}
	wantExit(t, res, 0)
	if string(res.Stdout) != "patched\n" {
		t.Fatalf("first: %q", res.Stdout)
	}
	res, err = sp.Run(context.Background(), second)
	if err != nil {
		t.Fatal(err)
	}
	wantExit(t, res, 0)
	if string(res.Stdout) != "clean\n" {
		t.Fatalf("second: %q", res.Stdout)
	}
	if b, _ := os.ReadFile(filepath.Join(first.Workspace, "left.txt")); string(b) != "left" {
		t.Fatalf("the first run's file is not in its workspace: %q", b)
	}
	if st := sp.PoolStats(); st.Hits != 2 {
		t.Fatalf("not served warm: %+v", st)
	}
}

// A run the pool cannot serve (other memory, fuel, a workspace outside its roots)
// runs cold; an empty pool's miss runs cold; the pool refills.
func TestWarmPoolFallsBackAndRefills(t *testing.T) {
	sp := sandbox.NewSpawner()
	tmpl := defaultRequest(t, "")
	waitWarm(t, sp, sandbox.PoolOptions{Template: tmpl, Roots: []string{tempRoot(t)}, Size: 1}, 1)
	defer sp.Warm(sandbox.PoolOptions{})

	other := defaultRequest(t, "print(6*7)")
	other.Limits.MemoryBytes /= 2
	other.Hardening = policy.Default().Hardening(other.Limits)
	outside, err := os.MkdirTemp("/var/tmp", "sandcell-test-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(outside)
	elsewhere := defaultRequest(t, "print(6*7)")
	elsewhere.Workspace = outside
	for _, req := range []protocol.Request{other, elsewhere} {
		res, err := sp.Run(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		wantExit(t, res, 0)
	}
	if st := sp.PoolStats(); st.Hits != 0 || st.Misses != 0 || st.Idle != 1 {
		t.Fatalf("unsuitable runs touched the pool: %+v", st)
	}
	for i := 0; i < 3; i++ { // the second and third may find it empty: misses go cold
		res, err := sp.Run(context.Background(), defaultRequest(t, "print(6*7)"))
		if err != nil {
			t.Fatal(err)
		}
		wantExit(t, res, 0)
		if strings.TrimSpace(string(res.Stdout)) != "42" {
			t.Fatalf("%q", res.Stdout)
		}
	}
	st := sp.PoolStats()
	if st.Hits < 1 || st.Hits+st.Misses != 3 {
		t.Fatalf("%+v", st)
	}
	waitWarm(t, sp, sandbox.PoolOptions{Template: tmpl, Roots: []string{tempRoot(t)}, Size: 1}, 1)
}

// A warm worker's CPU limit counts from its claim, not from its start-up.
func TestWarmCPULimitCountsFromClaim(t *testing.T) {
	req := defaultRequest(t, "while True: pass")
	req.Limits.CPUMS = 300
	req.Limits.TimeoutMS = 20_000
	sp := sandbox.NewSpawner()
	waitWarm(t, sp, sandbox.PoolOptions{Template: req, Roots: []string{tempRoot(t)}, Size: 1}, 1)
	defer sp.Warm(sandbox.PoolOptions{})
	time.Sleep(500 * time.Millisecond) // idle time is no CPU time either
	res, err := sp.Run(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if res.Reason != protocol.CPULimit || sp.PoolStats().Hits != 1 || res.Enforcement == nil || res.Enforcement.Engine != string(engine.Epochless) {
		t.Fatalf("%s %v %+v %+v", res.Reason, res.Diagnostics, sp.PoolStats(), res.Enforcement)
	}
	quick := defaultRequest(t, "print(sum(range(10**5)))")
	quick.Limits.CPUMS = 300
	waitWarm(t, sp, sandbox.PoolOptions{Template: quick, Roots: []string{tempRoot(t)}, Size: 1}, 1)
	res, err = sp.Run(context.Background(), quick)
	if err != nil {
		t.Fatal(err)
	}
	wantExit(t, res, 0)
}

// An idle worker that dies (the OOM killer picks workers first) costs no run: the
// run that takes it runs cold, and the pool replaces it.
func TestWarmDeadIdleWorkerGoesCold(t *testing.T) {
	sp := sandbox.NewSpawner()
	req := defaultRequest(t, "print(6*7)")
	waitWarm(t, sp, sandbox.PoolOptions{Template: req, Roots: []string{tempRoot(t)}, Size: 1}, 1)
	defer sp.Warm(sandbox.PoolOptions{})
	killChildren(t)
	res, err := sp.Run(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	wantExit(t, res, 0) // cold, or warm in a replacement already ready: never a failed run
	waitWarm(t, sp, sandbox.PoolOptions{Template: req, Roots: []string{tempRoot(t)}, Size: 1}, 1)
}

// killChildren kills this process's child processes (the idle workers).
func killChildren(t *testing.T) {
	t.Helper()
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", os.Getpid()))
	n := 0
	for _, task := range tasks {
		b, _ := os.ReadFile(task)
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil && syscall.Kill(pid, syscall.SIGKILL) == nil {
				n++
			}
		}
	}
	if n == 0 {
		t.Fatal("no worker to kill")
	}
	time.Sleep(5 * time.Millisecond)
}

// TestWithoutPidNamespace: where a container's masked /proc refuses a procfs of a new
// pid namespace, a worker, cold or warm, keeps the parent's pid namespace and a
// read-only clone of its /proc; every other layer is active, the guest sees the
// same "/", and the contract says why pidns is not active.
func TestWithoutPidNamespace(t *testing.T) {
	const why = "no pid namespace: masked /proc (test)"
	var require []string
	for _, l := range policy.Default().Require {
		if l != protocol.LayerPidNS {
			require = append(require, l)
		}
	}
	req := protocol.Request{Code: "import os; print(sorted(os.listdir('/')), os.getpid())"}
	limits, err := policy.Default().Resolve(req.Limits)
	if err != nil {
		t.Fatal(err)
	}
	req.Limits = limits
	req.Hardening = policy.Default().Hardening(limits)
	req.Hardening.Require = require
	req.ModulePath = bundletest.Module(t, false)
	req.LibDir = bundletest.LibDir(t)
	check := func(t *testing.T, res protocol.Result) {
		t.Helper()
		wantExit(t, res, 0)
		if !strings.HasPrefix(string(res.Stdout), "['tmp', 'ws'] ") {
			t.Errorf("stdout %q", res.Stdout)
		}
		e := res.Enforcement
		if e == nil || e.Active(protocol.LayerPidNS) || e.Errors[protocol.LayerPidNS] != why {
			t.Fatalf("pidns: %+v", e)
		}
		if missing := e.Missing(require); len(missing) > 0 {
			t.Errorf("layers not active: %v (%v)", missing, e.Errors)
		}
		if !slices.ContainsFunc(e.MountRoot, func(m string) bool { return strings.Contains(m, "/proc (read-only, the parent's") }) {
			t.Errorf("mount root: %v", e.MountRoot)
		}
	}
	for _, warm := range []bool{false, true} {
		t.Run(map[bool]string{false: "cold", true: "warm"}[warm], func(t *testing.T) {
			sp := sandbox.NewSpawner()
			sandbox.WithoutPidNamespace(sp, why)
			r := req
			r.Workspace = t.TempDir()
			if warm {
				waitWarm(t, sp, sandbox.PoolOptions{Template: r, Roots: []string{tempRoot(t)}, Size: 1}, 1)
				defer sp.Warm(sandbox.PoolOptions{})
			}
			res, err := sp.Run(context.Background(), r)
			if err != nil {
				t.Fatal(err)
			}
			check(t, res)
			if st := sp.PoolStats(); warm && st.Hits != 1 {
				t.Errorf("not served warm: %+v", st)
			}
		})
	}
}

// A run's monotonic clock starts near 0 however long its worker waited in the pool
// (a clock that counted from the worker's start would tell a run when the pool was
// last refilled, by whose run), and it starts near 0 in a cold worker too. The
// times of the guest's "/" say the same: the run's start, not the pool's refill
// (its ctime, which WASI takes from the birth time, is 0: not recorded).
func TestWarmClockStartsAtTheRun(t *testing.T) {
	const code = "import time; print(time.monotonic(), time.perf_counter(), time.monotonic_ns() // 10**6, time.clock_gettime(time.CLOCK_MONOTONIC), time.time())\n" +
		"t = time.monotonic(); time.sleep(0.5); print(time.monotonic() - t)\n" +
		"import os; s = os.stat('/'); print(time.time() - s.st_atime, time.time() - s.st_mtime, s.st_ctime and time.time() - s.st_ctime)"
	check := func(name string, res protocol.Result) {
		t.Helper()
		wantExit(t, res, 0)
		f := strings.Fields(string(res.Stdout))
		if len(f) != 9 {
			t.Fatalf("%s: %q", name, res.Stdout)
		}
		for i, v := range f[:4] {
			x, err := strconv.ParseFloat(v, 64)
			if i == 2 {
				x /= 1000
			}
			if err != nil || x < 0 || x > 1.5 {
				t.Errorf("%s: clock %d reads %s s at the start of the run", name, i, v)
			}
		}
		if wall, err := strconv.ParseFloat(f[4], 64); err != nil || wall < float64(time.Now().Add(-time.Minute).Unix()) {
			t.Errorf("%s: time.time() is %s", name, f[4])
		}
		// time.sleep sleeps (its deadline is absolute on the guest's clock).
		if slept, err := strconv.ParseFloat(f[5], 64); err != nil || slept < 0.5 || res.ElapsedMS < 500 {
			t.Errorf("%s: time.sleep(0.5) slept %s s by the guest's clock, the run took %.0f ms", name, f[5], res.ElapsedMS)
		}
		for i, v := range f[6:] {
			if age, err := strconv.ParseFloat(v, 64); err != nil || age < -1 || age > 2 {
				t.Errorf("%s: the guest's / has a time %d (atime, mtime, ctime or 0) %s s before the run's end", name, i, v)
			}
		}
	}
	sp := sandbox.NewSpawner()
	req := defaultRequest(t, code)
	waitWarm(t, sp, sandbox.PoolOptions{Template: req, Roots: []string{tempRoot(t)}, Size: 1}, 1)
	defer sp.Warm(sandbox.PoolOptions{})
	time.Sleep(3 * time.Second)
	res, err := sp.Run(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if st := sp.PoolStats(); st.Hits != 1 {
		t.Fatalf("not served warm: %+v", st)
	}
	check("warm", res)
	cold := sandbox.NewSpawner()
	res, err = cold.Run(context.Background(), defaultRequest(t, code))
	if err != nil {
		t.Fatal(err)
	}
	check("cold", res)
}

// foreignMount mounts a new file system of type fstype at dir/name, made for it,
// and unmounts it when the test ends.
func foreignMount(t *testing.T, dir, name, fstype string) string {
	t.Helper()
	target := filepath.Join(dir, name)
	if err := os.Mkdir(target, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount(fstype, target, fstype, syscall.MS_NOSUID|syscall.MS_NODEV|syscall.MS_NOEXEC, ""); err != nil {
		t.Fatalf("mount %s at %s: %v", fstype, target, err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(target, syscall.MNT_DETACH); err != nil && err != syscall.EINVAL {
			t.Errorf("unmount %s: %v", target, err)
		}
	})
	return target
}

// fill starts sp's pool and waits until it has a worker ready; it fails at the
// pool's first failure to prepare one.
func fill(t *testing.T, sp *sandbox.Spawner, opts sandbox.PoolOptions) {
	t.Helper()
	if err := sp.Warm(opts); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(60 * time.Second); sp.PoolStats().Idle < 1; time.Sleep(5 * time.Millisecond) {
		if st := sp.PoolStats(); st.Failures > 0 || time.Now().After(deadline) {
			t.Fatalf("no warm worker: %+v", st)
		}
	}
}

// Another program's mounts do not turn warm runs cold. As in the report that found
// it, a chroot under the system's /tmp with /proc and /dev mounted: the suite's pools,
// whose root is a directory of the suite's own, stay warm. A root that does hold a
// mount (an operator's tmpfs in a workspace directory) cannot be given to a worker (the
// kernel refuses to clone it without the mount, and with it the worker would hold what
// is not the pool's): it is left out and named, its runs start cold, the runs beneath
// the pool's other roots stay warm, and once it is unmounted its runs are warm again.
func TestWarmForeignMounts(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting needs root; CI runs as root")
	}
	chroot, err := os.MkdirTemp(systemTempDir, "sandcell-chroot-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(chroot) })
	foreignMount(t, chroot, "proc", "proc")
	foreignMount(t, chroot, "dev", "tmpfs")
	t.Run("a chroot in /tmp", func(t *testing.T) {
		sp := sandbox.NewSpawner()
		req := defaultRequest(t, "print(6*7)")
		fill(t, sp, sandbox.PoolOptions{Template: req, Roots: []string{tempRoot(t)}, Size: 1})
		defer sp.Warm(sandbox.PoolOptions{})
		res, err := sp.Run(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		wantExit(t, res, 0)
		if st := sp.PoolStats(); st.Hits != 1 || len(st.UnusableRoots) != 0 {
			t.Fatalf("not served warm: %+v", st)
		}
	})

	t.Run("a mount beneath a root", func(t *testing.T) {
		held, clean := t.TempDir(), t.TempDir()
		mnt := foreignMount(t, held, "mnt", "tmpfs")
		sp := sandbox.NewSpawner()
		tmpl := defaultRequest(t, "")
		fill(t, sp, sandbox.PoolOptions{Template: tmpl, Roots: []string{held, clean}, Size: 1})
		defer sp.Warm(sandbox.PoolOptions{})
		st := sp.PoolStats()
		if len(st.UnusableRoots) != 1 || st.UnusableRoots[0].Root != held || !strings.Contains(st.UnusableRoots[0].Why, mnt) {
			t.Fatalf("the root holding %s is not named: %+v", mnt, st)
		}
		t.Logf("%s %s", st.UnusableRoots[0].Root, st.UnusableRoots[0].Why)
		runIn := func(root string) {
			t.Helper()
			ws, err := os.MkdirTemp(root, "ws-")
			if err != nil {
				t.Fatal(err)
			}
			req := defaultRequest(t, "print(6*7)")
			req.Workspace = ws
			res, err := sp.Run(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			wantExit(t, res, 0)
			if string(res.Stdout) != "42\n" {
				t.Fatalf("stdout %q", res.Stdout)
			}
		}
		want := func(hits, misses uint64) {
			t.Helper()
			if st := sp.PoolStats(); st.Hits != hits || st.Misses != misses || st.Failures != 0 {
				t.Fatalf("want %d hits and %d misses: %+v", hits, misses, st)
			}
		}
		refilled := func() {
			t.Helper()
			for deadline := time.Now().Add(60 * time.Second); sp.PoolStats().Idle < 1; time.Sleep(5 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("not refilled: %+v", sp.PoolStats())
				}
			}
		}
		runIn(clean) // warm
		want(1, 0)
		refilled()
		runIn(held) // cold; the worker stays for the other root
		want(1, 1)
		if st := sp.PoolStats(); st.Idle != 1 {
			t.Fatalf("the worker for the other root is gone: %+v", st)
		}
		if err := syscall.Unmount(mnt, 0); err != nil {
			t.Fatal(err)
		}
		time.Sleep(1100 * time.Millisecond) // the roots are looked at again at most once a second
		runIn(held)                         // cold: its worker lacks the root, and makes room for one that holds it
		want(1, 2)
		refilled()
		if st := sp.PoolStats(); len(st.UnusableRoots) != 0 {
			t.Fatalf("still unusable: %+v", st)
		}
		runIn(held) // warm
		want(2, 2)
	})
}
