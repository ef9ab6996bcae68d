package sandbox_test

// The escape suite. A test-only worker entry (escapeCommand) is hardened by the real
// worker code (worker.Serve) and then, instead of running Python, attempts escapes
// with raw system calls, as a guest that had broken out of wasmtime would. Every
// attempt runs under every layer together, under each layer alone and under the base
// hardening only (rlimits, no capabilities, no_new_privs), and the test prints which
// layer stops what.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/sandcell/sandcell/bundle/bundletest"
	"github.com/sandcell/sandcell/sandbox"
	"github.com/sandcell/sandcell/sandbox/engine"
	"github.com/sandcell/sandcell/sandbox/policy"
	"github.com/sandcell/sandcell/sandbox/protocol"
	"github.com/sandcell/sandcell/sandbox/worker"
)

// escapeCommand is the argv[1] of the test-only worker entry (see TestMain).
const escapeCommand = "__escape"

// target is what the probes aim at, passed to the escape worker as JSON in Args[0].
type target struct {
	HostDir   string `json:"host_dir"`   // outside the workspace; holds "secret" and "link"
	ParentPID int    `json:"parent_pid"` // the test process (the worker's parent)
	TCPPort   int    `json:"tcp_port"`   // 127.0.0.1 listener of the test
	UDPPort   int    `json:"udp_port"`   // 127.0.0.1 UDP socket of the test
	UnixPath  string `json:"unix_path"`  // path-named Unix socket listener of the test
	Abstract  string `json:"abstract"`   // abstract Unix socket listener of the test
	Workspace string `json:"workspace"`  // filled in by the worker: where /ws is reachable
}

const secretText = "host secret\n"

// probe is one escape attempt: it returns nil when the escape worked (the sandbox
// failed), and the error that stopped it otherwise.
type probe struct {
	name string
	try  func(t *target) error
}

var errNotEscaped = fmt.Errorf("no escape")

func sysErr(e unix.Errno) error {
	if e == 0 {
		return nil
	}
	return e
}

// openRead opens path and returns nil if it could read something from it.
func openRead(path string) error {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	buf := make([]byte, 64)
	_, err = unix.Read(fd, buf)
	return err
}

func socketProbe(domain, typ, proto int) func(*target) error {
	return func(*target) error {
		fd, err := unix.Socket(domain, typ|unix.SOCK_CLOEXEC, proto)
		if err == nil {
			unix.Close(fd)
		}
		return err
	}
}

