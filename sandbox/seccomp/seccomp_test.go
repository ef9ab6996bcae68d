package seccomp

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/sandcell/sandcell/sandbox/protocol"
	libseccomp "github.com/seccomp/libseccomp-golang"
	"golang.org/x/sys/unix"
)

// rulesFor returns the rules of p that name call.
func rulesFor(p specs.LinuxSeccomp, call string) []specs.LinuxSyscall {
	var out []specs.LinuxSyscall
	for _, r := range p.Syscalls {
		for _, n := range r.Names {
			if n == call {
				out = append(out, r)
			}
		}
	}
	return out
}

// TestRulesInvariants checks the profile as data: an allowlist whose dangerous calls
// are absent or narrowed by argument filters.
func TestRulesInvariants(t *testing.T) {
	p := Rules()
	if p.DefaultAction != specs.ActErrno || p.DefaultErrnoRet == nil || *p.DefaultErrnoRet != uint(unix.EPERM) {
		t.Errorf("default action = %s/%v, want SCMP_ACT_ERRNO EPERM", p.DefaultAction, p.DefaultErrnoRet)
	}
	never := []string{"socket", "socketpair", "connect", "bind", "listen", "accept", "accept4",
		"sendto", "sendmsg", "recvmsg", "execve", "execveat", "fork", "vfork", "ptrace",
		"process_vm_readv", "process_vm_writev", "unshare", "setns", "mount", "umount2",
		"pivot_root", "chroot", "keyctl", "add_key", "request_key", "bpf", "perf_event_open",
		"userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register", "personality",
		"kill", "init_module", "finit_module", "kexec_load", "open_by_handle_at",
		"name_to_handle_at", "mount_setattr", "open_tree", "move_mount", "fsopen", "fsmount",
		"setuid", "setgid", "setresuid", "capset", "seccomp", "landlock_create_ruleset",
		"memfd_create", "pkey_mprotect", "process_madvise", "pidfd_open", "pidfd_getfd", "quotactl"}
	for _, call := range never {
		for _, r := range rulesFor(p, call) {
			if r.Action == specs.ActAllow || r.Action == specs.ActLog {
				t.Errorf("%s is allowed", call)
			}
		}
	}
	// clone: threads only, never a namespace or a new process.
	for _, r := range rulesFor(p, "clone") {
		if len(r.Args) != 1 || r.Args[0].Op != specs.OpMaskedEqual || r.Args[0].Index != 0 ||
			r.Args[0].Value&namespaceFlags != namespaceFlags || r.Args[0].ValueTwo != unix.CLONE_THREAD {
			t.Errorf("clone rule %+v does not require CLONE_THREAD and forbid namespace flags", r.Args)
		}
	}
	for _, call := range []string{"mmap", "mprotect"} {
		for _, r := range rulesFor(p, call) {
			if len(r.Args) == 0 || r.Args[0].Index != 2 || r.Args[0].Value != unix.PROT_EXEC || r.Args[0].ValueTwo != 0 {
				t.Errorf("%s rule %+v does not forbid PROT_EXEC", call, r.Args)
			}
		}
	}
	for _, r := range rulesFor(p, "mmap") {
		if len(r.Args) != 2 || r.Args[1].Index != 1 || r.Args[1].Op != specs.OpLessEqual || r.Args[1].Value > 16<<30 {
			t.Errorf("mmap rule %+v does not bound the mapping's size", r.Args)
		}
	}
	for _, call := range []string{"ioctl", "prctl", "prlimit64"} {
		for _, r := range rulesFor(p, call) {
			if r.Action == specs.ActAllow && len(r.Args) == 0 {
				t.Errorf("%s allowed without an argument filter", call)
			}
		}
	}
	if r := rulesFor(p, "restart_syscall"); len(r) != 1 || r[0].Action != specs.ActAllow {
		t.Errorf("restart_syscall must be allowed: a stopped and continued timed wait resumes through it: %+v", r)
	}
	if r := rulesFor(p, "clone3"); len(r) != 1 || r[0].Action != specs.ActErrno || *r[0].ErrnoRet != uint(unix.ENOSYS) {
		t.Errorf("clone3 must answer ENOSYS so that glibc falls back to clone: %+v", r)
	}
	// Every name is a call on x86_64 (aarch64 lacks a few legacy calls, which are
	// skipped there).
	for _, r := range p.Syscalls {
		for _, n := range r.Names {
			if _, err := libseccomp.GetSyscallFromNameByArch(n, libseccomp.ArchAMD64); err != nil {
				t.Errorf("%s is not a call on x86_64", n)
			}
		}
	}
	prog, err := Compile(p)
	if err != nil {
		t.Fatal(err)
	}
	again, _ := Compile(Rules())
	if prog.SHA256 != again.SHA256 || len(prog.SHA256) != 64 || prog.Instructions < 20 {
		t.Errorf("compiled program: %+v vs %+v", prog, again)
	}
}

