package sandbox_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/opencontainers/runtime-spec/specs-go"
	"github.com/sandcell/sandcell/bundle"
	"github.com/sandcell/sandcell/bundle/bundletest"
	"github.com/sandcell/sandcell/sandbox"
	"github.com/sandcell/sandcell/sandbox/engine"
	"github.com/sandcell/sandcell/sandbox/policy"
	"github.com/sandcell/sandcell/sandbox/protocol"
	"github.com/sandcell/sandcell/sandbox/worker"
)

// TestMain lets the test binary serve as the worker: Spawner re-executes
// /proc/self/exe with the worker command, exactly as the sandcell binary does.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == protocol.WorkerCommand {
		os.Exit(worker.Main())
	}
	if len(os.Args) > 1 && os.Args[1] == escapeCommand {
		os.Exit(worker.Serve(escapeBody))
	}
	if len(os.Args) > 1 && os.Args[1] == netnsCommand {
		os.Exit(worker.Serve(func(*protocol.Request, *worker.Env) protocol.Report {
			link, _ := os.Readlink("/proc/self/ns/net")
			os.Stdout.WriteString(link)
			return protocol.Report{Reason: protocol.Exited}
		}))
	}
	// Every worker of these tests runs from a sealed memfd copy of this binary, as a
	// daemon's run from its lean worker (sandbox.UseWorkerBinary).
	self, err := os.ReadFile("/proc/self/exe")
	if err == nil {
		err = sandbox.UseWorkerBinary(self)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker binary:", err)
		os.Exit(1)
	}
	remove, err := privateTempDir()
	if err != nil {
		fmt.Fprintln(os.Stderr, "temporary directory:", err)
		os.Exit(1)
	}
	code := m.Run()
	remove()
	os.Exit(code)
}

// run executes code with the default policy, changed by edit, in a fresh workspace.
func run(t *testing.T, code string, edit func(*protocol.Request)) (protocol.Result, string) {
	t.Helper()
	ws := t.TempDir()
	req := protocol.Request{Code: code, Workspace: ws}
	if edit != nil {
		edit(&req)
	}
	limits, err := policy.Default().Resolve(req.Limits)
	if err != nil {
		t.Fatal(err)
	}
	req.Limits = limits
	if req.Hardening.Seccomp == nil && !req.Hardening.Landlock && !req.Hardening.Namespaces {
		// Every test runs with every layer, as a real run does.
		req.Hardening = policy.Default().Hardening(limits)
	}
	if req.ModulePath == "" {
		// As the daemon's runs: the epochless module without fuel (see
		// protocol.Request.RunModule).
		req.ModulePath = bundletest.Module(t, req.Limits.Fuel > 0)
		req.EpochlessModulePath = bundletest.VariantModule(t, engine.Epochless)
	}
	req.LibDir = bundletest.LibDir(t)
	sp, done := spawnerFor(t, req, "")
	res, err := sp.Run(context.Background(), req)
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	done()
	return res, req.Workspace
}

func timeout(d time.Duration) func(*protocol.Request) {
	return func(r *protocol.Request) { r.Limits.TimeoutMS = d.Milliseconds() }
}

func wantExit(t *testing.T, res protocol.Result, code int) {
	t.Helper()
	if res.Reason != protocol.Exited || res.ExitCode != code {
		t.Fatalf("got reason %s exit %d, want exited %d\nstdout: %.2000s\nstderr: %.2000s\ndiagnostics: %v",
			res.Reason, res.ExitCode, code, res.Stdout, res.Stderr, res.Diagnostics)
	}
}

func TestPrint(t *testing.T) {
	t.Parallel()
	res, _ := run(t, "print(6*7)", nil)
	wantExit(t, res, 0)
	if string(res.Stdout) != "42\n" || len(res.Stderr) != 0 {
		t.Fatalf("stdout %q stderr %q", res.Stdout, res.Stderr)
	}
	if res.PeakMemoryBytes <= 0 || res.WorkerMaxRSSBytes <= 0 || res.ElapsedMS <= 0 {
		t.Fatalf("missing measurements: %+v", res)
	}
}

func TestExitStatus(t *testing.T) {
	t.Parallel()
	res, _ := run(t, "raise SystemExit(3)", nil)
	wantExit(t, res, 3)
}

func TestExceptionTraceback(t *testing.T) {
	t.Parallel()
	res, _ := run(t, "def f():\n    raise ValueError('boom')\nf()", nil)
	wantExit(t, res, 1)
	// As `python -c` since 3.13: source lines shown, the bootstrap's frame not.
	want := "Traceback (most recent call last):\n  File \"<string>\", line 3, in <module>\n    f()\n    ~^^\n" +
		"  File \"<string>\", line 2, in f\n    raise ValueError('boom')\nValueError: boom\n"
	if string(res.Stderr) != want {
		t.Fatalf("stderr:\n%s\nwant:\n%s", res.Stderr, want)
	}
}

func TestSyntaxError(t *testing.T) {
	t.Parallel()
	res, _ := run(t, "x y", nil)
	wantExit(t, res, 1)
	if !strings.Contains(string(res.Stderr), "SyntaxError") || strings.Contains(string(res.Stderr), "_sandcell") {
		t.Fatalf("stderr: %s", res.Stderr)
	}
}

func TestStdinAndArgs(t *testing.T) {
	t.Parallel()
	res, _ := run(t, "import sys; sys.stdout.write(sys.stdin.read()); print(sys.argv)", func(r *protocol.Request) {
		r.Stdin = []byte("line one\nzwei ü\n")
		r.Args = []string{"a", "b c"}
	})
	wantExit(t, res, 0)
	if string(res.Stdout) != "line one\nzwei ü\n['-c', 'a', 'b c']\n" {
		t.Fatalf("stdout %q", res.Stdout)
	}
}

// Reading past the end of a given stdin keeps returning end of file.
func TestStdinPastEOF(t *testing.T) {
	t.Parallel()
	res, _ := run(t, "import os\nfor _ in range(4): print(os.read(0, 3))\ninput()", func(r *protocol.Request) {
		r.Stdin = []byte("data\n")
	})
	wantExit(t, res, 1)
	if string(res.Stdout) != "b'dat'\nb'a\\n'\nb''\nb''\n" || !strings.Contains(string(res.Stderr), "EOFError") {
		t.Fatalf("stdout %q stderr %q", res.Stdout, res.Stderr)
	}
}