// probes: at least 30 attempts, each aimed at something outside the workspace.
var probes = []probe{
	{"read /etc/passwd", func(*target) error { return openRead("/etc/passwd") }},
	{"read a host file", func(t *target) error { return openRead(filepath.Join(t.HostDir, "secret")) }},
	{"stat /etc/passwd", func(*target) error { var st unix.Stat_t; return unix.Stat("/etc/passwd", &st) }},
	{"list the host root", func(*target) error {
		fd, err := unix.Open("/", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		buf := make([]byte, 8192)
		n, err := unix.Getdents(fd, buf)
		if err != nil {
			return err
		}
		if bytes.Contains(buf[:n], []byte("etc\x00")) || bytes.Contains(buf[:n], []byte("usr\x00")) {
			return nil
		}
		return fmt.Errorf("%w: / is the worker's own root", errNotEscaped)
	}},
	{"readlink a host symlink", func(t *target) error {
		_, err := os.Readlink(filepath.Join(t.HostDir, "link"))
		return err
	}},
	{"read /proc/self/environ", func(*target) error { return openRead("/proc/self/environ") }},
	{"read /proc/1/root/etc/passwd", func(*target) error { return openRead("/proc/1/root/etc/passwd") }},
	{"read /sys", func(*target) error { return openRead("/sys/kernel/mm/transparent_hugepage/enabled") }},
	{"write a host file", func(t *target) error {
		fd, err := unix.Open(filepath.Join(t.HostDir, "pwned"), unix.O_CREAT|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
		if err == nil {
			unix.Close(fd)
		}
		return err
	}},
	{"mkdir on the host", func(t *target) error { return unix.Mkdir(filepath.Join(t.HostDir, "pwned.d"), 0o755) }},
	{"symlink out of /ws", func(t *target) error {
		link := filepath.Join(t.Workspace, "out-link")
		if err := unix.Symlink(filepath.Join(t.HostDir, "secret"), link); err != nil {
			return err
		}
		return openRead(link)
	}},
	{"relative symlink out of /ws", func(t *target) error {
		link := filepath.Join(t.Workspace, "up-link")
		if err := unix.Symlink(strings.Repeat("../", 16)+"etc/passwd", link); err != nil {
			return err
		}
		return openRead(link)
	}},
	{"hard link a host file into /ws", func(t *target) error {
		return unix.Link(filepath.Join(t.HostDir, "secret"), filepath.Join(t.Workspace, "hard-link"))
	}},
	{".. out of /ws", func(t *target) error {
		return openRead(t.Workspace + "/" + strings.Repeat("../", 16) + "etc/passwd")
	}},
	{".. from every open fd", func(*target) error {
		var last error = unix.EBADF
		for fd := 0; fd < 64; fd++ {
			nfd, err := unix.Openat(fd, strings.Repeat("../", 16)+"etc/passwd", unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err == nil {
				unix.Close(nfd)
				return nil
			}
			if err != unix.EBADF && err != unix.ENOTDIR {
				last = err
			}
		}
		return last
	}},
	{"write a held file via /proc/self/fd", func(*target) error {
		// Every descriptor the worker holds (the module above all: its code runs in
		// every worker), reopened for writing; a writable shared mapping is the
		// proof, and nothing is written.
		var last error = unix.ENOENT
		for fd := 0; fd < 64; fd++ {
			nfd, err := unix.Open(fmt.Sprintf("/proc/self/fd/%d", fd), unix.O_RDWR|unix.O_CLOEXEC, 0)
			if err != nil {
				if err != unix.ENOENT {
					last = err
				}
				continue
			}
			var st unix.Stat_t
			unix.Fstat(nfd, &st)
			if st.Mode&unix.S_IFMT == unix.S_IFREG && st.Size > 0 {
				b, err := unix.Mmap(nfd, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
				if err == nil {
					unix.Munmap(b)
					unix.Close(nfd)
					return nil
				}
				last = err
			}
			unix.Close(nfd)
		}
		return last
	}},
	{"socket AF_INET", socketProbe(unix.AF_INET, unix.SOCK_STREAM, 0)},
	{"socket AF_INET6", socketProbe(unix.AF_INET6, unix.SOCK_DGRAM, 0)},
	{"socket AF_UNIX", socketProbe(unix.AF_UNIX, unix.SOCK_STREAM, 0)},
	{"socket AF_NETLINK", socketProbe(unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_ROUTE)},
	{"socket AF_PACKET", socketProbe(unix.AF_PACKET, unix.SOCK_RAW, 0)},
	{"socket AF_VSOCK", socketProbe(unix.AF_VSOCK, unix.SOCK_STREAM, 0)},
	{"socket AF_ALG", socketProbe(unix.AF_ALG, unix.SOCK_SEQPACKET, 0)},
	{"socketpair", func(*target) error {
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err == nil {
			unix.Close(fds[0])
			unix.Close(fds[1])
		}
		return err
	}},
	{"connect to a host TCP port", func(t *target) error {
		return dial(unix.AF_INET, unix.SOCK_STREAM, &unix.SockaddrInet4{Port: t.TCPPort, Addr: [4]byte{127, 0, 0, 1}})
	}},
	{"send UDP to the host", func(t *target) error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		return unix.Sendto(fd, []byte("escaped"), 0, &unix.SockaddrInet4{Port: t.UDPPort, Addr: [4]byte{127, 0, 0, 1}})
	}},
	{"bind and listen on TCP", func(*target) error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		if err := unix.Bind(fd, &unix.SockaddrInet4{Port: 0}); err != nil {
			return err
		}
		return unix.Listen(fd, 1)
	}},
	{"connect to a host Unix socket", func(t *target) error {
		return dial(unix.AF_UNIX, unix.SOCK_STREAM, &unix.SockaddrUnix{Name: t.UnixPath})
	}},
	{"connect to an abstract Unix socket", func(t *target) error {
		return dial(unix.AF_UNIX, unix.SOCK_STREAM, &unix.SockaddrUnix{Name: "@" + t.Abstract})
	}},
	{"ptrace the parent", func(t *target) error {
		// PTRACE_SEIZE, not ATTACH: it does not stop the parent if it works, and the
		// parent is detached when this worker exits.
		_, _, e := unix.Syscall6(unix.SYS_PTRACE, unix.PTRACE_SEIZE, uintptr(t.ParentPID), 0, 0, 0, 0)
		return sysErr(e)
	}},
	{"process_vm_readv the parent", func(t *target) error {
		buf := make([]byte, 8)
		local := []unix.Iovec{{Base: &buf[0], Len: 8}}
		remote := []unix.RemoteIovec{{Base: 0x10000, Len: 8}}
		_, err := unix.ProcessVMReadv(t.ParentPID, local, remote, 0)
		if err == unix.EFAULT {
			return nil // access was granted; only the address was wrong
		}
		return err
	}},
	{"kill(2) the parent", func(t *target) error { return unix.Kill(t.ParentPID, 0) }},
	{"tgkill(2) the parent", func(t *target) error { return unix.Tgkill(t.ParentPID, t.ParentPID, 0) }},
	{"fork", func(*target) error {
		pid, _, e := unix.RawSyscall6(unix.SYS_CLONE, uintptr(unix.SIGCHLD), 0, 0, 0, 0, 0)
		if e != 0 {
			return e
		}
		if pid == 0 {
			unix.RawSyscall(unix.SYS_EXIT_GROUP, 0, 0, 0)
		}
		var ws unix.WaitStatus
		unix.Wait4(int(pid), &ws, 0, nil)
		return nil
	}},
	{"fork flood (300 live processes)", func(*target) error {
		var pids []int
		defer func() {
			for _, p := range pids {
				unix.Kill(p, unix.SIGKILL)
				var ws unix.WaitStatus
				unix.Wait4(p, &ws, 0, nil)
			}
		}()
		for i := 0; i < 300; i++ {
			pid, _, e := unix.RawSyscall6(unix.SYS_CLONE, uintptr(unix.SIGCHLD), 0, 0, 0, 0, 0)
			if e != 0 {
				return fmt.Errorf("after %d processes: %w", i, e)
			}
			if pid == 0 {
				for {
					unix.RawSyscall(unix.SYS_PAUSE, 0, 0, 0)
				}
			}
			pids = append(pids, int(pid))
		}
		return nil
	}},
	{"unshare a network namespace", func(*target) error { return unix.Unshare(unix.CLONE_NEWNET) }},
	{"setns into pid 1's network", func(*target) error {
		fd, err := unix.Open("/proc/1/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		return unix.Setns(fd, unix.CLONE_NEWNET)
	}},
	{"mount a tmpfs", func(t *target) error {
		dir := filepath.Join(t.Workspace, "mnt")
		unix.Mkdir(dir, 0o755)
		return unix.Mount("tmpfs", dir, "tmpfs", 0, "")
	}},
	{"chroot", func(t *target) error { return unix.Chroot(t.Workspace) }},
	{"keyctl", func(*target) error {
		_, err := unix.KeyctlJoinSessionKeyring("sandcell-escape")
		return err
	}},
	{"bpf map", func(*target) error {
		attr := [5]uint32{2 /* BPF_MAP_TYPE_ARRAY */, 4, 4, 1, 0}
		fd, _, e := unix.Syscall(unix.SYS_BPF, 0 /* BPF_MAP_CREATE */, uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr))
		if e == 0 {
			unix.Close(int(fd))
		}
		return sysErr(e)
	}},
	{"perf_event_open", func(*target) error {
		attr := unix.PerfEventAttr{Type: unix.PERF_TYPE_SOFTWARE, Config: unix.PERF_COUNT_SW_CPU_CLOCK,
			Size: uint32(unsafe.Sizeof(unix.PerfEventAttr{})), Bits: unix.PerfBitDisabled | unix.PerfBitExcludeKernel}
		fd, err := unix.PerfEventOpen(&attr, 0, -1, -1, unix.PERF_FLAG_FD_CLOEXEC)
		if err == nil {
			unix.Close(fd)
		}
		return err
	}},
	{"userfaultfd", func(*target) error {
		fd, _, e := unix.Syscall(unix.SYS_USERFAULTFD, unix.O_CLOEXEC|1 /* UFFD_USER_MODE_ONLY */, 0, 0)
		if e == 0 {
			unix.Close(int(fd))
		}
		return sysErr(e)
	}},
	{"io_uring_setup", func(*target) error {
		params := make([]byte, 120)
		fd, _, e := unix.Syscall(unix.SYS_IO_URING_SETUP, 4, uintptr(unsafe.Pointer(&params[0])), 0)
		if e == 0 {
			unix.Close(int(fd))
		}
		return sysErr(e)
	}},
	{"personality(READ_IMPLIES_EXEC)", func(*target) error {
		_, _, e := unix.Syscall(unix.SYS_PERSONALITY, 0x0400000 /* READ_IMPLIES_EXEC */, 0, 0)
		return sysErr(e)
	}},
	{"a fresh executable mapping", func(*target) error {
		b, err := unix.Mmap(-1, 0, 4096, unix.PROT_READ|unix.PROT_WRITE|unix.PROT_EXEC, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
		if err == nil {
			unix.Munmap(b)
		}
		return err
	}},
	{"a huge mapping (1 TiB)", func(*target) error {
		p, _, e := unix.Syscall6(unix.SYS_MMAP, 0, 1<<40, unix.PROT_READ|unix.PROT_WRITE,
			unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE, ^uintptr(0), 0)
		if e == 0 {
			unix.Syscall(unix.SYS_MUNMAP, p, 1<<40, 0)
		}
		return sysErr(e)
	}},
	{"raise an rlimit", func(*target) error {
		return unix.Setrlimit(unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: 1 << 20, Max: 1 << 20})
	}},
	// The kernel opens and checks the file (seccomp, Landlock's execute right, the
	// mount's noexec, existence) before it reads argv, so a bad argv pointer answers
	// EFAULT exactly when the exec would have gone ahead, without replacing this
	// process.
	{"execve /bin/sh", func(*target) error {
		path, _ := unix.BytePtrFromString("/bin/sh")
		_, _, e := unix.Syscall(unix.SYS_EXECVE, uintptr(unsafe.Pointer(path)), 1, 0)
		if e == unix.EFAULT {
			return nil
		}
		return sysErr(e)
	}},
}

func dial(domain, typ int, sa unix.Sockaddr) error {
	fd, err := unix.Socket(domain, typ|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Connect(fd, sa)
}

// escapeBody runs every probe and writes name -> "ESCAPED" or the stopping error, as
// JSON on stdout.
func escapeBody(req *protocol.Request, env *worker.Env) protocol.Report {
	var t target
	if len(req.Args) != 1 || json.Unmarshal([]byte(req.Args[0]), &t) != nil {
		return protocol.Report{ExitCode: 2, Reason: protocol.InternalError, Diagnostics: []string{"bad target"}}
	}
	t.Workspace = env.Workspace
	out := map[string]string{}
	for _, p := range probes {
		if err := p.try(&t); err == nil {
			out[p.name] = "ESCAPED"
		} else {
			out[p.name] = err.Error()
		}
	}
	b, _ := json.Marshal(out)
	os.Stdout.Write(b)
	return protocol.Report{ExitCode: 0, Reason: protocol.Exited}
}

// configurations: the columns of the matrix.
var configurations = []struct {
	name string
	make func(protocol.Limits) protocol.Hardening
}{
	{"base", func(l protocol.Limits) protocol.Hardening { return layers(l, false, false, false) }},
	{"seccomp", func(l protocol.Limits) protocol.Hardening { return layers(l, true, false, false) }},
	{"landlock", func(l protocol.Limits) protocol.Hardening { return layers(l, false, true, false) }},
	{"namespaces", func(l protocol.Limits) protocol.Hardening { return layers(l, false, false, true) }},
	{"all", func(l protocol.Limits) protocol.Hardening { return policy.Default().Hardening(l) }},
}

// layers is the default hardening with only the named layers on, each required.
func layers(l protocol.Limits, sc, ll, ns bool) protocol.Hardening {
	h := policy.Default().Hardening(l)
	h.Require = []string{protocol.LayerRlimits, protocol.LayerNoNewPrivs, protocol.LayerCapabilities}
	if !sc {
		h.Seccomp = nil
	} else {
		h.Require = append(h.Require, protocol.LayerSeccomp)
	}
	h.Landlock = ll
	if ll {
		h.Require = append(h.Require, protocol.LayerLandlock)
	}
	h.Namespaces = ns
	if ns {
		for l := range protocol.Namespaces() {
			h.Require = append(h.Require, l)
		}
	}
	return h
}

// stoppedAlone says which single layers must, by design, stop each probe on their
// own (beyond "all", which must stop every probe). The printed matrix shows the rest.
var stoppedAlone = map[string][]string{
	"read /etc/passwd":                    {"landlock", "namespaces"},
	"read a host file":                    {"landlock", "namespaces"},
	"list the host root":                  {"landlock", "namespaces"},
	"read /proc/1/root/etc/passwd":        {"landlock", "namespaces"},
	"write a host file":                   {"landlock", "namespaces"},
	"mkdir on the host":                   {"landlock", "namespaces"},
	"symlink out of /ws":                  {"landlock", "namespaces"},
	"relative symlink out of /ws":         {"landlock", "namespaces"},
	"hard link a host file into /ws":      {"landlock", "namespaces"},
	".. out of /ws":                       {"landlock", "namespaces"},
	".. from every open fd":               {"landlock", "namespaces"},
	"socket AF_INET":                      {"seccomp"},
	"socket AF_UNIX":                      {"seccomp"},
	"connect to a host TCP port":          {"seccomp", "landlock", "namespaces"},
	"connect to an abstract Unix socket":  {"seccomp", "landlock", "namespaces"},
	"connect to a host Unix socket":       {"seccomp", "namespaces"},
	"send UDP to the host":                {"seccomp", "namespaces"},
	"ptrace the parent":                   {"seccomp", "landlock", "namespaces"},
	"process_vm_readv the parent":         {"seccomp", "landlock", "namespaces"},
	"kill(2) the parent":                  {"seccomp", "landlock", "namespaces"},
	"tgkill(2) the parent":                {"landlock", "namespaces"},
	"fork":                                {"seccomp"},
	"fork flood (300 live processes)":     {"seccomp"}, // and namespaces when not root: see TestEscapeMatrix
	"execve /bin/sh":                      {"seccomp", "landlock", "namespaces"},
	"mount a tmpfs":                       {"base", "seccomp", "landlock", "namespaces"},
	"chroot":                              {"base", "seccomp", "landlock", "namespaces"},
	"unshare a network namespace":         {"base", "seccomp", "landlock", "namespaces"},
	"keyctl":                              {"seccomp"},
	"write a held file via /proc/self/fd": {"base", "seccomp", "landlock", "namespaces"},
	"stat /etc/passwd":                    {"namespaces"},
	"readlink a host symlink":             {"namespaces"},
	"read /sys":                           {"landlock", "namespaces"},
	"socket AF_INET6":                     {"seccomp"},
	"socket AF_NETLINK":                   {"seccomp"},
	"socket AF_VSOCK":                     {"seccomp"},
	"socketpair":                          {"seccomp"},
	"bind and listen on TCP":              {"seccomp", "landlock"},
	"setns into pid 1's network":          {"base", "seccomp", "landlock", "namespaces"},
	"perf_event_open":                     {"seccomp"},
	"userfaultfd":                         {"seccomp"},
	"personality(READ_IMPLIES_EXEC)":      {"seccomp"},
	"io_uring_setup":                      {"seccomp"},
	"a fresh executable mapping":          {"seccomp"},
	"a huge mapping (1 TiB)":              {"seccomp"},
	"raise an rlimit":                     {"base", "seccomp", "landlock", "namespaces"},
}

// TestEscapeMatrix is the escape suite (see the file comment).
// runEscape runs the escape worker with the hardening make gives, in a host
// directory of its own named name, and returns each probe's outcome.
func runEscape(t *testing.T, tg *target, name string, make func(protocol.Limits) protocol.Hardening,
	spawner func(protocol.Request) (*sandbox.Spawner, func())) (map[string]string, protocol.Result) {
	t.Helper()
	// A host directory of its own per configuration, so that what one lets
	// through does not make the next one look stopped (EEXIST).
	tg.HostDir = filepath.Join(tg.HostDir, name)
	os.Mkdir(tg.HostDir, 0o755)
	os.WriteFile(filepath.Join(tg.HostDir, "secret"), []byte(secretText), 0o644)
	os.Symlink("secret", filepath.Join(tg.HostDir, "link"))
	arg, _ := json.Marshal(tg)
	tg.HostDir = filepath.Dir(tg.HostDir)
	ws := t.TempDir()
	limits := policy.Default().Default
	limits.TimeoutMS = 60_000
	req := protocol.Request{Code: "pass", Args: []string{string(arg)}, Workspace: ws, Limits: limits,
		ModulePath: bundletest.Module(t, false), EpochlessModulePath: bundletest.VariantModule(t, engine.Epochless),
		LibDir: bundletest.LibDir(t), Hardening: make(limits)}
	sp, done := spawner(req)
	res, err := sp.Run(context.Background(), req)
	done()
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if res.Reason != protocol.Exited || res.ExitCode != 0 {
		t.Fatalf("%s: escape worker ended %s %d: %v\nstdout: %s\nstderr: %.3000s", name, res.Reason, res.ExitCode,
			res.Diagnostics, res.Stdout, res.Stderr)
	}
	var got map[string]string
	if err := json.Unmarshal(res.Stdout, &got); err != nil {
		t.Fatalf("%s: %v: %s", name, err, res.Stdout)
	}
	return got, res
}

// TestEscapeWithoutPidNamespace: every probe stays stopped when the worker has every
// layer but a pid namespace (as under podman's masked /proc), signals to the parent
// included (Landlock's signal scope).
func TestEscapeWithoutPidNamespace(t *testing.T) {
	tg, check := escapeTargets(t)
	got, res := runEscape(t, &tg, "all", func(l protocol.Limits) protocol.Hardening {
		h := policy.Default().Hardening(l)
		h.Require = slices.DeleteFunc(slices.Clone(protocol.Layers()), func(l string) bool { return l == protocol.LayerPidNS })
		return h
	}, func(protocol.Request) (*sandbox.Spawner, func()) {
		sp := sandbox.NewSpawner()
		sp.Command = escapeCommand
		sandbox.WithoutPidNamespace(sp, "test")
		return sp, func() {}
	})
	check()
	if res.Enforcement.Active(protocol.LayerPidNS) {
		t.Fatal("the worker had a pid namespace")
	}
	for _, p := range probes {
		if got[p.name] == "ESCAPED" {
			t.Errorf("%q escaped without a pid namespace", p.name)
		}
	}
}

func TestEscapeMatrix(t *testing.T) {
	if len(probes) < 30 {
		t.Fatalf("only %d probes", len(probes))
	}
	tg, check := escapeTargets(t)
	results := map[string]map[string]string{}
	for _, c := range configurations {
		var res protocol.Result
		results[c.name], res = runEscape(t, &tg, c.name, c.make, func(req protocol.Request) (*sandbox.Spawner, func()) {
			return spawnerFor(t, req, escapeCommand)
		})
		if c.name == "all" {
			if miss := res.Enforcement.Missing(protocol.Layers()); len(miss) > 0 {
				t.Errorf("all: layers not active: %v (%v)", miss, res.Enforcement.Errors)
			}
		}
	}
	check()

	// The matrix, one line per probe: "stopped" cells show the error.
	var b strings.Builder
	fmt.Fprintf(&b, "\n%-38s", "attempt")
	for _, c := range configurations {
		fmt.Fprintf(&b, " %-22s", c.name)
	}
	b.WriteString("\n")
	for _, p := range probes {
		fmt.Fprintf(&b, "%-38s", p.name)
		for _, c := range configurations {
			cell := results[c.name][p.name]
			if cell != "ESCAPED" {
				cell = "stopped: " + shortErr(cell)
			}
			fmt.Fprintf(&b, " %-22.22s", cell)
		}
		b.WriteString("\n")
	}
	t.Log(b.String())

	if os.Getuid() != 0 {
		// RLIMIT_NPROC binds inside the worker's user namespace, but not when the
		// worker maps to host root (the kernel exempts root's user): the daemon
		// runs as its own unprivileged user in production.
		stoppedAlone["fork flood (300 live processes)"] = []string{"seccomp", "namespaces"}
	} else {
		t.Log("running as root: RLIMIT_NPROC does not bind a worker mapped to host root, so the namespaces-only column may let a fork flood through")
	}
	for _, p := range probes {
		if results["all"][p.name] == "ESCAPED" {
			t.Errorf("%q escaped with every layer on", p.name)
		}
		for _, layer := range stoppedAlone[p.name] {
			if results[layer][p.name] == "ESCAPED" {
				t.Errorf("%q escaped under %s alone, which must stop it", p.name, layer)
			}
		}
	}
	for name := range stoppedAlone {
		if _, ok := results["all"][name]; !ok {
			t.Errorf("expectation for unknown probe %q", name)
		}
	}
}

func shortErr(s string) string {
	for errno := unix.Errno(1); errno < 134; errno++ {
		if s == errno.Error() {
			return unix.ErrnoName(errno)
		}
	}
	if strings.Contains(s, "no escape") {
		return "own root"
	}
	if i := strings.LastIndex(s, ": "); i >= 0 {
		return shortErr(s[i+2:])
	}
	return s
}

// escapeTargets sets up what the probes aim at, and returns a check that nothing
// reached them.
func escapeTargets(t *testing.T) (target, func()) {
	t.Helper()
	host := t.TempDir()
	var hits atomic.Int32
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tcp.Close() })
	udp, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { udp.Close() })
	sockDir, err := os.MkdirTemp("/tmp", "sandcell-escape-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	unixPath := filepath.Join(sockDir, "s")
	ul, err := net.Listen("unix", unixPath)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ul.Close() })
	abstract := "sandcell-escape-" + strconv.Itoa(os.Getpid())
	al, err := net.Listen("unix", "@"+abstract)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { al.Close() })
	// Connections that a layer lets through are counted, not failed on: which layer
	// stops what is the matrix's business; the assertions are on its cells.
	for _, l := range []net.Listener{tcp, ul, al} {
		go func(l net.Listener) {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				hits.Add(1)
				c.Close()
			}
		}(l)
	}
	tg := target{HostDir: host, ParentPID: os.Getpid(), TCPPort: tcp.Addr().(*net.TCPAddr).Port,
		UDPPort: udp.LocalAddr().(*net.UDPAddr).Port, UnixPath: unixPath, Abstract: abstract}
	return tg, func() {
		var names []string
		filepath.WalkDir(host, func(p string, d os.DirEntry, err error) error {
			if rel, _ := filepath.Rel(host, p); strings.Contains(rel, "pwned") {
				names = append(names, rel)
			}
			return nil
		})
		sort.Strings(names)
		t.Logf("written on the host by configurations that let it through: %v; connections accepted by the host listeners: %d",
			names, hits.Load())
		for _, n := range names {
			if strings.HasPrefix(n, "all/") || strings.HasPrefix(n, "landlock/") || strings.HasPrefix(n, "namespaces/") {
				t.Errorf("%s was written on the host", n)
			}
		}
		udp.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
		buf := make([]byte, 16)
		if n, _, err := udp.ReadFrom(buf); err == nil {
			t.Logf("UDP datagram reached the host: %q", buf[:n])
		}
		if b, _ := os.ReadFile(filepath.Join(host, "all", "secret")); string(b) != secretText {
			t.Errorf("host secret changed: %q", b)
		}
	}
}