func TestCompileRefusals(t *testing.T) {
	base := Rules()
	cases := map[string]func(p *specs.LinuxSeccomp){
		"allow by default":  func(p *specs.LinuxSeccomp) { p.DefaultAction = specs.ActAllow },
		"notify by default": func(p *specs.LinuxSeccomp) { p.DefaultAction = specs.ActNotify }, // a rule may (TestLoadFileRefusesNotify)
		"errno zero": func(p *specs.LinuxSeccomp) {
			z := uint(0)
			p.Syscalls[0].ErrnoRet = &z
		},
		"bad operator": func(p *specs.LinuxSeccomp) {
			p.Syscalls = append(p.Syscalls, specs.LinuxSyscall{Names: []string{"read"}, Action: specs.ActAllow,
				Args: []specs.LinuxSeccompArg{{Index: 0, Op: "SCMP_CMP_SOMETIMES"}}})
		},
		"masked outside": func(p *specs.LinuxSeccomp) {
			p.Syscalls = append(p.Syscalls, specs.LinuxSyscall{Names: []string{"read"}, Action: specs.ActAllow,
				Args: []specs.LinuxSeccompArg{{Index: 0, Op: specs.OpMaskedEqual, Value: 1, ValueTwo: 2}}})
		},
		"flags":       func(p *specs.LinuxSeccomp) { p.Flags = []specs.LinuxSeccompFlag{specs.LinuxSeccompFlagLog} },
		"kill thread": func(p *specs.LinuxSeccomp) { p.DefaultAction = specs.ActKill },
		"nothing known": func(p *specs.LinuxSeccomp) {
			p.Syscalls = []specs.LinuxSyscall{{Names: []string{"no_such_call"}, Action: specs.ActAllow}}
		},
	}
	for name, mutate := range cases {
		p := base
		p.Syscalls = append([]specs.LinuxSyscall(nil), base.Syscalls...)
		mutate(&p)
		if _, err := Compile(p); !errors.Is(err, ErrProfile) {
			t.Errorf("%s: err = %v, want ErrProfile", name, err)
		}
	}
}

func TestLoadFile(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.json")
	b, _ := json.Marshal(Rules())
	os.WriteFile(good, b, 0o644)
	p, err := LoadFile(good)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := Compile(p)
	want, _ := Compile(Rules())
	if a.SHA256 != want.SHA256 {
		t.Error("a profile read back from JSON compiles differently")
	}
	bad := filepath.Join(dir, "bad.json")
	os.WriteFile(bad, []byte(`{"defaultAction":"SCMP_ACT_ERRNO","syscalls":[],"extra":1}`), 0o644)
	if _, err := LoadFile(bad); err == nil || !strings.Contains(err.Error(), "extra") {
		t.Errorf("unknown field: err = %v", err)
	}
	for _, path := range []string{"/dev/zero", dir} {
		if _, err := LoadFile(path); err == nil || !strings.Contains(err.Error(), "regular file") {
			t.Errorf("%s: err = %v", path, err)
		}
	}
	fifo := filepath.Join(dir, "fifo")
	if err := unix.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadFile(fifo); err == nil || !strings.Contains(err.Error(), "regular file") {
		t.Errorf("fifo: err = %v", err)
	}
	huge := filepath.Join(dir, "huge.json")
	os.WriteFile(huge, bytes.Repeat([]byte(" "), maxProfileBytes+10), 0o644)
	if _, err := LoadFile(huge); err == nil || !strings.Contains(err.Error(), "larger") {
		t.Errorf("huge: err = %v", err)
	}
}

// victimEnv makes the test binary a victim: it installs Rules() and reports what each
// attempt returned.
const victimEnv = "SANDCELL_SECCOMP_VICTIM"

func TestMain(m *testing.M) {
	if os.Getenv(victimEnv) == "1" {
		victim()
		return
	}
	if os.Getenv(notifyVictimEnv) == "1" {
		notifyVictim()
		return
	}
	os.Exit(m.Run())
}