func TestExitStatusIsReducedModulo256(t *testing.T) {
	t.Parallel()
	for code, want := range map[string]int{"raise SystemExit(256)": 0, "raise SystemExit(257)": 1,
		"raise SystemExit(None)": 0, "raise SystemExit('message')": 1, "": 0, "exit(4)": 4, "quit()": 0,
		"raise SystemExit(2**32+3)": 3} {
		res, _ := run(t, code, nil)
		wantExit(t, res, want)
	}
	// 126-255 too (the snapshot returns the status; WASI's proc_exit could not carry
	// them). Beyond a C long the status is 255, as native CPython's, never 0.
	for code, want := range map[string]int{"import sys; sys.exit(-1)": 255, "import sys; sys.exit(2**70)": 255,
		"raise SystemExit(200)": 200} {
		res, _ := run(t, code, nil)
		wantExit(t, res, want)
	}
}

func TestEmptyStdinDoesNotBlock(t *testing.T) {
	t.Parallel()
	res, _ := run(t, "import sys\nprint(repr(sys.stdin.read()))\ninput()", timeout(5*time.Second))
	wantExit(t, res, 1)
	if string(res.Stdout) != "''\n" || !strings.Contains(string(res.Stderr), "EOFError") {
		t.Fatalf("stdout %q stderr %q", res.Stdout, res.Stderr)
	}
}

func TestWorkspaceIsWorkingDirectory(t *testing.T) {
	t.Parallel()
	code := `import os
print(os.getcwd())
open("out.txt", "w").write("written inside")
os.makedirs("sub/dir")
open("/ws/sub/dir/f", "w").write("x")
print(sorted(os.listdir(".")))`
	res, ws := run(t, code, nil)
	wantExit(t, res, 0)
	if string(res.Stdout) != "/ws\n['out.txt', 'sub']\n" {
		t.Fatalf("stdout %q", res.Stdout)
	}
	got, err := os.ReadFile(filepath.Join(ws, "out.txt"))
	if err != nil || string(got) != "written inside" {
		t.Fatalf("host file: %q %v", got, err)
	}
	if _, err := os.Stat(filepath.Join(ws, "sub", "dir", "f")); err != nil {
		t.Fatal(err)
	}
}

func TestWorkspaceScript(t *testing.T) {
	t.Parallel()
	res, _ := run(t, "", func(r *protocol.Request) {
		r.Code = ""
		r.Path = "tools/hello.py"
		r.Args = []string{"x"}
		os.MkdirAll(filepath.Join(r.Workspace, "tools"), 0o755)
		os.WriteFile(filepath.Join(r.Workspace, "tools", "helper.py"), []byte("NAME = 'helper'\n"), 0o644)
		os.WriteFile(filepath.Join(r.Workspace, "tools", "hello.py"), []byte(
			"import sys, helper\nprint(__file__, sys.argv, helper.NAME, __name__)\n"), 0o644)
	})
	wantExit(t, res, 0)
	if string(res.Stdout) != "/ws/tools/hello.py ['/ws/tools/hello.py', 'x'] helper __main__\n" {
		t.Fatalf("stdout %q stderr %q", res.Stdout, res.Stderr)
	}
}

// A guest's `-c` program imports from its working directory, as `python -c` does; an
// isolated one (the daemon's own) imports only from the standard library, whatever
// the workspace holds.
func TestIsolatedProgramImportsNothingFromTheWorkspace(t *testing.T) {
	t.Parallel()
	// urllib is a package of the standard library that is not frozen into the
	// interpreter, so a directory of that name in /ws would shadow it.
	code := "import sys, urllib, helper\nprint(urllib.__file__, helper.NAME, sys.argv, [p for p in sys.path if not p.startswith('/usr/local/lib/')])"
	plant := func(r *protocol.Request) {
		os.WriteFile(filepath.Join(r.Workspace, "helper.py"), []byte("NAME = 'planted'\n"), 0o644)
		os.Mkdir(filepath.Join(r.Workspace, "urllib"), 0o755)
		os.WriteFile(filepath.Join(r.Workspace, "urllib", "__init__.py"), []byte(""), 0o644)
	}
	res, _ := run(t, code, plant)
	wantExit(t, res, 0)
	if string(res.Stdout) != "/ws/urllib/__init__.py planted ['-c'] ['']\n" {
		t.Fatalf("guest program: stdout %q stderr %q", res.Stdout, res.Stderr)
	}
	res, _ = run(t, code, func(r *protocol.Request) { plant(r); r.Isolated, r.Filename = true, "<daemon>" })
	if res.Reason != protocol.Exited || res.ExitCode != 1 || !strings.Contains(string(res.Stderr), "No module named 'helper'") {
		t.Fatalf("isolated program imported from the workspace: %s %d stdout %q stderr %q", res.Reason, res.ExitCode, res.Stdout, res.Stderr)
	}
	res, _ = run(t, "import sys, urllib.parse; print(urllib.__file__, sys.argv, sys.path)", func(r *protocol.Request) { plant(r); r.Isolated = true })
	wantExit(t, res, 0)
	if out := string(res.Stdout); !strings.HasPrefix(out, "/usr/local/lib/") || strings.Contains(out, "'/ws") || strings.Contains(out, "''") {
		t.Fatalf("isolated program: stdout %q", res.Stdout)
	}
}

// The read-only library stays unchanged whatever the guest tries through WASI,
// including the ways wasmtime 44.0.0's own permission checks miss (GHSA-2r75-cxrj-cmph:
// path_open with only TRUNCATE; GHSA-4ch3-9j33-3pmj: a hard link or rename from a
// read-only preopen into a writable one): the worker's read-only mount of the
// library and Landlock refuse them (see docs/advisories.md).
func TestLibraryCannotBeChanged(t *testing.T) {
	t.Parallel()
	zip := filepath.Join(bundletest.LibDir(t), "python313.zip")
	before, err := os.ReadFile(zip)
	if err != nil {
		t.Fatal(err)
	}
	code := `import os
lib = "/usr/local/lib/python313.zip"
for name, f in [
    ("truncate", lambda: os.close(os.open(lib, os.O_RDONLY | os.O_TRUNC))),
    ("write", lambda: os.close(os.open(lib, os.O_WRONLY))),
    ("link", lambda: os.link(lib, "/ws/linked")),
    ("rename", lambda: os.rename(lib, "/ws/renamed")),
    ("remove", lambda: os.remove(lib)),
    ("utime", lambda: os.utime(lib, (0, 0))),
]:
    try:
        f()
        print(name, "done")
    except OSError as e:
        print(name, "refused")
for p in ("/ws/linked", "/ws/renamed"):
    if os.path.exists(p):
        with open(p, "r+b") as f:
            f.write(b"changed")
        print(p, "written")
print(os.path.getsize(lib))
`
	res, _ := run(t, code, nil)
	wantExit(t, res, 0)
	want := fmt.Sprintf("truncate refused\nwrite refused\nlink refused\nrename refused\nremove refused\nutime refused\n%d\n", len(before))
	if string(res.Stdout) != want {
		t.Errorf("stdout %q, want %q (stderr %q)", res.Stdout, want, res.Stderr)
	}
	after, err := os.ReadFile(zip)
	if err != nil || !bytes.Equal(before, after) {
		t.Fatalf("the library changed: %v", err)
	}
}

