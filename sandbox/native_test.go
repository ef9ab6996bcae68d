package sandbox_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandcell/sandcell/sandbox"
	"github.com/sandcell/sandcell/sandbox/policy"
	"github.com/sandcell/sandcell/sandbox/protocol"
)

// nativeRoot returns the native backend's root file system for the tests:
// $SANDCELL_NATIVE_ROOT, or the bundle's (make native). Under make (the bundle
// directory set) a missing root fails the test; elsewhere it skips, saying so.
func nativeRoot(t testing.TB) string {
	t.Helper()
	if d := os.Getenv("SANDCELL_NATIVE_ROOT"); d != "" {
		return d
	}
	d := filepath.Join(os.Getenv("SANDCELL_BUNDLE_DIR"), "native", "rootfs")
	if _, err := os.Stat(filepath.Join(d, "usr/bin/python3.13")); err != nil {
		if os.Getenv("SANDCELL_BUNDLE_DIR") != "" {
			t.Fatalf("no native root (make native): %v", err)
		}
		t.Skip("no native root: set SANDCELL_NATIVE_ROOT or SANDCELL_BUNDLE_DIR (make native)")
	}
	return d
}

// nativeRequest is a request to run code on the native backend with the default
// policy, changed by edit, in a fresh workspace.
func nativeRequest(t *testing.T, code string, edit func(*protocol.Request, *policy.Policy)) protocol.Request {
	t.Helper()
	pol := policy.Default()
	req := protocol.Request{Backend: protocol.BackendNative, RootDir: nativeRoot(t), Code: code, Workspace: t.TempDir()}
	if edit != nil {
		edit(&req, &pol)
	}
	limits, err := pol.Resolve(req.Limits)
	if err != nil {
		t.Fatal(err)
	}
	req.Limits = limits
	req.Hardening = pol.NativeHardening(limits)
	return req
}

// runNative executes code on the native backend with the default policy, changed by
// edit, in a fresh workspace.
func runNative(t *testing.T, code string, edit func(*protocol.Request, *policy.Policy)) (protocol.Result, string) {
	t.Helper()
	req := nativeRequest(t, code, edit)
	sp, done := spawnerFor(t, req, "")
	res, err := sp.Run(context.Background(), req)
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	done()
	return res, req.Workspace
}

func TestNativePrint(t *testing.T) {
	t.Parallel()
	res, ws := runNative(t, `import sys, os
print(sys.version_info[:2], sys.implementation.name, os.getcwd(), sys.argv)
open("out.txt", "w").write("hi")
print(sorted(os.listdir("/")))
`, nil)
	wantExit(t, res, 0)
	if !strings.Contains(string(res.Stdout), "(3, 13) cpython /ws ['-c']") {
		t.Fatalf("stdout %q stderr %q", res.Stdout, res.Stderr)
	}
	if b, err := os.ReadFile(filepath.Join(ws, "out.txt")); err != nil || string(b) != "hi" {
		t.Fatalf("out.txt: %q %v", b, err)
	}
	e := res.Enforcement
	if e == nil || e.Backend != protocol.BackendNative || len(e.Missing(protocol.Layers())) > 0 {
		t.Fatalf("contract %+v", e)
	}
	t.Logf("stdout %s\nstderr %s\ncontract %+v", res.Stdout, res.Stderr, e)
}

// The native runner reads the header the wasm bootstrap reads, its DISK field (the
// wasm guest's storage figures) skipped: the program's arguments are its own,
// whatever a workspace quota the request names; /tmp is the native tmpfs of
// Hardening.TmpBytes, not one of the quota's size; shutil.disk_usage is statfs(2).
func TestNativeHeader(t *testing.T) {
	t.Parallel()
	code := `import os, shutil, sys
print(sys.argv)
open("/tmp/a", "w").write("x")
st = os.statvfs("/tmp")
print(shutil.disk_usage("/tmp").total == st.f_blocks * st.f_frsize, st.f_blocks * st.f_frsize)
`
	for _, quota := range []int64{0, 1 << 20} {
		res, _ := runNative(t, code, func(r *protocol.Request, _ *policy.Policy) {
			r.Args, r.WorkspaceQuota = []string{"a", "b c", "", "quota=1"}, quota
		})
		wantOutput(t, res, fmt.Sprintf("['-c', 'a', 'b c', '', 'quota=1']\nTrue %d\n", policy.DefaultNativeTmpBytes))
	}
}