// TestContractEveryLayer: a real run reports every layer active, and the guest's own
// view agrees (no host name, pid 1, no network interface it can use).
func TestContractEveryLayer(t *testing.T) {
	t.Parallel()
	res, _ := run(t, `import os, socket
print(os.getpid())
try:
    socket.socket()
    print("socket")
except OSError as e:
    print("no socket")
`, nil)
	wantExit(t, res, 0)
	e := res.Enforcement
	if e == nil {
		t.Fatal("no contract in the result")
	}
	if miss := e.Missing(protocol.Layers()); len(miss) > 0 {
		t.Fatalf("layers not active: %v: %v", miss, e.Errors)
	}
	if !e.Seccomp.Active || len(e.Seccomp.SHA256) != 64 || e.Landlock.ABI < 1 || e.Capabilities != "=" ||
		e.Rlimits["CORE"] != 0 || e.Rlimits["NOFILE"] != 256 || !e.NoNewPrivs {
		t.Fatalf("contract: %+v", e)
	}
	if strings.Contains(string(res.Stdout), "socket\n") && !strings.Contains(string(res.Stdout), "no socket") {
		t.Fatalf("guest made a socket: %s", res.Stdout)
	}
}

// TestRequiredLayerMissing: a required layer that is not set up ends the run
// rejected, and no guest code runs.
func TestRequiredLayerMissing(t *testing.T) {
	t.Parallel()
	for _, layer := range []string{protocol.LayerSeccomp, protocol.LayerLandlock, protocol.LayerNetNS} {
		res, ws := run(t, `open("ran.txt", "w").write("yes")`, func(r *protocol.Request) {
			limits, _ := policy.Default().Resolve(r.Limits)
			r.Hardening = policy.Default().Hardening(limits)
			switch layer {
			case protocol.LayerSeccomp:
				r.Hardening.Seccomp = nil
			case protocol.LayerLandlock:
				r.Hardening.Landlock = false
			case protocol.LayerNetNS:
				r.Hardening.Namespaces = false
			}
		})
		if res.Reason != protocol.Rejected || len(res.Diagnostics) == 0 || !strings.Contains(res.Diagnostics[0], layer) {
			t.Errorf("%s missing: reason %s, diagnostics %v", layer, res.Reason, res.Diagnostics)
		}
		if _, err := os.Stat(filepath.Join(ws, "ran.txt")); err == nil {
			t.Errorf("%s missing: the guest ran", layer)
		}
	}
}