// hostCopyMargin is how far a worker's RSS may exceed its guest's memory limit: the
// engine and module (about 32 MiB) and the one host buffer wasmtime 44 copies a WASI
// read or write through (at most 128 MiB; a larger single call fails with ENOMEM).
const hostCopyMargin = 176 << 20

// One huge write or read cannot make the host copy a guest-sized buffer beyond the
// margin (with wasmtime 39, one 230 MiB os.write made a worker of 491 MiB RSS against
// a 256 MiB limit).
func TestHostCopyBounded(t *testing.T) {
	t.Parallel()
	code := `import os
b = bytearray(230 << 20)
fd = os.open("/ws/f", os.O_RDWR | os.O_CREAT)
for name, f in [("write", lambda: os.write(fd, b)), ("append", lambda: os.write(os.open("/ws/g", os.O_WRONLY | os.O_CREAT | os.O_APPEND), b)),
                ("stdout", lambda: os.write(1, b)), ("part", lambda: os.write(fd, memoryview(b)[:100 << 20]))]:
    try:
        print(name, f() >> 20)
    except OSError as e:
        print(name, e.errno)
del b
try:
    print("read", len(os.pread(fd, 230 << 20, 0)) >> 20)
except OSError as e:
    print("read", e.errno)
`
	res, _ := run(t, code, func(r *protocol.Request) { r.Limits.MemoryBytes = 256 << 20 })
	wantExit(t, res, 0)
	t.Logf("worker RSS %d MiB, guest memory %d MiB: %q", res.WorkerMaxRSSBytes>>20, res.PeakMemoryBytes>>20, res.Stdout)
	if !strings.Contains(string(res.Stdout), "part 100\n") {
		t.Errorf("a 100 MiB write: %q %q", res.Stdout, res.Stderr)
	}
	if res.WorkerMaxRSSBytes > 256<<20+hostCopyMargin {
		t.Fatalf("worker RSS %d MiB, over the 256 MiB limit plus %d MiB", res.WorkerMaxRSSBytes>>20, hostCopyMargin>>20)
	}
}

// Everything outside /ws is out of reach, however it is named, and error messages
// never show the host path of the workspace.
func TestNoHostFilesystem(t *testing.T) {
	t.Parallel()
	code := `import os
for p in ["/etc/passwd", "/ws/../etc/passwd", "../etc/passwd", "/proc/self/environ", "/", "/tmp"]:
    try:
        open(p).read()
        print("READ", p)
    except OSError as e:
        print("denied", type(e).__name__)
try:
    os.symlink("/etc/passwd", "link")
    print("READ", open("link").read()[:10])
except OSError as e:
    print("denied", type(e).__name__)
try:
    os.symlink("../../../../etc", "up")
    print("LIST", os.listdir("up"))
except OSError as e:
    print("denied", type(e).__name__)
`
	res, ws := run(t, code, nil)
	wantExit(t, res, 0)
	out := string(res.Stdout)
	if strings.Contains(out, "READ") || strings.Contains(out, "LIST") || strings.Count(out, "denied") != 8 {
		t.Fatalf("stdout:\n%s\nstderr:\n%s", out, res.Stderr)
	}
	if strings.Contains(out+string(res.Stderr), ws) {
		t.Fatalf("host path %s leaked", ws)
	}
}

func TestNoHostEnvironment(t *testing.T) {
	t.Setenv("SANDCELL_SECRET", "hunter2")
	res, _ := run(t, "import os; print(dict(os.environ))", nil)
	wantExit(t, res, 0)
	if string(res.Stdout) != "{}\n" {
		t.Fatalf("guest environment: %s", res.Stdout)
	}
	res, _ = run(t, "import os; print(dict(os.environ))", func(r *protocol.Request) {
		r.Env = map[string]string{"LANG": "C.UTF-8"}
	})
	if string(res.Stdout) != "{'LANG': 'C.UTF-8'}\n" {
		t.Fatalf("guest environment: %s", res.Stdout)
	}
}

// What WASI lacks fails as a clean Python exception, never as a hang or a crash.
func TestMissingCapabilitiesFailCleanly(t *testing.T) {
	t.Parallel()
	cases := map[string]string{
		"socket":     "import socket; socket.socket().connect(('127.0.0.1', 22))",
		"dns":        "import socket; socket.getaddrinfo('localhost', 80)",
		"urllib":     "import urllib.request; urllib.request.urlopen('http://127.0.0.1:1/')",
		"subprocess": "import subprocess; subprocess.run(['ls'])",
		"system":     "import os; os.system('ls')",
		"thread":     "import threading; threading.Thread(target=print).start()",
		"signal":     "import os, signal; os.kill(os.getpid(), signal.SIGKILL)",
	}
	for name, code := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			res, _ := run(t, code, timeout(10*time.Second))
			if res.Reason != protocol.Exited || res.ExitCode != 1 || !strings.Contains(string(res.Stderr), "Error") {
				t.Fatalf("reason %s exit %d stderr %s", res.Reason, res.ExitCode, res.Stderr)
			}
		})
	}
}

func TestMemoryLimit(t *testing.T) {
	t.Parallel()
	for name, code := range map[string]string{
		"one big":    "bytearray(2**30)",
		"appends":    "b = bytearray()\nwhile True:\n    b += b'x' * 1_000_000",
		"list":       "l = []\nwhile True:\n    l.append('x' * 10_000)",
		"big string": "s = 'x' * (100 * 2**20)",
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			res, _ := run(t, code, func(r *protocol.Request) {
				r.Limits.MemoryBytes = 64 * policy.MiB
				r.Limits.TimeoutMS = 60_000
			})
			memErr := res.Reason == protocol.MemoryLimit && res.ExitCode == 1 && strings.Contains(string(res.Stderr), "MemoryError") &&
				len(res.Diagnostics) > 0 && strings.Contains(res.Diagnostics[len(res.Diagnostics)-1], "ran out of memory")
			if !memErr {
				t.Fatalf("reason %s exit %d stderr %.500s", res.Reason, res.ExitCode, res.Stderr)
			}
			if res.PeakMemoryBytes > 64*policy.MiB {
				t.Fatalf("guest memory %d above the limit", res.PeakMemoryBytes)
			}
			// The worker's resident set stays near the cap: the engine's own ~100 MB
			// (mapped module, runtime) plus at most the guest's 64 MiB.
			if res.WorkerMaxRSSBytes > 64*policy.MiB+160*policy.MiB {
				t.Fatalf("worker RSS %d MiB", res.WorkerMaxRSSBytes>>20)
			}
		})
	}
}