// TestNativeBoundaries runs probes of what the native guest must not do, and of what
// it must still be able to, each in a run of its own; a probe prints "ok" when the
// system answered as the contract says.
func TestNativeBoundaries(t *testing.T) {
	t.Parallel()
	probes := map[string]string{
		"root read-only": `
try:
    open("/etc/x", "w")
except OSError as e:
    print("ok", e.errno)`,
		"tmp private and writable": `
import os
open("/tmp/a", "w").write("x"); print("ok" if sorted(os.listdir("/tmp")) == [".matplotlib", "a"] else os.listdir("/tmp"))`,
		"no fork": `
import os
try:
    os.fork()
except OSError as e:
    print("ok", e.errno)`,
		"no subprocess": `
import subprocess
try:
    subprocess.run(["/usr/bin/python3", "-c", "1"])
except OSError as e:
    print("ok", e.errno)`,
		"no socket": `
import socket
try:
    socket.socket(socket.AF_INET, socket.SOCK_STREAM)
except OSError as e:
    print("ok", e.errno)`,
		"socketpair works": `
import socket
a, b = socket.socketpair(); a.send(b"x"); print("ok" if b.recv(1) == b"x" else "no")`,
		"no out-of-band data": `
import socket
a, b = socket.socketpair()
try:
    a.send(b"x", socket.MSG_OOB)
except OSError as e:
    a.send(b"y"); print("ok" if b.recv(1) == b"y" else "no", e.errno)`,
		"no socket filter": `
import socket, struct, ctypes
a, b = socket.socketpair()
a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 65536)
prog = (ctypes.c_uint64 * 1)(0x0000ffff00000006)  # BPF_RET|BPF_K 0xffff: accept
fprog = struct.pack("HL", 1, ctypes.addressof(prog))
try:
    a.setsockopt(socket.SOL_SOCKET, 26, fprog)  # SO_ATTACH_FILTER
except OSError as e:
    print("ok", e.errno)`,
		"no executable anonymous memory": `
import mmap
try:
    mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
except OSError as e:
    print("ok", e.errno)`,
		"no mprotect to executable": `
import ctypes, mmap
libc = ctypes.CDLL(None)
m = mmap.mmap(-1, 4096, flags=mmap.MAP_PRIVATE)
addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
print("ok" if libc.mprotect(ctypes.c_void_p(addr), 4096, 7) == -1 and ctypes.get_errno() in (0, 1) else "no")`,
		"no memfd": `
import os
try:
    os.memfd_create("x")
except OSError as e:
    print("ok", e.errno)`,
		"no code from the workspace": `
import shutil, ctypes, glob
lib = glob.glob("/usr/lib/*-linux-gnu/libz.so.1")[0]
shutil.copy(lib, "/ws/libx.so")
try:
    ctypes.CDLL("/ws/libx.so")
except OSError as e:
    print("ok", "failed to map" in str(e) or "not permitted" in str(e), e)`,
		"no write to own memory through proc": `
try:
    open("/proc/self/mem", "wb")
except OSError as e:
    print("ok", e.errno)`,
		"no ptrace": `
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
print("ok" if libc.ptrace(0, 0, 0, 0) == -1 and ctypes.get_errno() == 1 else "no")`,
		"no other devices": `
import os
print("ok", sorted(os.listdir("/dev")))
open("/dev/null", "w").write("x")
try:
    os.mknod("/tmp/n", 0o20666, os.makedev(1, 3))
except OSError as e:
    print("ok", e.errno)`,
		"no set-id bits on the host's files": `
import os
open("/ws/f", "w").close()
errs = []
for f in (lambda: os.chmod("/ws/f", 0o4755), lambda: os.chmod("/ws/f", 0o2755),
          lambda: os.open("/ws/g", os.O_CREAT | os.O_WRONLY, 0o6755)):
    try:
        f(); errs.append("allowed")
    except OSError as e:
        errs.append(e.errno)
os.chmod("/ws/f", 0o755)
print("ok" if errs == [1, 1, 1] and not os.path.exists("/ws/g") else errs)`,
		"no shared anonymous memory": `
import mmap
try:
    mmap.mmap(-1, 1 << 30)
except OSError as e:
    print("ok", e.errno)`,
		"no writable executable file mapping": `
import mmap
f = open("/usr/bin/python3.13", "rb")
try:
    mmap.mmap(f.fileno(), 4096, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
except OSError as e:
    print("ok", e.errno)`,
		"no space reserved without writing": `
import os
fd = os.open("/ws/big", os.O_CREAT | os.O_WRONLY)
try:
    os.posix_fallocate(fd, 0, 1 << 20)
    print("ok", os.stat("/ws/big").st_blocks * 512 >= 1 << 20)
except OSError as e:
    print("ok", e.errno)`,
		"no leases": `
import fcntl, os
fd = os.open("/ws/l", os.O_CREAT | os.O_RDONLY)
try:
    fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
except OSError as e:
    print("ok", e.errno)`,
		"limits only go down": `
import resource
s, h = resource.getrlimit(resource.RLIMIT_STACK)
try:
    resource.setrlimit(resource.RLIMIT_STACK, (h, h))
except (OSError, ValueError) as e:
    print("ok", e)`,
		"the memory limit only goes down": `
import resource
s, h = resource.getrlimit(resource.RLIMIT_DATA)
assert s == h and 0 < h < 1 << 40, (s, h)
try:
    resource.setrlimit(resource.RLIMIT_DATA, (h + 4096, h + 4096))
except (OSError, ValueError) as e:
    resource.setrlimit(resource.RLIMIT_DATA, (h - 4096, h - 4096))
    lowered = resource.getrlimit(resource.RLIMIT_DATA) == (h - 4096, h - 4096)
    print("ok" if lowered else "not lowered", e)`,
		"threads work": `
import threading
out = []
ts = [threading.Thread(target=out.append, args=(i,)) for i in range(8)]
[t.start() for t in ts]; [t.join() for t in ts]
print("ok" if sorted(out) == list(range(8)) else out)`,
		"no network": `
lines = open("/proc/self/net/dev").read().split("\n")[2:]
devs = [l.split(":")[0].strip() for l in lines if l.strip()]
print("ok" if devs == ["lo"] else devs)`,
	}
	for name, code := range probes {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			res, _ := runNative(t, code, nil)
			wantExit(t, res, 0)
			if !strings.HasPrefix(string(res.Stdout), "ok") || strings.Contains(string(res.Stdout), "ok False") {
				t.Fatalf("stdout %q stderr %q", res.Stdout, res.Stderr)
			}
			t.Logf("%s", res.Stdout)
		})
	}
}

// TestNativeLimits: memory, CPU, wall clock, output and threads end in their typed
// reasons on the native backend.
func TestNativeLimits(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, code string
		edit       func(*protocol.Request, *policy.Policy)
		want       protocol.Reason
	}{
		{"memory", "b = bytearray(1 << 30)", nil, protocol.MemoryLimit},
		{"cpu", "while True: pass", func(r *protocol.Request, _ *policy.Policy) { r.Limits.CPUMS = 1000 }, protocol.CPULimit},
		{"wall clock", "import time; time.sleep(60)", func(r *protocol.Request, _ *policy.Policy) { r.Limits.TimeoutMS = 1000 }, protocol.Timeout},
		{"output", "while True: print('x' * 1000)", nil, protocol.OutputLimit},
		{"exit status", "raise SystemExit(3)", nil, protocol.Exited},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			res, _ := runNative(t, c.code, c.edit)
			if res.Reason != c.want {
				t.Fatalf("reason %s exit %d, want %s\nstderr %.1000s\ndiagnostics %v", res.Reason, res.ExitCode, c.want, res.Stderr, res.Diagnostics)
			}
			if res.Enforcement == nil || res.Enforcement.Backend != protocol.BackendNative {
				t.Fatalf("no native contract: %+v", res.Enforcement)
			}
		})
	}
	t.Run("thread bomb", func(t *testing.T) {
		t.Parallel()
		res, _ := runNative(t, `
import threading, time
n = 0
try:
    while True:
        threading.Thread(target=time.sleep, args=(30,), daemon=True).start(); n += 1
except RuntimeError as e:
    print("stopped", n < 300, e)
`, nil)
		wantExit(t, res, 0)
		if !strings.HasPrefix(string(res.Stdout), "stopped True") {
			t.Fatalf("stdout %q stderr %q", res.Stdout, res.Stderr)
		}
	})
	t.Run("processes when policy allows", func(t *testing.T) {
		t.Parallel()
		res, _ := runNative(t, `
import os, subprocess
r = subprocess.run(["/usr/bin/python3", "-c", "import os; print(os.getpid() < 100, os.readlink('/proc/self/ns/pid') == %r)" % os.readlink("/proc/self/ns/pid")], capture_output=True, text=True)
print("child", r.returncode, r.stdout.strip(), r.stderr[-300:])
`, func(_ *protocol.Request, p *policy.Policy) { p.NativeProcesses = true })
		if os.Geteuid() == 0 {
			// RLIMIT_NPROC does not bind root: refused, nothing run
			// (TestNativeProcessesUnprivileged runs this case as uid 65534).
			if res.Reason != protocol.Rejected || !strings.Contains(strings.Join(res.Diagnostics, ";"), "does not bind the root user") {
				t.Fatalf("processes for a root daemon's guest: %+v", res)
			}
			return
		}
		wantExit(t, res, 0)
		if !strings.HasPrefix(string(res.Stdout), "child 0 True True") {
			t.Fatalf("stdout %q stderr %q", res.Stdout, res.Stderr)
		}
	})
}