// TestUnknownLayerRefused: policy names only layers that exist.
func TestUnknownLayerRefused(t *testing.T) {
	p := policy.Default()
	p.Require = append(p.Require, "selinux")
	if err := p.Validate(); err == nil || !strings.Contains(err.Error(), "selinux") {
		t.Fatalf("Validate: %v", err)
	}
}

// TestEscapeMatrixUnprivileged runs the escape suite again as an unprivileged user
// (uid 65534), as the daemon runs in production: there the workers map to that user,
// RLIMIT_NPROC binds, and nothing in the matrix may depend on being root.
func TestEscapeMatrixUnprivileged(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("not root: TestEscapeMatrix itself runs unprivileged")
	}
	if testing.Short() {
		t.Skip("-short")
	}
	dir, err := os.MkdirTemp("", "sandcell-unprivileged-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	tmp := filepath.Join(dir, "tmp")
	// The binary's directory is never a workspace, nor holds one: it gets its own.
	os.Mkdir(filepath.Join(dir, "bin"), 0o755)
	bin := filepath.Join(dir, "bin", "sandbox.test")
	src, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, src, 0o755); err != nil {
		t.Fatal(err)
	}
	os.Mkdir(tmp, 0o777)
	os.Chmod(dir, 0o755)
	os.Chmod(tmp, 0o777)
	// The source tree may be where uid 65534 cannot go (CI clones into a 0700
	// directory), so the bundle is copied beside the binary.
	bundleDir := filepath.Join(dir, "bundle")
	if err := copyTree(bundletest.Dir(t), bundleDir); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-test.run=^TestEscapeMatrix$", "-test.v", "-test.count=1")
	cmd.Dir = dir
	cmd.Env = []string{"TMPDIR=" + tmp, "HOME=" + tmp, "PATH=/usr/bin:/bin", "SANDCELL_BUNDLE_DIR=" + bundleDir}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte("--- PASS: TestEscapeMatrix")) {
		t.Fatalf("escape suite as uid 65534: %v\n%s", err, out)
	}
	if i := bytes.Index(out, []byte("attempt")); i >= 0 {
		t.Logf("as uid 65534:\n%s", out[i:])
	}
}