// Blocking host calls and busy loops are both ended by the parent's wall clock.
func TestWallClock(t *testing.T) {
	t.Parallel()
	for name, code := range map[string]string{
		"busy":   "while True: pass",
		"sleep":  "import time; time.sleep(3600)",
		"regex":  "import re; re.match(r'(a+)+$', 'a' * 64 + '!')",
		"bigint": "import sys; sys.set_int_max_str_digits(0); print(str(7 ** 10_000_000))",
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			start := time.Now()
			res, _ := run(t, code, timeout(time.Second))
			if res.Reason != protocol.Timeout {
				t.Fatalf("reason %s exit %d stderr %.500s", res.Reason, res.ExitCode, res.Stderr)
			}
			// Ended by the limit, not by the program (an hour, a hang): the bound is
			// loose because a loaded machine is slow to start a worker.
			if d := time.Since(start); d > 6*time.Second {
				t.Fatalf("took %v for a 1s limit", d)
			}
		})
	}
}

func TestCPULimit(t *testing.T) {
	t.Parallel()
	res, _ := run(t, "while True: pass", func(r *protocol.Request) {
		r.Limits.CPUMS = 300
		r.Limits.TimeoutMS = 20_000
	})
	if res.Reason != protocol.CPULimit {
		t.Fatalf("reason %s exit %d stderr %s", res.Reason, res.ExitCode, res.Stderr)
	}
	if res.ElapsedMS > 10_000 {
		t.Fatalf("cpu limit took %vms", res.ElapsedMS)
	}
	// The run's CPU limit ended the epochless engine's worker, the report sent first.
	if res.Enforcement == nil || res.Enforcement.Engine != string(engine.Epochless) {
		t.Fatalf("contract %+v: want the epochless engine", res.Enforcement)
	}
	// Without the epochless module (a daemon of before), the plain engine's epoch
	// deadline stops the run.
	res, _ = run(t, "while True: pass", func(r *protocol.Request) {
		r.Limits.CPUMS = 300
		r.Limits.TimeoutMS = 20_000
		r.ModulePath = bundletest.Module(t, false)
	})
	if res.Reason != protocol.CPULimit || res.Enforcement == nil || res.Enforcement.Engine != string(engine.Plain) {
		t.Fatalf("reason %s contract %+v", res.Reason, res.Enforcement)
	}
}

func TestFuel(t *testing.T) {
	t.Parallel()
	res, _ := run(t, "print(sum(range(1000)))", func(r *protocol.Request) { r.Limits.Fuel = 10_000_000_000 })
	wantExit(t, res, 0)
	if string(res.Stdout) != "499500\n" || res.FuelConsumed == 0 {
		t.Fatalf("stdout %q fuel %d", res.Stdout, res.FuelConsumed)
	}
	res, _ = run(t, "while True: pass", func(r *protocol.Request) { r.Limits.Fuel = 200_000_000 })
	if res.Reason != protocol.CPULimit || res.FuelConsumed < 200_000_000 {
		t.Fatalf("reason %s fuel %d stderr %s", res.Reason, res.FuelConsumed, res.Stderr)
	}
	if res.Enforcement == nil || res.Enforcement.Engine != string(engine.Fuel) {
		t.Fatalf("contract %+v: want the fuel-metered engine", res.Enforcement)
	}
}

// An output flood is cut at the cap exactly, flagged, and the parent reads no more
// than the cap: its allocations stay far below the 50 MB the guest tried to print.
func TestOutputFlood(t *testing.T) {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	res, _ := run(t, "import sys\nfor _ in range(50):\n    sys.stdout.write('x' * 1_000_000)", func(r *protocol.Request) {
		r.Limits.MaxStdoutBytes = 100_000
	})
	runtime.ReadMemStats(&after)
	if res.Reason != protocol.OutputLimit || !res.StdoutTruncated || res.StderrTruncated {
		t.Fatalf("reason %s truncated %v/%v", res.Reason, res.StdoutTruncated, res.StderrTruncated)
	}
	if len(res.Stdout) != 100_000 || strings.Trim(string(res.Stdout), "x") != "" {
		t.Fatalf("kept %d bytes", len(res.Stdout))
	}
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 8<<20 {
		t.Fatalf("parent allocated %d MiB while reading a capped stream", grew>>20)
	}
	res, _ = run(t, "import sys\nsys.stderr.write('e' * 3_000_000)", nil)
	if res.Reason != protocol.OutputLimit || !res.StderrTruncated || len(res.Stderr) != policy.MiB {
		t.Fatalf("stderr: reason %s truncated %v len %d", res.Reason, res.StderrTruncated, len(res.Stderr))
	}
}

func TestOutputUnderCapIsComplete(t *testing.T) {
	t.Parallel()
	res, _ := run(t, "import sys; sys.stdout.write('y' * 1_048_576)", nil)
	wantExit(t, res, 0)
	if len(res.Stdout) != policy.MiB || res.StdoutTruncated {
		t.Fatalf("len %d truncated %v", len(res.Stdout), res.StdoutTruncated)
	}
}