// TestNativeProcessesUnprivileged runs the processes case of TestNativeLimits as
// uid 65534 when the tests run as root (whose guests are refused processes: see
// unboundedProcesses), with a fork bomb beside it: RLIMIT_NPROC stops it, with the
// run still ending by itself.
func TestNativeProcessesUnprivileged(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("not root: TestNativeLimits runs the processes case itself")
	}
	if warmMode || testing.Short() {
		t.Skip("the cold pass of `make test` runs this")
	}
	out := asNobody(t, "-test.run=^(TestNativeLimits|TestNativeForkBomb|TestNativeSessionProcessesEndWithTheCell)$/^processes_when_policy_allows$")
	for _, want := range []string{"--- PASS: TestNativeLimits/processes_when_policy_allows", "--- PASS: TestNativeForkBomb",
		"--- PASS: TestNativeSessionProcessesEndWithTheCell"} {
		if !strings.Contains(out, want) {
			t.Fatalf("as uid 65534, no %q:\n%s", want, out)
		}
	}
}

// TestNativeForkBomb: with processes allowed, a fork bomb meets RLIMIT_NPROC
// (fork fails with EAGAIN) and the run ends by itself. As root it is refused
// before it runs (see TestNativeLimits), so it runs only unprivileged.
func TestNativeForkBomb(t *testing.T) {
	if os.Geteuid() == 0 {
		t.Skip("as root the guest is refused processes: TestNativeProcessesUnprivileged runs this as uid 65534")
	}
	t.Parallel()
	res, _ := runNative(t, `
import os, time
n, err = 0, None
kids = []
try:
    while n < 5000:
        pid = os.fork()
        if pid == 0:
            time.sleep(30)
            os._exit(0)
        kids.append(pid); n += 1
except OSError as e:
    err = e.errno
print("stopped", n < 1000, err)
`, func(r *protocol.Request, p *policy.Policy) { p.NativeProcesses = true; r.Limits.TimeoutMS = 60_000 })
	wantExit(t, res, 0)
	if !strings.HasPrefix(string(res.Stdout), "stopped True 11") {
		t.Fatalf("stdout %q stderr %q", res.Stdout, res.Stderr)
	}
}

// display() shows an object's richest representation as a workspace file, with its
// text inline; what a guest forges in the runner's place (a report naming files
// outside displays/, or of another type) is left out.
func TestNativeDisplays(t *testing.T) {
	t.Parallel()
	res, ws := runNative(t, `
class Table:
    def _repr_html_(self): return "<table><tr><td>1</td></tr></table>"
    def __repr__(self): return "Table(1)"
display(Table(), 42)
`, nil)
	wantExit(t, res, 0)
	if len(res.Displays) != 3 {
		t.Fatalf("displays %+v, diagnostics %v, stderr %s", res.Displays, res.Diagnostics, res.Stderr)
	}
	want := []struct{ typ, text string }{{"text/html", "<table><tr><td>1</td></tr></table>"}, {"text/plain", "Table(1)"}, {"text/plain", "42"}}
	for i, d := range res.Displays {
		if d.Type != want[i].typ || d.Text != want[i].text || !strings.HasPrefix(d.Path, "displays/") {
			t.Fatalf("display %d: %+v", i, d)
		}
		if b, err := os.ReadFile(filepath.Join(ws, d.Path)); err != nil || string(b) != want[i].text {
			t.Fatalf("display %d's file: %q %v", i, b, err)
		}
	}

	res, _ = runNative(t, withVersion(`
import json, os
os.makedirs("/ws/displays", exist_ok=True)
open("/ws/displays/ok.txt", "w").write("fine")
os.symlink("/etc/hostname", "/ws/displays/link.txt")
items = [{"type": "text/plain", "path": "../etc/passwd"}, {"type": "text/plain", "path": "displays/../../x"},
         {"type": "application/x-evil", "path": "displays/ok.txt"}, {"type": "image/png", "path": "displays/ok.txt"},
         {"type": "text/plain", "path": "displays/link.txt"}, {"type": "text/plain", "path": "displays/ok.txt"}]
body = json.dumps({"version": VERSION, "step": "report", "report": {"reason": "exited", "displays": items}}).encode()
os.write(3, len(body).to_bytes(4, "big") + body)
os._exit(0)
`), nil)
	wantExit(t, res, 0)
	if len(res.Displays) != 1 || res.Displays[0].Text != "fine" || len(res.Diagnostics) != 5 {
		t.Fatalf("forged displays: %+v\n%v", res.Displays, res.Diagnostics)
	}

	// A FIFO in the workspace (the guest cannot make one: Landlock) named as a
	// display is refused without waiting for a writer.
	res, ws = runNative(t, "", func(r *protocol.Request, _ *policy.Policy) {
		os.MkdirAll(filepath.Join(r.Workspace, "displays"), 0o755)
		if err := syscall.Mkfifo(filepath.Join(r.Workspace, "displays", "f.txt"), 0o644); err != nil {
			t.Fatal(err)
		}
		r.Code = withVersion(`import json, os
body = json.dumps({"version": VERSION, "step": "report", "report": {"reason": "exited", "displays": [{"type": "text/plain", "path": "displays/f.txt"}]}}).encode()
os.write(3, len(body).to_bytes(4, "big") + body)
os._exit(0)`)
	})
	wantExit(t, res, 0)
	if len(res.Displays) != 0 || len(res.Diagnostics) != 1 || !strings.Contains(res.Diagnostics[0], "not a regular file") {
		t.Fatalf("a FIFO as a display: %+v %v (%s)", res.Displays, res.Diagnostics, ws)
	}
}