// TestFileSizeLimit: RLIMIT_FSIZE makes a write past it fail (EFBIG), not kill the run.
func TestFileSizeLimit(t *testing.T) {
	t.Parallel()
	res, ws := run(t, `
try:
    with open("big", "wb") as f:
        f.write(b"x" * (3 << 20))
    print("wrote")
except OSError as e:
    print("refused", e.errno)
`, func(r *protocol.Request) {
		limits, _ := policy.Default().Resolve(r.Limits)
		r.Hardening = policy.Default().Hardening(limits)
		r.Hardening.Rlimits.FSIZE = 1 << 20
	})
	wantExit(t, res, 0)
	if !strings.HasPrefix(string(res.Stdout), "refused") {
		t.Fatalf("stdout %q stderr %q", res.Stdout, res.Stderr)
	}
	if st, err := os.Stat(filepath.Join(ws, "big")); err != nil || st.Size() > 1<<20 {
		t.Fatalf("file: %v %v", st, err)
	}
}

// TestCPURlimitBackstop: with the engine's CPU limit off, RLIMIT_CPU still ends a
// busy worker, and the run says cpu_limit.
func TestCPURlimitBackstop(t *testing.T) {
	t.Parallel()
	res, _ := run(t, "while True: pass", func(r *protocol.Request) {
		r.Limits.TimeoutMS = 20_000
		limits, _ := policy.Default().Resolve(r.Limits)
		r.Hardening = policy.Default().Hardening(limits)
		r.Hardening.Rlimits.CPU = 1
	})
	if res.Reason != protocol.CPULimit || res.ElapsedMS > 10_000 {
		t.Fatalf("reason %s after %.0f ms: %v", res.Reason, res.ElapsedMS, res.Diagnostics)
	}
}