// Runaway recursion ends as a Python error or a trap, never as a crash of the parent.
func TestRecursion(t *testing.T) {
	t.Parallel()
	for name, code := range map[string]string{
		"plain":        "def f(n): return f(n + 1)\nf(0)",
		"unlimited":    "import sys; sys.setrecursionlimit(10**9)\ndef f(n): return f(n + 1)\nf(0)",
		"json":         "import json\nl = []\nfor _ in range(200_000): l = [l]\njson.dumps(l)",
		"json limit":   "import json, sys; sys.setrecursionlimit(10**9)\nl = []\nfor _ in range(200_000): l = [l]\njson.dumps(l)",
		"repr":         "import sys; sys.setrecursionlimit(10**9)\nl = []\nfor _ in range(1_000_000): l = [l]\nrepr(l)",
		"deep parsing": "eval('[' * 100_000 + ']' * 100_000)",
		"repr self":    "class A:\n    def __repr__(self): return repr(self)\nrepr(A())",
		"pickle":       "import pickle\nl = []\nfor _ in range(100_000): l = [l]\npickle.dumps(l)",
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			res, _ := run(t, code, timeout(10*time.Second))
			pyErr := (res.Reason == protocol.Exited || res.Reason == protocol.MemoryLimit) && res.ExitCode == 1 &&
				bytes.Contains(res.Stderr, []byte("Error"))
			// With the recursion limit lifted, Python frames (on the heap since 3.11)
			// fill the guest's memory (memory_limit); how CPython then fails depends on where the
			// heap ends: an error at once, or seconds of walking millions of frames
			// for the traceback, which the wall clock ends. All are contained.
			if !pyErr && res.Reason != protocol.Trap && res.Reason != protocol.Timeout {
				t.Fatalf("reason %s exit %d diagnostics %v stderr %.300s", res.Reason, res.ExitCode, res.Diagnostics, res.Stderr)
			}
		})
	}
	res, _ := run(t, "print('still fine')", nil)
	wantExit(t, res, 0)
}

func TestBinaryAndUnicodeOutput(t *testing.T) {
	t.Parallel()
	res, _ := run(t, `import sys
sys.stdout.buffer.write(b"a\x00b\xff\xfe\n")
print("héllo wörld ✓ 日本 🐍")`, nil)
	wantExit(t, res, 0)
	want := "a\x00b\xff\xfe\nhéllo wörld ✓ 日本 🐍\n"
	if string(res.Stdout) != want {
		t.Fatalf("stdout %q, want %q", res.Stdout, want)
	}
}

func TestOddSource(t *testing.T) {
	t.Parallel()
	ws := t.TempDir()
	_, err := sandbox.NewSpawner().Run(context.Background(), protocol.Request{
		Code: "print(1)\x00", Workspace: ws, ModulePath: bundletest.Module(t, false), LibDir: bundletest.LibDir(t), Limits: policy.Default().Default})
	if !errors.Is(err, sandbox.ErrBadRequest) {
		t.Fatalf("NUL in code: %v", err)
	}
	_, err = sandbox.NewSpawner().Run(context.Background(), protocol.Request{
		Code: "print('\xff\xfe')", Workspace: ws, ModulePath: bundletest.Module(t, false), LibDir: bundletest.LibDir(t), Limits: policy.Default().Default})
	if !errors.Is(err, sandbox.ErrBadRequest) {
		t.Fatalf("invalid UTF-8: %v", err)
	}
	res, _ := run(t, `print(len('\ud800'), '\ufeff')`, nil)
	wantExit(t, res, 0)
	long := "x = '" + strings.Repeat("a", 1<<20) + "'\nprint(len(x))"
	res, _ = run(t, long, nil)
	wantExit(t, res, 0)
	if string(res.Stdout) != "1048576\n" {
		t.Fatalf("1 MB line: %q", res.Stdout)
	}
}

// A request too large for one frame is refused before a worker starts, not left to
// time out.
func TestOversizedRequest(t *testing.T) {
	t.Parallel()
	start := time.Now()
	_, err := sandbox.NewSpawner().Run(context.Background(), protocol.Request{
		Code: "x = '" + strings.Repeat("<", 3<<20) + "'", Stdin: make([]byte, 8<<20),
		Workspace: t.TempDir(), ModulePath: bundletest.Module(t, false), LibDir: bundletest.LibDir(t), Limits: policy.Default().Default})
	if !errors.Is(err, sandbox.ErrBadRequest) || time.Since(start) > 10*time.Second {
		t.Fatalf("%v after %v", err, time.Since(start))
	}
}

// No workspace may contain the interpreter's compiled code, or lie inside its
// directory: a guest could otherwise replace what later runs execute natively.
func TestWorkspaceMustNotOverlapTheBundle(t *testing.T) {
	t.Parallel()
	mod := bundletest.Module(t, false)
	bundleDir := filepath.Dir(mod)
	cache := t.TempDir()
	sp := sandbox.NewSpawner()
	sp.Protected = []string{cache}
	for _, ws := range []string{bundleDir, filepath.Dir(bundleDir), "/", cache, filepath.Join(cache)} {
		_, err := sp.Run(context.Background(), protocol.Request{Code: "1", Workspace: ws, ModulePath: mod, LibDir: bundletest.LibDir(t), Limits: policy.Default().Default})
		if !errors.Is(err, sandbox.ErrBadRequest) || !strings.Contains(err.Error(), "overlaps") {
			t.Errorf("workspace %s: %v", ws, err)
		}
	}
	// A protected directory given relative, or not yet created, is still protected.
	wd, _ := os.Getwd()
	parent := t.TempDir()
	existing := filepath.Join(parent, "cache")
	os.Mkdir(existing, 0o755)
	rel, _ := filepath.Rel(wd, existing)
	for _, prot := range []string{rel, filepath.Join(parent, "new", "sandcell")} {
		sp := sandbox.NewSpawner()
		sp.Protected = []string{prot}
		_, err := sp.Run(context.Background(), protocol.Request{Code: "1", Workspace: parent, ModulePath: mod, LibDir: bundletest.LibDir(t), Limits: policy.Default().Default})
		if !errors.Is(err, sandbox.ErrBadRequest) {
			t.Errorf("protected %s, workspace %s: %v", prot, parent, err)
		}
	}
	inside := filepath.Join(cache, "ws")
	os.Mkdir(inside, 0o755)
	link := filepath.Join(t.TempDir(), "link")
	os.Symlink(bundleDir, link)
	for _, ws := range []string{inside, link} {
		if _, err := sp.Run(context.Background(), protocol.Request{Code: "1", Workspace: ws, ModulePath: mod, LibDir: bundletest.LibDir(t), Limits: policy.Default().Default}); !errors.Is(err, sandbox.ErrBadRequest) {
			t.Errorf("workspace %s: %v", ws, err)
		}
	}
}