// A native session keeps its interpreter across cells: a value, the last
// expression's value apart from the output, an exception that leaves the state as it
// was, a DataFrame-like value's rich form as a display; a cell past its wall clock
// ends the session (no checkpoint to roll back to), and Save says there is none.
func TestNativeSession(t *testing.T) {
	t.Parallel()
	ss := openNativeSession(t)
	if e := ss.Enforcement(); e.Backend != protocol.BackendNative || len(e.Missing(protocol.Layers())) > 0 {
		t.Fatalf("contract %+v", e)
	}
	cell := func(code string) sandbox.Cell {
		t.Helper()
		c, err := ss.Run(context.Background(), protocol.Request{Code: code, Limits: protocol.Limits{TimeoutMS: 5000,
			MaxStdoutBytes: 1 << 20, MaxStderrBytes: 1 << 20}})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	if c := cell("x = 6\nprint('hi')\nx * 7"); c.Reason != protocol.Exited || string(c.Stdout) != "hi\n" || c.Value != "42" {
		t.Fatalf("cell 1: %+v value %q stdout %q stderr %q", c.Result, c.Value, c.Stdout, c.Stderr)
	}
	if c := cell("x += 1\n1/0"); c.ExitCode != 1 || !strings.Contains(string(c.Stderr), "ZeroDivisionError") {
		t.Fatalf("cell 2: %+v stderr %q", c.Result, c.Stderr)
	}
	c := cell(`class T:
    def _repr_html_(self): return "<b>%d</b>" % x
    def __repr__(self): return "T(%d)" % x
T()`)
	if c.Value != "T(7)" || len(c.Displays) != 2 || c.Displays[0].Text != "<b>7</b>" {
		t.Fatalf("cell 3: value %q displays %+v diagnostics %v stderr %s", c.Value, c.Displays, c.Diagnostics, c.Stderr)
	}
	if _, err := ss.Save(io.Discard); !errors.Is(err, sandbox.ErrNoCheckpoint) {
		t.Fatalf("save: %v", err)
	}
	if c := cell("x"); c.Value != "7" {
		t.Fatalf("after save: %q", c.Value)
	}
	// A cell past its time is rolled back: the interpreter is ended and the
	// checkpoint forked before the cell carries on, with what the cell changed
	// undone and its output so far kept.
	c, err := ss.Run(context.Background(), protocol.Request{Code: "x = 100\nprint('before', flush=True)\nimport time; time.sleep(30)",
		Limits: protocol.Limits{TimeoutMS: 300, MaxStdoutBytes: 1 << 20, MaxStderrBytes: 1 << 20}})
	if err != nil || c.Reason != protocol.Timeout || !c.RolledBack || string(c.Stdout) != "before\n" {
		t.Fatalf("timeout cell: %+v %v stdout %q", c.Result, err, c.Stdout)
	}
	if c := cell("x"); c.Value != "7" || len(c.Stdout) != 0 {
		t.Fatalf("after a timeout: value %q stdout %q", c.Value, c.Stdout)
	}
	// One that ends the interpreter itself (os._exit) is rolled back too.
	if c := cell("x = 200\nimport os; os._exit(3)"); c.Reason != protocol.Exited || !c.RolledBack {
		t.Fatalf("os._exit: %+v", c.Result)
	}
	// A thread a cell left running is not in the checkpoint (it holds the thread
	// that forked it alone).
	cell("import threading, time\nev = threading.Event()\nth = threading.Thread(target=ev.wait, daemon=True)\nth.start()")
	if c := cell("x, threading.active_count()"); c.Value != "(7, 2)" {
		t.Fatalf("a thread: %q", c.Value)
	}
	if c, err := ss.Run(context.Background(), protocol.Request{Code: "time.sleep(30)",
		Limits: protocol.Limits{TimeoutMS: 300, MaxStdoutBytes: 1 << 20, MaxStderrBytes: 1 << 20}}); err != nil || !c.RolledBack {
		t.Fatalf("timeout with a thread: %+v %v", c.Result, err)
	}
	if c := cell("x, threading.active_count(), th.is_alive()"); c.Value != "(7, 1, False)" {
		t.Fatalf("after a rollback with a thread: %q stderr %q", c.Value, c.Stderr)
	}
	// The guest still starts no process: the one fork the daemon allows is the
	// runner's, before each cell.
	if c := cell("import os\ntry:\n    os.fork()\nexcept OSError as e:\n    print(e.errno)"); string(c.Stdout) != "1\n" {
		t.Fatalf("a cell's fork: %q %q", c.Stdout, c.Stderr)
	}
}

// A frame the guest writes on the control fd in one cell is not taken for the next
// cell's: the session ends (lost), and the cell answers at once, not when its wall
// clock would have.
func TestNativeSessionForgedFrame(t *testing.T) {
	t.Parallel()
	ss := openNativeSession(t)
	lim := protocol.Limits{TimeoutMS: 60_000, MaxStdoutBytes: 1 << 20, MaxStderrBytes: 1 << 20}
	c, err := ss.Run(context.Background(), protocol.Request{Limits: lim, Code: fmt.Sprintf(`import os
b = b'{"version":%d,"step":"report","report":{"exit_code":0,"reason":"exited","rolled_back":true,"diagnostics":["forged"]}}'
os.write(3, len(b).to_bytes(4, "big") + b)`, protocol.Version)})
	if err != nil {
		t.Fatal(err)
	}
	if c.RolledBack || len(c.Diagnostics) > 0 {
		t.Fatalf("forged report taken: %+v", c.Result)
	}
	began := time.Now()
	_, err = ss.Run(context.Background(), protocol.Request{Limits: lim, Code: "import time; time.sleep(1000)"})
	c, err2 := ss.Run(context.Background(), protocol.Request{Limits: lim, Code: "1"})
	if time.Since(began) > 20*time.Second || !errors.Is(err2, sandbox.ErrSessionLost) {
		t.Fatalf("after a forged frame: %v / %v after %s (%+v)", err, err2, time.Since(began), c.Result)
	}
}

// A native session's cell is held to its own CPU-time limit (the parent watches the
// session's processes' CPU time: RLIMIT_CPU is the session's backstop), threads'
// time included; the cell is then rolled back, its threads with it. A cell within
// its limit, after others have used more, is not cut.
func TestNativeSessionCellCPULimit(t *testing.T) {
	t.Parallel()
	ss := openNativeSession(t)
	lim := protocol.Limits{TimeoutMS: 60_000, CPUMS: 700, MaxStdoutBytes: 1 << 20, MaxStderrBytes: 1 << 20}
	spin := `import time
def spin(s):
    end = time.process_time() + s
    while time.process_time() < end:
        pass
`
	for i := range 3 { // 1.2 s of CPU in all, each cell within 0.7 s
		c, err := ss.Run(context.Background(), protocol.Request{Limits: lim, Code: spin + "spin(0.4)"})
		if err != nil || c.Reason != protocol.Exited || c.ExitCode != 0 {
			t.Fatalf("cell %d within its limit: %v %+v %s", i, err, c.Result, c.Stderr)
		}
	}
	began := time.Now()
	c, err := ss.Run(context.Background(), protocol.Request{Limits: lim, Code: `import threading
` + spin + `
ts = [threading.Thread(target=spin, args=(1000,)) for _ in range(2)]
for t in ts: t.start()
for t in ts: t.join()`})
	if err != nil || c.Reason != protocol.CPULimit || !c.RolledBack {
		t.Fatalf("a spinning cell: %v %+v", err, c.Result)
	}
	if d := time.Since(began); d > 10*time.Second {
		t.Fatalf("the cell ran %s past a 0.7 s CPU limit", d)
	}
	// Its threads ended with the interpreter: the next cell has the CPU to itself.
	c, err = ss.Run(context.Background(), protocol.Request{Limits: lim, Code: "import threading\nspin(0.4)\nthreading.active_count()"})
	if err != nil || c.Reason != protocol.Exited || c.Value != "1" {
		t.Fatalf("after the limit: %v %+v %q %s", err, c.Result, c.Value, c.Stderr)
	}
}

// openNativeSession opens a session on the native backend with the default policy,
// changed by each of edit, in a fresh workspace, closed when t ends.
func openNativeSession(t *testing.T, edit ...func(*policy.Policy)) *sandbox.Session {
	t.Helper()
	pol := policy.Default()
	for _, e := range edit {
		e(&pol)
	}
	limits, err := pol.Resolve(protocol.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	req := protocol.Request{Backend: protocol.BackendNative, RootDir: nativeRoot(t), Workspace: t.TempDir(),
		Limits: limits, Hardening: pol.NativeHardening(limits)}
	sp, done := spawnerFor(t, req, "")
	ss, err := sp.OpenSession(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ss.Close(); done() })
	return ss
}

// Between cells a native session's interpreter is stopped: a thread a cell leaves
// spinning uses no CPU until the next cell, which finds it running again.
func TestNativeSessionIdleBetweenCells(t *testing.T) {
	t.Parallel()
	ss := openNativeSession(t)
	lim := protocol.Limits{TimeoutMS: 30_000, CPUMS: 5_000, MaxStdoutBytes: 1 << 20, MaxStderrBytes: 1 << 20}
	c, err := ss.Run(context.Background(), protocol.Request{Limits: lim, Code: `import threading
n = [0]
def spin():
    while True:
        n[0] += 1
threading.Thread(target=spin, daemon=True).start()
while n[0] == 0:
    pass`})
	if err != nil || c.Reason != protocol.Exited || c.ExitCode != 0 {
		t.Fatalf("%v %+v %s", err, c.Result, c.Stderr)
	}
	cpu := func() int64 {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", ss.PID()))
		if err != nil {
			t.Fatal(err)
		}
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		u, _ := strconv.ParseInt(f[11], 10, 64)
		s, _ := strconv.ParseInt(f[12], 10, 64)
		return u + s
	}
	before := cpu()
	time.Sleep(time.Second)
	if used := cpu() - before; used > 2 {
		t.Fatalf("the idle interpreter used %d ticks of CPU in a second", used)
	}
	c, err = ss.Run(context.Background(), protocol.Request{Limits: lim, Code: `import time
a = n[0]; time.sleep(0.2); print(n[0] > a)`})
	if err != nil || string(c.Stdout) != "True\n" {
		t.Fatalf("the next cell: %v %+v %q %s", err, c.Result, c.Stdout, c.Stderr)
	}
}

// A thread that waits with a timeout (a futex wait the kernel resumes through
// restart_syscall(2) after the stop between cells) goes on waiting after the next
// cell continues the interpreter, and its wait ends as it would have.
func TestNativeSessionTimedWaitAcrossIdle(t *testing.T) {
	t.Parallel()
	ss := openNativeSession(t)
	lim := protocol.Limits{TimeoutMS: 30_000, CPUMS: 5_000, MaxStdoutBytes: 1 << 20, MaxStderrBytes: 1 << 20}
	c, err := ss.Run(context.Background(), protocol.Request{Limits: lim, Code: `import threading, time
waiting, woke = threading.Event(), []
def wait():
    waiting.set()
    woke.append(threading.Event().wait(0.5))
threading.Thread(target=wait).start()
waiting.wait()
time.sleep(0.05)`})
	if err != nil || c.Reason != protocol.Exited || c.ExitCode != 0 {
		t.Fatalf("%v %+v %s", err, c.Result, c.Stderr)
	}
	time.Sleep(200 * time.Millisecond)
	c, err = ss.Run(context.Background(), protocol.Request{Limits: lim, Code: `import time
deadline = time.monotonic() + 5
while not woke and time.monotonic() < deadline:
    time.sleep(0.01)
print(woke)`})
	if err != nil || string(c.Stdout) != "[False]\n" {
		t.Fatalf("the next cell: %v %+v %q %s", err, c.Result, c.Stdout, c.Stderr)
	}
}

// With processes allowed, the processes a cell starts end with it, whether they
// stay in the interpreter's process group or leave it (setsid). Processes are
// refused to a root daemon's guests, so this runs unprivileged (see
// TestNativeProcessesUnprivileged).
func TestNativeSessionProcessesEndWithTheCell(t *testing.T) {
	if os.Geteuid() == 0 {
		t.Skip("as root the guest is refused processes: TestNativeProcessesUnprivileged runs this as uid 65534")
	}
	t.Parallel()
	ss := openNativeSession(t, func(p *policy.Policy) { p.NativeProcesses = true })
	lim := protocol.Limits{TimeoutMS: 30_000, MaxStdoutBytes: 1 << 20, MaxStderrBytes: 1 << 20}
	c, err := ss.Run(context.Background(), protocol.Request{Limits: lim, Code: `import os
kids = []
for leave in (False, True):
    pid = os.fork()
    if pid == 0:
        if leave:
            os.setsid()
        while True:
            pass
    kids.append(pid)
print(len(kids))`})
	if err != nil || string(c.Stdout) != "2\n" {
		t.Fatalf("%v %+v %q %s", err, c.Result, c.Stdout, c.Stderr)
	}
	c, err = ss.Run(context.Background(), protocol.Request{Limits: lim, Code: `import os
alive = []
for pid in kids:
    try:
        os.waitpid(pid, os.WNOHANG)
        os.kill(pid, 0)
        alive.append(pid)
    except (ProcessLookupError, ChildProcessError):
        pass
print(alive)`})
	if err != nil || string(c.Stdout) != "[]\n" {
		t.Fatalf("a cell's processes outlived it: %v %+v %q %s", err, c.Result, c.Stdout, c.Stderr)
	}
}

// An uncaught exception's traceback is the program's, as python3 -c shows it: its
// frames alone (none of the runner's) with the program's own source lines, in a
// run and in a session's cell.
func TestNativeTraceback(t *testing.T) {
	t.Parallel()
	code := "x = 1\ndef f():\n    raise ValueError('boom')\nf()\n"
	want := "Traceback (most recent call last):\n  File \"<string>\", line 4, in <module>\n    f()\n    ~^^\n" +
		"  File \"<string>\", line 3, in f\n    raise ValueError('boom')\nValueError: boom\n"
	res, _ := runNative(t, code, nil)
	if res.ExitCode != 1 || string(res.Stderr) != want {
		t.Fatalf("exit %d, stderr:\n%s", res.ExitCode, res.Stderr)
	}
	// A syntax error, as python3 -c shows it (no frame).
	res, _ = runNative(t, "x = (", nil)
	if res.ExitCode != 1 || !strings.HasPrefix(string(res.Stderr), "  File \"<string>\", line 1\n    x = (\n") ||
		!strings.HasSuffix(string(res.Stderr), "SyntaxError: '(' was never closed\n") {
		t.Fatalf("exit %d, stderr:\n%s", res.ExitCode, res.Stderr)
	}
	// A program long enough that its lines and the runner's overlap: the runner's
	// frames (display()'s) show the runner's lines, the program's its own.
	long := "class A:\n    def _repr_html_(self):\n        raise ValueError('html')\n" +
		strings.Repeat("pass\n", 400) + "display(A())\n"
	res, _ = runNative(t, long, nil)
	if res.ExitCode != 1 || !strings.Contains(string(res.Stderr), "line 404, in <module>\n    display(A())\n") ||
		!strings.Contains(string(res.Stderr), "line 3, in _repr_html_\n    raise ValueError('html')\n") ||
		strings.Contains(string(res.Stderr), "    pass\n") {
		t.Fatalf("exit %d, stderr:\n%s", res.ExitCode, res.Stderr)
	}
	ss := openNativeSession(t)
	lim := protocol.Limits{TimeoutMS: 30_000, CPUMS: 5_000, MaxStdoutBytes: 1 << 20, MaxStderrBytes: 1 << 20}
	c, err := ss.Run(context.Background(), protocol.Request{Limits: lim, Code: code, Filename: "<string>"})
	if err != nil || c.ExitCode != 1 || string(c.Stderr) != want {
		t.Fatalf("%v exit %d, stderr:\n%s", err, c.ExitCode, c.Stderr)
	}
	// A value whose repr fails: the cell's frames, none of the runner's.
	c, err = ss.Run(context.Background(), protocol.Request{Limits: lim, Filename: "<cell>",
		Code: "class B:\n    def __repr__(self):\n        raise RuntimeError('bad repr')\nB()\n"})
	if err != nil || c.ExitCode != 1 || !strings.HasPrefix(string(c.Stderr),
		"Traceback (most recent call last):\n  File \"<cell>\", line 3, in __repr__\n") {
		t.Fatalf("%v exit %d, stderr:\n%s", err, c.ExitCode, c.Stderr)
	}
}

// The least memory a run may have is enough for a native one: the worker compiles
// its seccomp filter before the memory limit (RLIMIT_DATA) is set, which libseccomp's
// allocations would count against, and sets the limit as its last step before the
// exec, when its own mappings (heap, thread stacks) may be past it already (under
// load, a thread the Go runtime started after the limit failed the worker:
// `go test -run 'TestNativeLeastMemory$' -count=300` beside busy loops is the check).
func TestNativeLeastMemory(t *testing.T) {
	t.Parallel()
	res, _ := runNative(t, "print(6 * 7)", func(r *protocol.Request, _ *policy.Policy) {
		r.Limits.MemoryBytes = policy.MinMemoryBytes
	})
	wantOutput(t, res, "42\n")
	if e := res.Enforcement; e == nil || !e.Seccomp.Active || e.Rlimits["DATA"] != policy.MinMemoryBytes {
		t.Fatalf("contract %+v", e)
	}
}

// A fork hook of the guest's (os.register_at_fork) runs inside the window the
// daemon opens for the runner's checkpoint, and its fork takes the window's one
// fork (the hook's of cell 2, and of each cell after): the runner's is refused, and
// the hook's process, not a stopped checkpoint, is killed when the cell's ack comes
// (between cells, pid 1 and the interpreter are the session's only processes); a
// cell past its time then ends the session, saying why.
func TestNativeSessionAtForkHook(t *testing.T) {
	t.Parallel()
	ss := openNativeSession(t)
	lim := protocol.Limits{TimeoutMS: 5000, MaxStdoutBytes: 1 << 20, MaxStderrBytes: 1 << 20}
	c, err := ss.Run(context.Background(), protocol.Request{Limits: lim, Code: `import os, time
forked, busy = [], []
def hook():
    if busy:
        return  # its own fork runs the hooks too
    busy.append(1)
    try:
        if os.fork() == 0:
            time.sleep(3600)
            os._exit(0)
        forked.append("child")
    except OSError as e:
        forked.append(e.errno)
    finally:
        busy.pop()
os.register_at_fork(before=hook)`})
	if err != nil || c.Reason != protocol.Exited || c.ExitCode != 0 {
		t.Fatalf("cell 1: %v %+v %s", err, c.Result, c.Stderr)
	}
	c, err = ss.Run(context.Background(), protocol.Request{Limits: lim, Code: "print(forked)"})
	if err != nil || string(c.Stdout) != "['child']\n" {
		t.Fatalf("the hook's fork: %v %+v %q %s", err, c.Result, c.Stdout, c.Stderr)
	}
	// Between cells, the hook's process is gone: pid 1, the interpreter, and no
	// other process in the session's pid namespace.
	ns, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", ss.PID()))
	if living := settled(ns); len(living) != 2 {
		t.Fatalf("living processes in the session's pid namespace between cells: %v, want 2 (pid 1, the interpreter)", living)
	}
	c, err = ss.Run(context.Background(), protocol.Request{Code: "import time; time.sleep(30)",
		Limits: protocol.Limits{TimeoutMS: 300, MaxStdoutBytes: 1 << 20, MaxStderrBytes: 1 << 20}})
	if err != nil || c.Reason != protocol.Timeout || c.RolledBack || !strings.Contains(strings.Join(c.Diagnostics, " "), "had no checkpoint") {
		t.Fatalf("a cell without its checkpoint: %v %+v", err, c.Result)
	}
	if _, err := ss.Run(context.Background(), protocol.Request{Limits: lim, Code: "1"}); !errors.Is(err, sandbox.ErrSessionLost) {
		t.Fatalf("after it: %v", err)
	}
}

// A native cell's limits run from its frame, not from the runner's ack: an at-fork
// hook that sleeps or spins before the checkpoint's fork is held to the cell's
// wall clock and CPU time (and the session, its checkpoint not taken, is lost).
func TestNativeSessionLimitsBeforeTheAck(t *testing.T) {
	t.Parallel()
	for name, hook := range map[string]string{
		"sleep": "time.sleep(60)",
		"spin":  "end = time.process_time() + 60\n    while time.process_time() < end: pass",
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ss := openNativeSession(t)
			lim := protocol.Limits{TimeoutMS: 5000, MaxStdoutBytes: 1 << 20, MaxStderrBytes: 1 << 20}
			if c, err := ss.Run(context.Background(), protocol.Request{Limits: lim,
				Code: "import os, time\ndef hook():\n    " + hook + "\nos.register_at_fork(before=hook)"}); err != nil || c.ExitCode != 0 {
				t.Fatalf("cell 1: %v %+v %s", err, c.Result, c.Stderr)
			}
			began := time.Now()
			c, err := ss.Run(context.Background(), protocol.Request{Code: "print('ran')",
				Limits: protocol.Limits{TimeoutMS: 800, CPUMS: 400, MaxStdoutBytes: 1 << 20, MaxStderrBytes: 1 << 20}})
			// Its limit, then interruptGrace (2 s) for an ack that never comes.
			if d := time.Since(began); err != nil || (c.Reason != protocol.Timeout && c.Reason != protocol.CPULimit) || d > 10*time.Second {
				t.Fatalf("a cell whose hook holds it before the ack: %v %+v after %s", err, c.Result, d)
			}
		})
	}
}