func victim() {
	prog, err := Compile(Rules())
	if err != nil {
		os.Stdout.WriteString("compile: " + err.Error())
		os.Exit(2)
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil { // as the worker, unprivileged
		os.Stdout.WriteString("no_new_privs: " + err.Error())
		os.Exit(2)
	}
	if err := prog.Install(); err != nil {
		os.Stdout.WriteString("install: " + err.Error())
		os.Exit(2)
	}
	res := map[string]string{}
	errno := func(_, _ uintptr, e unix.Errno) string { return e.Error() }
	res["socket"] = errno(unix.Syscall(unix.SYS_SOCKET, unix.AF_INET, unix.SOCK_STREAM, 0))
	res["execve"] = errno(unix.Syscall(unix.SYS_EXECVE, 0, 0, 0))
	res["fork"] = errno(unix.RawSyscall6(unix.SYS_CLONE, uintptr(unix.SIGCHLD), 0, 0, 0, 0, 0))
	res["clone_newuser"] = errno(unix.RawSyscall6(unix.SYS_CLONE, uintptr(unix.CLONE_THREAD|unix.CLONE_NEWUSER), 0, 0, 0, 0, 0))
	res["clone3"] = errno(unix.Syscall(unix.SYS_CLONE3, 0, 0, 0))
	res["mmap_exec"] = errno(unix.Syscall6(unix.SYS_MMAP, 0, 4096, unix.PROT_READ|unix.PROT_EXEC, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS, ^uintptr(0), 0))
	res["mmap_huge"] = errno(unix.Syscall6(unix.SYS_MMAP, 0, 1<<40, unix.PROT_READ, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE, ^uintptr(0), 0))
	res["mmap_ok"] = errno(unix.Syscall6(unix.SYS_MMAP, 0, 1<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS, ^uintptr(0), 0))
	res["io_uring_setup"] = errno(unix.Syscall(unix.SYS_IO_URING_SETUP, 1, 0, 0))
	res["prctl_other"] = errno(unix.Syscall(unix.SYS_PRCTL, unix.PR_SET_DUMPABLE, 1, 0))
	// Threads still work: start some and lock them to new OS threads.
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); runtime.LockOSThread(); _ = unix.Getpid() }()
	}
	wg.Wait()
	mode, _ := Mode()
	res["mode"] = string(rune('0' + mode))
	b, _ := json.Marshal(res)
	os.Stdout.Write(b)
	os.Exit(0)
}

// TestVictimDenied runs a process under the profile and checks what the kernel said.
func TestVictimDenied(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), victimEnv+"=1")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("victim: %v: %s", err, out)
	}
	var res map[string]string
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("victim output %q: %v", out, err)
	}
	eperm, enosys := unix.EPERM.Error(), unix.ENOSYS.Error()
	want := map[string]string{"socket": eperm, "execve": eperm, "fork": eperm, "clone_newuser": eperm,
		"clone3": enosys, "mmap_exec": eperm, "mmap_huge": eperm, "mmap_ok": "errno 0", "io_uring_setup": eperm, "prctl_other": eperm, "mode": "2"}
	for k, v := range want {
		if res[k] != v {
			t.Errorf("%s: got %q, want %q", k, res[k], v)
		}
	}
}

// The built-in profile denies socket(2) (a worker that shares its network namespace
// relies on it); a profile that allows it, at all or under conditions, does not.
func TestDeniesSyscall(t *testing.T) {
	p := Rules()
	if !protocol.DeniesSyscall(p, "socket") || !protocol.DeniesSyscall(p, "socketpair") || protocol.DeniesSyscall(p, "read") {
		t.Fatal("the built-in profile: socket denied, read allowed")
	}
	allowing := p
	allowing.Syscalls = append(slices.Clone(p.Syscalls), specs.LinuxSyscall{Names: []string{"socket"}, Action: specs.ActAllow,
		Args: []specs.LinuxSeccompArg{{Index: 0, Value: 1, Op: specs.OpEqualTo}}})
	if protocol.DeniesSyscall(allowing, "socket") {
		t.Fatal("a conditional allow of socket was taken for a denial")
	}
	open := specs.LinuxSeccomp{DefaultAction: specs.ActAllow}
	if protocol.DeniesSyscall(open, "socket") {
		t.Fatal("an allow-by-default profile denies socket")
	}
	open.Syscalls = []specs.LinuxSyscall{{Names: []string{"socket"}, Action: specs.ActErrno}}
	if !protocol.DeniesSyscall(open, "socket") {
		t.Fatal("an allow-by-default profile with an errno rule for socket")
	}
}