// No workspace may hold a private directory (a daemon's state), by its path or
// through a link, or be it; one inside it (the daemon's own workspaces) runs.
func TestWorkspaceMustNotHoldAPrivateDirectory(t *testing.T) {
	t.Parallel()
	mod := bundletest.Module(t, false)
	parent := t.TempDir()
	state := filepath.Join(parent, "state")
	inside := filepath.Join(state, "workspaces", "w")
	os.MkdirAll(inside, 0o700)
	link := filepath.Join(t.TempDir(), "link")
	os.Symlink(parent, link)
	sp := sandbox.NewSpawner()
	sp.Private = []string{state}
	run := func(ws string) (protocol.Result, error) {
		return sp.Run(context.Background(), protocol.Request{Code: "1", Workspace: ws, ModulePath: mod,
			LibDir: bundletest.LibDir(t), Limits: policy.Default().Default})
	}
	for _, ws := range []string{parent, state, link} {
		if _, err := run(ws); !errors.Is(err, sandbox.ErrBadRequest) || !strings.Contains(err.Error(), "a daemon's state") {
			t.Errorf("workspace %s: %v", ws, err)
		}
	}
	if res, err := run(inside); err != nil || res.ExitCode != 0 {
		t.Fatalf("a workspace inside it: %v %+v", err, res)
	}
}