// A cell stopped before its ack (its limit, or a cancel, while the checkpoint's
// fork and the guest's at-fork hooks run) is rolled back once the ack comes, not
// the session lost; one whose context ended before it was sent never runs (the
// state is as before it: rolled back, as the API says of any stopped cell).
func TestNativeSessionStoppedBeforeTheAck(t *testing.T) {
	t.Parallel()
	ss := openNativeSession(t)
	lim := protocol.Limits{TimeoutMS: 10_000, MaxStdoutBytes: 1 << 20, MaxStderrBytes: 1 << 20}
	value := func(ctx context.Context, code string) sandbox.Cell {
		t.Helper()
		c, err := ss.Run(ctx, protocol.Request{Limits: lim, Code: code})
		if err != nil {
			t.Fatalf("%q: %v", code, err)
		}
		return c
	}
	value(context.Background(), "import os, time\nx = 1\nos.register_at_fork(before=lambda: time.sleep(0.5))")
	c, err := ss.Run(context.Background(), protocol.Request{Code: "x = 2",
		Limits: protocol.Limits{TimeoutMS: 100, MaxStdoutBytes: 1 << 20, MaxStderrBytes: 1 << 20}})
	if err != nil || c.Reason != protocol.Timeout || !c.RolledBack {
		t.Fatalf("a cell past its time before its ack: %v %+v", err, c.Result)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() { time.Sleep(100 * time.Millisecond); cancel() }()
	if c := value(ctx, "x = 3"); c.Reason != protocol.Cancelled || !c.RolledBack {
		t.Fatalf("a cell cancelled before its ack: %+v", c.Result)
	}
	if c := value(ctx, "x = 4"); c.Reason != protocol.Cancelled || !c.RolledBack || len(c.Stdout) != 0 {
		t.Fatalf("a cell cancelled before it was sent: %+v", c.Result)
	}
	if c := value(context.Background(), "x"); c.Value != "1" {
		t.Fatalf("after them: %+v value %q stderr %s", c.Result, c.Value, c.Stderr)
	}
}

// The descriptors the runner ends a cell on are its own: a cell that redirects
// stdout and stderr and closes the control channel's usual descriptor (and the
// checkpoint's pipe) loses its own output, not its session.
func TestNativeSessionRedirectsItsStreams(t *testing.T) {
	t.Parallel()
	ss := openNativeSession(t)
	lim := protocol.Limits{TimeoutMS: 10_000, MaxStdoutBytes: 1 << 20, MaxStderrBytes: 1 << 20}
	c, err := ss.Run(context.Background(), protocol.Request{Limits: lim, Code: `import os
n = os.open("/dev/null", os.O_WRONLY)
os.dup2(n, 1)
os.dup2(n, 2)
os.closerange(3, 10)
x = 5
print("to /dev/null")`})
	if err != nil || c.Reason != protocol.Exited || c.ExitCode != 0 || len(c.Stdout) != 0 {
		t.Fatalf("the cell: %v %+v stdout %q", err, c.Result, c.Stdout)
	}
	for range 2 {
		if c, err := ss.Run(context.Background(), protocol.Request{Limits: lim, Code: "x"}); err != nil || c.Value != "5" {
			t.Fatalf("after it: %v %+v value %q", err, c.Result, c.Value)
		}
	}
	c, err = ss.Run(context.Background(), protocol.Request{Code: "x = 6\nimport time; time.sleep(30)",
		Limits: protocol.Limits{TimeoutMS: 300, MaxStdoutBytes: 1 << 20, MaxStderrBytes: 1 << 20}})
	if err != nil || !c.RolledBack {
		t.Fatalf("a rollback after it: %v %+v", err, c.Result)
	}
	if c, err := ss.Run(context.Background(), protocol.Request{Limits: lim, Code: "x"}); err != nil || c.Value != "5" {
		t.Fatalf("after the rollback: %v %+v value %q", err, c.Result, c.Value)
	}
}

// The runner's descriptors per cell are given back: after hundreds of cells the
// interpreter holds as many as after the first (each cell's checkpoint pipe is
// closed, whether or not its checkpoint was ended already), and a cell that closes
// low descriptors and opens files of its own finds them untouched by the next
// cell's checkpoint.
func TestNativeSessionKeepsItsDescriptors(t *testing.T) {
	t.Parallel()
	ss := openNativeSession(t)
	lim := protocol.Limits{TimeoutMS: 10_000, MaxStdoutBytes: 1 << 20, MaxStderrBytes: 1 << 20}
	run := func(code string) sandbox.Cell {
		t.Helper()
		c, err := ss.Run(context.Background(), protocol.Request{Limits: lim, Code: code})
		if err != nil || c.Reason != protocol.Exited || c.ExitCode != 0 {
			t.Fatalf("%q: %v %+v %s", code, err, c.Result, c.Stderr)
		}
		return c
	}
	run("import os\nx = 0")
	first := run("len(os.listdir('/proc/self/fd'))").Value
	for range 300 {
		run("x += 1")
	}
	if c := run("x, len(os.listdir('/proc/self/fd'))"); c.Value != "(300, "+first+")" {
		t.Fatalf("after 300 cells: %q, descriptors after the first %s", c.Value, first)
	}
	run("os.closerange(3, 10)\nfs = [open('/tmp/g%d' % i, 'w+') for i in range(6)]")
	if c := run("for f in fs:\n    f.write('data'); f.flush(); f.seek(0)\n[f.read() for f in fs] == ['data'] * 6"); c.Value != "True" {
		t.Fatalf("files the cell opened: %q %s", c.Value, c.Stderr)
	}
}

// A session closed during a cell ends it as cancelled, saying so (nothing of how
// its processes died, no host path), and is lost from then on.
func TestNativeSessionClosedDuringACell(t *testing.T) {
	t.Parallel()
	ss := openNativeSession(t)
	go func() { time.Sleep(500 * time.Millisecond); ss.Close() }()
	c, err := ss.Run(context.Background(), protocol.Request{Code: "import time; time.sleep(30)",
		Limits: protocol.Limits{TimeoutMS: 20_000, MaxStdoutBytes: 1 << 20, MaxStderrBytes: 1 << 20}})
	if err != nil || c.Reason != protocol.Cancelled || c.RolledBack || strings.Join(c.Diagnostics, " ") != "the session was closed during the cell" {
		t.Fatalf("a cell its session's close ended: %v %+v", err, c.Result)
	}
	if _, err := ss.Run(context.Background(), protocol.Request{Code: "1",
		Limits: protocol.Limits{TimeoutMS: 5000, MaxStdoutBytes: 1 << 20, MaxStderrBytes: 1 << 20}}); !errors.Is(err, sandbox.ErrSessionLost) {
		t.Fatalf("after it: %v", err)
	}
}

// The session's CPU time in all is kept across the interpreters its checkpoints
// replace (RLIMIT_CPU counts one process, and each starts at zero): past it the
// session is lost, saying so, however each cell stays within its own limit.
func TestNativeSessionCPUBackstop(t *testing.T) {
	defer sandbox.SetSessionCPU(2 * time.Second)()
	ss := openNativeSession(t)
	lim := protocol.Limits{TimeoutMS: 20_000, CPUMS: 1500, MaxStdoutBytes: 1 << 20, MaxStderrBytes: 1 << 20}
	spin := "import time\nend = time.process_time() + 0.8\nwhile time.process_time() < end: pass"
	for i := range 6 {
		c, err := ss.Run(context.Background(), protocol.Request{Limits: lim, Code: spin})
		if errors.Is(err, sandbox.ErrSessionLost) {
			if i < 2 || !strings.Contains(err.Error(), "CPU time in all") {
				t.Fatalf("cell %d: %v", i, err)
			}
			return
		}
		if err != nil || c.Reason == protocol.CPULimit && !strings.Contains(strings.Join(c.Diagnostics, " "), "CPU time in all") {
			t.Fatalf("cell %d: %v %+v", i, err, c.Result)
		}
	}
	t.Fatal("six cells of 0.8 s each in a session of 2 s of CPU time")
}

// A kept checkpoint runs only as the interpreter: one the cell continues itself (a
// signal) is ended (or, continued before the daemon has kept it, not kept), and a
// rollback then has nothing to return to: the session is lost, saying why.
func TestNativeSessionCheckpointContinued(t *testing.T) {
	t.Parallel()
	ss := openNativeSession(t)
	c, err := ss.Run(context.Background(), protocol.Request{Code: `import os, signal, time
kids = open("/proc/self/task/%d/children" % os.getpid()).read().split()
for k in kids:
    for _ in range(200):  # once it has stopped itself
        if open("/proc/%s/stat" % k).read().rsplit(")", 1)[1].split()[0] == "T":
            break
        time.sleep(0.01)
    os.kill(int(k), signal.SIGCONT)
time.sleep(30)`, Limits: protocol.Limits{TimeoutMS: 1000, MaxStdoutBytes: 1 << 20, MaxStderrBytes: 1 << 20}})
	if err != nil || c.Reason != protocol.Timeout || c.RolledBack || !strings.Contains(strings.Join(c.Diagnostics, " "), "checkpoint") {
		t.Fatalf("a cell that continued its checkpoint: %v %+v rolled back %v stdout %q stderr %q", err, c.Result, c.RolledBack, c.Stdout, c.Stderr)
	}
	if _, err := ss.Run(context.Background(), protocol.Request{Code: "1",
		Limits: protocol.Limits{TimeoutMS: 5000, MaxStdoutBytes: 1 << 20, MaxStderrBytes: 1 << 20}}); !errors.Is(err, sandbox.ErrSessionLost) {
		t.Fatalf("after it: %v", err)
	}
}

// A checkpoint whose main thread exits while another thread of it runs on (an
// at-fork hook in the child) shows as a zombie, and is not one: it is found among
// the living and killed at the cell's ack, so that between cells the session's pid
// namespace holds pid 1 and the interpreter only.
func TestNativeSessionCheckpointWithoutItsMainThread(t *testing.T) {
	t.Parallel()
	ss := openNativeSession(t)
	lim := protocol.Limits{TimeoutMS: 10000, MaxStdoutBytes: 1 << 20, MaxStderrBytes: 1 << 20}
	c, err := ss.Run(context.Background(), protocol.Request{Limits: lim, Code: `import ctypes, os, platform, threading, time
SYS_exit = {"x86_64": 60, "aarch64": 93}[platform.machine()]
def hook():
    threading.Thread(target=time.sleep, args=(3600,)).start()
    ctypes.CDLL(None).syscall(SYS_exit, 0)  # the main thread only
os.register_at_fork(after_in_child=hook)`})
	if err != nil || c.Reason != protocol.Exited || c.ExitCode != 0 {
		t.Fatalf("cell 1: %v %+v %s", err, c.Result, c.Stderr)
	}
	c, err = ss.Run(context.Background(), protocol.Request{Limits: lim, Code: "print('cell 2')"})
	if err != nil || string(c.Stdout) != "cell 2\n" {
		t.Fatalf("cell 2: %v %+v %q %s", err, c.Result, c.Stdout, c.Stderr)
	}
	ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", ss.PID()))
	if err != nil {
		t.Fatal(err)
	}
	if living := settled(ns); len(living) != 2 {
		t.Fatalf("living processes in the session's pid namespace between cells: %v, want 2 (pid 1, the interpreter)", living)
	}
}

// settled is livingIn(ns) once it lists at most 2 processes (pid 1 and the
// interpreter), or after 5 s.
func settled(ns string) []string {
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if living := livingIn(ns); len(living) <= 2 || time.Now().After(deadline) {
			return living
		}
	}
}