// copyTree copies the regular files and directories under src to dst, keeping modes.
func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		to := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			return os.MkdirAll(to, info.Mode().Perm())
		case info.Mode().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			return os.WriteFile(to, b, info.Mode().Perm())
		}
		return nil
	})
}

// TestWorkspaceOnKernelFilesystemRefused: /proc, /sys and their kind are kernel
// interfaces (a worker mapped to host root could write /proc/sys through them).
func TestWorkspaceOnKernelFilesystemRefused(t *testing.T) {
	t.Parallel()
	for _, ws := range []string{"/proc", "/proc/sys", "/sys", "/sys/fs/cgroup", "/dev"} {
		if _, err := os.Stat(ws); err != nil {
			continue
		}
		_, err := sandbox.NewSpawner().Run(context.Background(), protocol.Request{Code: "1", Workspace: ws,
			ModulePath: bundletest.Module(t, false), LibDir: bundletest.LibDir(t), Limits: policy.Default().Default})
		if !errors.Is(err, sandbox.ErrBadRequest) {
			t.Errorf("workspace %s: err = %v", ws, err)
		}
	}
}

// TestSymlinkedWorkspace: a workspace named through a symbolic link gets every layer
// (the worker reopens the path the kernel gives for the checked directory).
func TestSymlinkedWorkspace(t *testing.T) {
	t.Parallel()
	real := t.TempDir()
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	res, _ := run(t, `open("f", "w").write("x")`, func(r *protocol.Request) { r.Workspace = link })
	wantExit(t, res, 0)
	if miss := res.Enforcement.Missing(protocol.Layers()); len(miss) > 0 {
		t.Fatalf("missing %v: %v", miss, res.Enforcement.Errors)
	}
	if b, _ := os.ReadFile(filepath.Join(real, "f")); string(b) != "x" {
		t.Fatal("the file did not reach the workspace")
	}
}