func TestBadRequests(t *testing.T) {
	t.Parallel()
	mod := bundletest.Module(t, false)
	ws := t.TempDir()
	lib := bundletest.LibDir(t)
	lim := policy.Default().Default
	for name, req := range map[string]protocol.Request{
		"no workspace":   {Code: "1", ModulePath: mod, LibDir: lib, Limits: lim},
		"no library":     {Code: "1", Workspace: ws, ModulePath: mod, Limits: lim},
		"both":           {Code: "1", Path: "a.py", Workspace: ws, ModulePath: mod, LibDir: lib, Limits: lim},
		"absolute path":  {Path: "/etc/passwd", Workspace: ws, ModulePath: mod, LibDir: lib, Limits: lim},
		"dotdot path":    {Path: "../x.py", Workspace: ws, ModulePath: mod, LibDir: lib, Limits: lim},
		"no limits":      {Code: "1", Workspace: ws, ModulePath: mod, LibDir: lib},
		"binary arg":     {Code: "1", Args: []string{"\xff"}, Workspace: ws, ModulePath: mod, LibDir: lib, Limits: lim},
		"binary env":     {Code: "1", Env: map[string]string{"A": "\xfe"}, Workspace: ws, ModulePath: mod, LibDir: lib, Limits: lim},
		"env name =":     {Code: "1", Env: map[string]string{"A=B": "c"}, Workspace: ws, ModulePath: mod, LibDir: lib, Limits: lim},
		"env name empty": {Code: "1", Env: map[string]string{"": "c"}, Workspace: ws, ModulePath: mod, LibDir: lib, Limits: lim},
	} {
		if _, err := sandbox.NewSpawner().Run(context.Background(), req); !errors.Is(err, sandbox.ErrBadRequest) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// A damaged module is reported as an internal error, not a crash or a hang.
func TestDamagedModule(t *testing.T) {
	t.Parallel()
	bad := filepath.Join(t.TempDir(), "bad.cwasm")
	os.WriteFile(bad, []byte("not a module"), 0o644)
	res, err := sandbox.NewSpawner().Run(context.Background(), protocol.Request{
		Code: "print(1)", Workspace: t.TempDir(), ModulePath: bad, LibDir: bundletest.LibDir(t), Limits: policy.Default().Default})
	if err != nil {
		t.Fatal(err)
	}
	if res.Reason != protocol.InternalError || len(res.Stdout) != 0 {
		t.Fatalf("reason %s stdout %q", res.Reason, res.Stdout)
	}
}

func TestCancel(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	req := protocol.Request{Code: "import time; time.sleep(60)", Workspace: t.TempDir(),
		ModulePath: bundletest.Module(t, false), LibDir: bundletest.LibDir(t), Limits: policy.Default().Default}
	req.Hardening = policy.Default().Hardening(req.Limits)
	sp, done := spawnerFor(t, req, "")
	defer done()
	go func() { time.Sleep(300 * time.Millisecond); cancel() }()
	start := time.Now()
	res, err := sp.Run(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if res.Reason != protocol.Cancelled {
		t.Fatalf("reason %s", res.Reason)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("cancel took %v", d)
	}
}

// Nothing crosses runs: each worker is a new process with a new interpreter.
func TestRunsAreIndependent(t *testing.T) {
	t.Parallel()
	res, _ := run(t, "import builtins, sys\nbuiltins.print = None\nsys.modules['json'] = None\nGLOBAL = 1", nil)
	wantExit(t, res, 0)
	res, _ = run(t, "import json\nprint('GLOBAL' in globals(), json.dumps(1))", nil)
	wantExit(t, res, 0)
	if string(res.Stdout) != "False 1\n" {
		t.Fatalf("stdout %q", res.Stdout)
	}
}

// A bind mount of the bundle directory, or of a directory above it, is the bundle
// by another path: the check compares devices and inodes, so it is refused too.
func TestWorkspaceBindMountOfTheBundle(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("bind mounts need root; CI runs as root")
	}
	mod := bundletest.Module(t, false)
	bundleDir := filepath.Dir(mod)
	for _, src := range []string{bundleDir, filepath.Dir(bundleDir)} {
		target := t.TempDir()
		if err := unix.Mount(src, target, "", unix.MS_BIND, ""); err != nil {
			t.Fatalf("bind mount: %v", err)
		}
		_, err := sandbox.NewSpawner().Run(context.Background(), protocol.Request{Code: "1", Workspace: target,
			ModulePath: mod, LibDir: bundletest.LibDir(t), Limits: policy.Default().Default})
		unix.Unmount(target, unix.MNT_DETACH)
		if !errors.Is(err, sandbox.ErrBadRequest) {
			t.Errorf("bind mount of %s as workspace: %v", src, err)
		}
	}
}

// The bootstrap ends the program as the interpreter's finalization would, as far as
// a program can see: exit handlers run, a file left open is flushed, buffered output
// is written, a non-integer SystemExit is printed and exits 1.
func TestEndOfProgram(t *testing.T) {
	t.Parallel()
	res, ws := run(t, `
import atexit, sys
atexit.register(lambda: print("atexit ran"))
f = open("/ws/unclosed.txt", "w")
f.write("flushed at exit")
sys.keep = open("/ws/held-by-sys.txt", "w")
sys.keep.write("flushed too")
sys.stdout.write("no newline")
`, nil)
	wantExit(t, res, 0)
	if string(res.Stdout) != "no newlineatexit ran\n" {
		t.Fatalf("stdout %q", res.Stdout)
	}
	if b, err := os.ReadFile(filepath.Join(ws, "unclosed.txt")); err != nil || string(b) != "flushed at exit" {
		t.Fatalf("unclosed file: %q %v", b, err)
	}
	if b, err := os.ReadFile(filepath.Join(ws, "held-by-sys.txt")); err != nil || string(b) != "flushed too" {
		t.Fatalf("a file held by a module: %q %v", b, err)
	}
	res, _ = run(t, `raise SystemExit("bye")`, nil)
	wantExit(t, res, 1)
	if string(res.Stderr) != "bye\n" {
		t.Fatalf("stderr %q", res.Stderr)
	}
}

// A worker answers a first frame of another protocol version, out of turn, or without
// its request with a report that says so, and runs nothing.
func TestWorkerRefusesFramesItCannotServe(t *testing.T) {
	v := protocol.Version
	speaks := fmt.Sprintf("version mismatch: this side speaks %d, the frame is ", v)
	for _, c := range []struct {
		name, frame, want string
	}{
		{"version 3", `{"version":3,"code":"print(1)"}`, speaks + "3"},
		{"previous version", fmt.Sprintf(`{"version":%d,"step":"run","request":{"code":"print(1)"}}`, v-1), speaks + fmt.Sprint(v-1)},
		{"out of turn", fmt.Sprintf(`{"version":%d,"step":"claim","request":{"code":"print(1)"}}`, v), `unexpected step: "claim"`},
		{"no request", fmt.Sprintf(`{"version":%d,"step":"run"}`, v), `"run" without its request`},
		{"a cell first", fmt.Sprintf(`{"version":%d,"step":"cell","request":{"code":"print(1)"}}`, v), `unexpected step: "cell"`},
		{"a save first", fmt.Sprintf(`{"version":%d,"step":"save"}`, v), `unexpected step: "save"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				t.Fatal(err)
			}
			parent, child := os.NewFile(uintptr(fds[0]), "parent"), os.NewFile(uintptr(fds[1]), "child")
			defer parent.Close()
			cmd := exec.Command(os.Args[0], protocol.WorkerCommand)
			cmd.Env = []string{}
			cmd.ExtraFiles = []*os.File{child}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			child.Close()
			binary.Write(parent, binary.BigEndian, uint32(len(c.frame)))
			parent.WriteString(c.frame)
			f, err := protocol.Receive(parent, protocol.StepReport)
			if err != nil {
				t.Fatal(err)
			}
			if f.Report.Reason != protocol.InternalError || !strings.Contains(strings.Join(f.Report.Diagnostics, ";"), c.want) {
				t.Fatalf("%+v", f.Report)
			}
			if err := cmd.Wait(); err != nil {
				t.Fatalf("a worker that reported exits 0: %v", err)
			}
		})
	}
}

// A file opened for appending appends (wasmtime writes it with pwritev2 and
// RWF_APPEND, which the seccomp profile allows).
func TestAppend(t *testing.T) {
	t.Parallel()
	res, _ := run(t, "open('/ws/a.txt', 'w').write('one\\n')\nwith open('/ws/a.txt', 'a') as f:\n    f.write('two\\n')\nwith open('/ws/a.txt', 'ab') as f:\n    f.write(b'three\\n')\nprint(open('/ws/a.txt').read(), end='')", nil)
	wantExit(t, res, 0)
	if string(res.Stdout) != "one\ntwo\nthree\n" {
		t.Fatalf("%q %s", res.Stdout, res.Stderr)
	}
}

// Every run starts from the interpreter's snapshot, fresh: what one run changes (a
// global, a monkey-patched builtin, a sys.modules entry, the environment, the working
// directory) is not in the next; `random` is reseeded from WASI's random source in
// every run; the monotonic clock starts near 0; sys.argv and sys.orig_argv are the
// run's; hash() is the snapshot's, the same in every run from it. (Through warm
// workers too: `make test` runs this package again with SANDCELL_TEST_WARM=1.)
func TestFreshStatePerRun(t *testing.T) {
	t.Parallel()
	const probe = `import builtins, json, os, random, sys, time
print(json.dumps({"len": builtins.len([1, 2]), "planted": "planted" in sys.modules, "env": dict(os.environ),
    "cwd": os.getcwd(), "global": "G" in globals(), "random": [random.random() for _ in range(4)],
    "monotonic": time.monotonic(), "hash": hash("sandcell"), "argv": sys.argv, "orig_argv": sys.orig_argv[-1]}))
G = 1
builtins.len = lambda x: -1
sys.modules["planted"] = sys
os.environ["LEFT"] = "behind"
os.chdir("/usr/local/lib")
`
	type state struct {
		Len       int               `json:"len"`
		Planted   bool              `json:"planted"`
		Env       map[string]string `json:"env"`
		Cwd       string            `json:"cwd"`
		Global    bool              `json:"global"`
		Random    []float64         `json:"random"`
		Monotonic float64           `json:"monotonic"`
		Hash      int64             `json:"hash"`
		Argv      []string          `json:"argv"`
		OrigArgv  string            `json:"orig_argv"`
	}
	var runs []state
	for i := 0; i < 3; i++ {
		res, _ := run(t, probe, func(r *protocol.Request) {
			r.Env = map[string]string{"RUN": strconv.Itoa(i)}
			r.Args = []string{"arg" + strconv.Itoa(i)}
		})
		wantExit(t, res, 0)
		var s state
		if err := json.Unmarshal(res.Stdout, &s); err != nil {
			t.Fatalf("%v: %q", err, res.Stdout)
		}
		want := strconv.Itoa(i)
		if s.Len != 2 || s.Planted || s.Global || s.Cwd != "/ws" || len(s.Env) != 1 || s.Env["RUN"] != want ||
			len(s.Argv) != 2 || s.Argv[0] != "-c" || s.Argv[1] != "arg"+want || s.OrigArgv != "arg"+want {
			t.Errorf("run %d did not start fresh: %+v", i, s)
		}
		if s.Monotonic < 0 || s.Monotonic > 1 {
			t.Errorf("run %d: the monotonic clock reads %v s at its start", i, s.Monotonic)
		}
		runs = append(runs, s)
	}
	for i := 1; i < len(runs); i++ {
		if slices.Equal(runs[i].Random, runs[0].Random) {
			t.Errorf("runs 0 and %d drew the same random numbers %v", i, runs[0].Random)
		}
		if runs[i].Hash != runs[0].Hash {
			t.Errorf("hash() differs between runs from one snapshot: %d, %d", runs[0].Hash, runs[i].Hash)
		}
	}
}

// The hash seed is the snapshot's, drawn per installation (bundle.HashSeed): two
// directories with different seeds give different hash() values, the same seed the
// same. A run's module can be any .cwasm the bundle made.
func TestHashSeedPerInstallation(t *testing.T) {
	if testing.Short() {
		t.Skip("compiles three snapshots (about 10 s each)")
	}
	t.Parallel()
	b := bundletest.Open(t)
	hashes := map[string]string{}
	for _, seed := range []string{"1", "2", "1"} {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, bundle.HashSeedName), []byte(seed+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		mod, err := b.Precompile(engine.New(engine.Options{}), dir)
		if err != nil {
			t.Fatal(err)
		}
		res, _ := run(t, `print(hash("sandcell"), hash(b"sandcell"))`, func(r *protocol.Request) { r.ModulePath = mod })
		wantExit(t, res, 0)
		h := string(res.Stdout)
		if prev, ok := hashes[seed]; ok && prev != h {
			t.Errorf("seed %s hashed %q, then %q", seed, prev, h)
		}
		hashes[seed] = h
	}
	if hashes["1"] == hashes["2"] {
		t.Errorf("seeds 1 and 2 hash alike: %q", hashes["1"])
	}
}

// The worker binary's memfd stays open however often the collector runs (an
// unreferenced os.File is closed when collected, and its number reused).
func TestWorkerBinaryOutlivesCollection(t *testing.T) {
	for i := 0; i < 3; i++ {
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
	if exe := sandbox.NewSpawner().Exe; !strings.HasPrefix(exe, "/proc/self/fd/") {
		t.Fatalf("workers run %s", exe)
	}
	res, _ := run(t, "print(6*7)", nil)
	wantExit(t, res, 0)
	if err := sandbox.UseWorkerBinary([]byte("x")); err == nil {
		t.Fatal("the worker binary was set twice")
	}
}

// netnsCommand starts a test worker that prints its network namespace.
const netnsCommand = "__netns"

// Workers whose seccomp filter denies socket(2) share one empty network
// namespace, made once by their spawner (creating one per worker takes a kernel-wide
// lock); workers without one get their own; either is the host's, and the contract
// says netns is active (its only device a loopback, down).
func TestSharedNetworkNamespace(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the shared network namespace needs CAP_SYS_ADMIN; CI runs as root")
	}
	host, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	sp := sandbox.NewSpawner()
	sp.Command = netnsCommand
	limits, err := policy.Default().Resolve(protocol.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	netns := func(h protocol.Hardening) string {
		t.Helper()
		req := protocol.Request{Code: "1", Workspace: t.TempDir(), ModulePath: bundletest.Module(t, false),
			LibDir: bundletest.LibDir(t), Limits: limits, Hardening: h}
		res, err := sp.Run(context.Background(), req)
		if err != nil || res.Reason != protocol.Exited || res.Enforcement == nil || !res.Enforcement.Namespaces[protocol.LayerNetNS] {
			t.Fatalf("%v: %+v", err, res)
		}
		return string(res.Stdout)
	}
	l := policy.Default().Hardening(limits)
	a, b := netns(l), netns(l)
	noSeccomp := l
	noSeccomp.Seccomp = nil
	noSeccomp.Require = slices.DeleteFunc(slices.Clone(l.Require), func(r string) bool { return r == protocol.LayerSeccomp })
	c, d := netns(noSeccomp), netns(noSeccomp)
	if a != b || a == host || !strings.HasPrefix(a, "net:[") {
		t.Errorf("workers with seccomp: %s and %s (host %s), want one shared namespace", a, b, host)
	}
	// Their own: neither the shared one (which the spawner keeps, so its number is
	// never reused) nor the host's. c and d may well print the same number: c's
	// namespace is freed when its worker ends, and the kernel reuses the number.
	if c == a || d == a || c == host || d == host || !strings.HasPrefix(c, "net:[") {
		t.Errorf("workers without seccomp: %s and %s (shared %s, host %s), want their own", c, d, a, host)
	}
	// A filter that lets socket(2) run does not keep workers apart in a shared one.
	sockets := l
	prof := *l.Seccomp
	prof.Syscalls = append(slices.Clone(prof.Syscalls), specs.LinuxSyscall{Names: []string{"socket"}, Action: specs.ActAllow})
	sockets.Seccomp = &prof
	if e := netns(sockets); e == a || e == host {
		t.Errorf("a worker whose filter allows socket(2) is in %s (shared %s, host %s)", e, a, host)
	}
}

// What a program leaves behind never stops its end (the output is written, the
// status is the program's): keys of __main__ that are not strings, the collector
// or exit handlers replaced, sys.stdout closed or replaced; and a program's own
// status is never taken for the out-of-memory report.
func TestEndOfProgramSurvivesTheProgram(t *testing.T) {
	t.Parallel()
	for code, want := range map[string]struct {
		stdout string
		exit   int
	}{
		`print("hi"); globals()[1] = 2`: {"hi\n", 0},
		"import atexit, gc, io\natexit._run_exitfuncs = gc.collect = None\nio.TextIOBase = None\nopen('/ws/f', 'w').write('x')\nprint('ok')": {"ok\n", 0},
		`import sys; print("x", end=""); sys.stdout.close()`:             {"x", 0},
		`import sys, io; print("x", end=""); sys.stdout = io.StringIO()`: {"x", 0},
		`import sys; print("before"); sys.exit(114)`:                     {"before\n", 114},
		`raise KeyboardInterrupt`:                                        {"", 130},
		"import sys\nopen('/ws/f', 'w')\nsys.addaudithook(lambda e, a: e == 'gc.get_objects' and sys.exit(0x1ff))\nprint('kept', end='')": {"kept", 0},
		// The bootstrap's own hook is set once, in C; a program's hooks still see
		// every event, the ones the bootstrap checks included.
		"import _sandcell, sys\nseen = set()\nsys.addaudithook(lambda e, a, seen=seen: seen.add(e))\nid(1); open('/ws/g', 'w').close()\n" +
			"try:\n    _sandcell.audit_hook(print, ('open',))\nexcept RuntimeError as e:\n    print(e, sorted(seen & {'builtins.id', 'open'}), end='')": {
			"audit_hook: the hook is set ['builtins.id', 'open']", 0},
	} {
		res, _ := run(t, code, nil)
		if res.Reason != protocol.Exited || res.ExitCode != want.exit || string(res.Stdout) != want.stdout {
			t.Errorf("%q: %s %d stdout %q stderr %q, want exited %d stdout %q", code, res.Reason, res.ExitCode,
				res.Stdout, res.Stderr, want.exit, want.stdout)
		}
	}
}