// livingIn lists the processes of pid namespace ns (a /proc/PID/ns/pid link) that
// have a thread which has not exited, with the state of each thread.
func livingIn(ns string) []string {
	var out []string
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		tasks, _ := os.ReadDir("/proc/" + p.Name() + "/task")
		var states []string
		alive := false
		for _, task := range tasks {
			dir := "/proc/" + p.Name() + "/task/" + task.Name()
			st, err := os.ReadFile(dir + "/stat")
			i := bytes.LastIndexByte(st, ')')
			if err != nil || i < 0 || i+2 >= len(st) {
				continue
			}
			states = append(states, string(st[i+2]))
			if l, err := os.Readlink(dir + "/ns/pid"); err == nil && l == ns && st[i+2] != 'Z' && st[i+2] != 'X' {
				alive = true
			}
		}
		if alive {
			out = append(out, p.Name()+" "+strings.Join(states, ""))
		}
	}
	return out
}

// An interpreter that a cell's thread ends just after the cell's report is never
// taken for a live one: that cell is rolled back (its checkpoint carries on), or,
// if it ended after the daemon looked, the next cell finds the session lost and
// says why.
func TestNativeSessionEndsAfterItsReport(t *testing.T) {
	t.Parallel()
	ss := openNativeSession(t)
	lim := protocol.Limits{TimeoutMS: 5000, MaxStdoutBytes: 1 << 20, MaxStderrBytes: 1 << 20}
	if _, err := ss.Run(context.Background(), protocol.Request{Limits: lim, Code: "x = 1"}); err != nil {
		t.Fatal(err)
	}
	c, err := ss.Run(context.Background(), protocol.Request{Limits: lim, Code: `import os, threading, time
x = 2
threading.Thread(target=lambda: (time.sleep(0.001), os._exit(0))).start()`})
	if err != nil {
		t.Fatal(err)
	}
	c2, err := ss.Run(context.Background(), protocol.Request{Limits: lim, Code: "x"})
	switch {
	case c.RolledBack:
		if err != nil || c2.Value != "1" {
			t.Fatalf("rolled back, then: %v %q", err, c2.Value)
		}
	case errors.Is(err, sandbox.ErrSessionLost):
		if !strings.Contains(err.Error(), "ended between cells") {
			t.Fatalf("lost without its reason: %v", err)
		}
	default:
		t.Fatalf("the interpreter's end went unseen: %+v, then %v %+v %q", c.Result, err, c2.Result, c2.Value)
	}
}

// withVersion is code with VERSION replaced by this build's protocol.Version (a
// program that forges the runner's frames).
func withVersion(code string) string {
	return strings.ReplaceAll(code, "VERSION", strconv.Itoa(protocol.Version))
}
