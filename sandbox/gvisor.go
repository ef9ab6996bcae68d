package sandbox

// The gVisor layer of the native backend. Where policy requires it (native.require
// names "gvisor"), a native run does not start a worker of ours: the daemon gives
// runsc an OCI container whose process is the root's python3 with the runner, and
// gVisor's user-space kernel (the sentry) serves every system call the guest makes,
// and its gofer every file, in place of the host's kernel. The container:
//
//	/               the native root, read-only
//	/ws             the workspace (read-write, nosuid, nodev, noexec)
//	/tmp            a tmpfs of Hardening.TmpBytes (nosuid, nodev, noexec)
//	/proc           gVisor's procfs of the container
//
// runsc passes its container no descriptor but its stdio, and makes a mount point
// missing from the root in the root itself: so the guest's stdin is one end of a
// socket pair, which the runner also takes as its fd 3 (the control channel), and
// the container has no mount the root does not already hold a directory for.
//
// and new pid, network (none: a loopback only), IPC, UTS and mount namespaces of
// gVisor's, no capability, no_new_privs, the native seccomp profile loaded by the
// sentry (--oci-seccomp), RLIMIT_AS as the memory limit (the sentry has no
// RLIMIT_DATA), NOFILE, FSIZE, NPROC, CORE 0. runsc itself confines the sentry and
// gofer on the host (their own namespaces and seccomp filters). The sentry of this
// runsc does not enforce RLIMIT_CPU: the daemon reads the CPU time of runsc's
// processes (the sentry's work for the guest included) and ends the run at the limit.
//
// Before the program exists for it, the runner says what it finds in force (the
// seccomp mode, no_new_privs, capabilities, limits: StepExec); the daemon adds what
// only it knows (runsc's version and the spec's digest), checks the contract against
// policy, and only then writes the program (then its stdin) to the runner's stdin,
// shut for writing after it.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/sandcell/sandcell/sandbox/protocol"
)

// GVisorPlatform is how runsc's sentry runs the guest's code: ptrace works on any
// kernel; kvm needs /dev/kvm (and, in a virtual machine, nested virtualisation).
const GVisorPlatform = "ptrace"

// gvisorMemoryHeadroom is what a gVisor sandbox's memory limit adds to the run's
// memory and /tmp: the interpreter's and its libraries' files read into the
// sentry's memory (the whole stack's imports fit in 384 MiB with 256 of memory and
// 64 of /tmp, measured).
const gvisorMemoryHeadroom = 64 << 20

// gvisorMemory is the memory limit of h's gVisor sandbox, in bytes: the run's
// memory, its /tmp and gvisorMemoryHeadroom.
func gvisorMemory(h protocol.Hardening) int64 {
	return int64(h.Rlimits.DATA) + h.TmpBytes + gvisorMemoryHeadroom
}

// GVisor is a runsc that a Spawner runs native guests under (see Spawner.GVisor).
type GVisor struct {
	// Runsc is runsc's path.
	Runsc string
	// Version is the first line of `runsc --version`.
	Version string
	// Dir is a directory of the daemon's own (0700) where each run's bundle and
	// runsc state live while it runs.
	Dir string
}

// NewGVisor returns the gVisor layer of runsc (a path, or a name looked up in PATH)
// with dir for its runs' state: made if missing, and then it must be a directory
// (not a link) of this process's user, which it makes 0700. Runs a process left
// there when it died (runsc's own processes died with it) are removed: each run's
// directory names its process. It fails when runsc cannot be found or does not
// answer --version; whether it runs the native root is the self-test's to find out
// (a run under it).
func NewGVisor(runsc, dir string) (*GVisor, error) {
	path, err := exec.LookPath(runsc)
	if err != nil {
		return nil, fmt.Errorf("gvisor: %w", err)
	}
	out, err := exec.Command(path, "--version").Output()
	if err != nil {
		return nil, fmt.Errorf("gvisor: %s --version: %w", path, err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("gvisor: %w", err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return nil, fmt.Errorf("gvisor: %w", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR || int(st.Uid) != os.Geteuid() {
		return nil, fmt.Errorf("gvisor: %s is not a directory of this user's (uid %d)", dir, os.Geteuid())
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, fmt.Errorf("gvisor: %w", err)
	}
	left, _ := filepath.Glob(filepath.Join(dir, "run-*"))
	for _, d := range left {
		if !runAlive(filepath.Base(d)) {
			_ = os.RemoveAll(d)
		}
	}
	return &GVisor{Runsc: path, Version: strings.TrimSpace(strings.SplitN(string(out), "\n", 2)[0]), Dir: dir}, nil
}

// runDirPrefix is the start of the name of a run's directory: "run-PID-".
func runDirPrefix() string { return fmt.Sprintf("run-%d-", os.Getpid()) }

// runAlive says whether the process that named a run's directory (see
// runDirPrefix) still runs.
func runAlive(name string) bool {
	f := strings.Split(name, "-")
	if len(f) < 3 {
		return false
	}
	pid, err := strconv.Atoi(f[1])
	if err != nil || pid <= 0 {
		return false
	}
	return pid == os.Getpid() || unix.Kill(pid, 0) != unix.ESRCH
}

// gvisorSeccomp is the native profile as runsc's sentry loads it for the guest.
// Two changes:
//   - execve and execveat are refused: a worker needs them to become the
//     interpreter, but here runsc starts it, and without Landlock (which lets a
//     worker's guest execute only the interpreter) nothing else would keep the
//     guest from executing the root's other programs;
//   - this runsc takes no errno of a rule's own (every refusal is EPERM), so the
//     rule that answers clone3 with ENOSYS (glibc then uses clone, whose flags the
//     filter reads) becomes an allow: the sentry has no clone3 and answers ENOSYS
//     itself, which the runner checks before each program (see native.py's
//     _sandcell_control), so that under a runsc that has it nothing runs.
func gvisorSeccomp(p specs.LinuxSeccomp) *specs.LinuxSeccomp {
	out := p
	out.Syscalls = nil
	for _, r := range p.Syscalls {
		if r.Action == specs.ActErrno && slices.Equal(r.Names, []string{"clone3"}) {
			// (Only clone3: every other rule's errno becomes EPERM, which refuses
			// the call as well, whatever a later runsc implements.)
			r.Action, r.ErrnoRet = specs.ActAllow, nil
		}
		if r.Action == specs.ActAllow {
			r.Names = slices.DeleteFunc(slices.Clone(r.Names), func(n string) bool { return n == "execve" || n == "execveat" })
			if len(r.Names) == 0 {
				continue
			}
		}
		out.Syscalls = append(out.Syscalls, r)
	}
	return &out
}

// spec is the container of req (see the file's comment); ws is the workspace's path.
func (g *GVisor) spec(req protocol.Request, ws string) *specs.Spec {
	h := req.Hardening
	limit := func(name string, n uint64) specs.POSIXRlimit { return specs.POSIXRlimit{Type: name, Hard: n, Soft: n} }
	rl := []specs.POSIXRlimit{limit("RLIMIT_CORE", 0), limit("RLIMIT_AS", h.Rlimits.DATA)}
	for _, l := range []struct {
		name string
		n    uint64
	}{{"RLIMIT_NOFILE", h.Rlimits.NOFILE}, {"RLIMIT_FSIZE", h.Rlimits.FSIZE}, {"RLIMIT_NPROC", h.Rlimits.NPROC},
		// The sentry keeps RLIMIT_CPU without enforcing it: the daemon's watch does
		// (watchTreeCPU), at the run's cpu_ms or these seconds.
		{"RLIMIT_CPU", h.Rlimits.CPU}} {
		if l.n > 0 {
			rl = append(rl, limit(l.name, l.n))
		}
	}
	sandboxMemory := gvisorMemory(h)
	sp := &specs.Spec{
		Version: specs.Version,
		Process: &specs.Process{
			Args: []string{"/usr/bin/python3.13", "-I", "-B", "-c", protocol.NativeRunner(), "control"},
			// The defaults alone: the runner sets the caller's environment from
			// the program's header, after the contract (see native.py).
			Env:             protocol.NativeEnv(nil),
			Cwd:             "/",
			NoNewPrivileges: true,
			Capabilities:    &specs.LinuxCapabilities{},
			Rlimits:         rl,
		},
		Root: &specs.Root{Path: req.RootDir, Readonly: true},
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc"},
			{Destination: protocol.NativeTmp, Type: "tmpfs", Source: "tmpfs",
				Options: []string{"nosuid", "nodev", "noexec", fmt.Sprintf("size=%d", h.TmpBytes)}},
			{Destination: protocol.GuestWorkdir, Type: "bind", Source: ws, Options: []string{"rbind", "rw", "nosuid", "nodev", "noexec"}},
			// runsc's own /dev/shm would be a tmpfs without bound: none, as on the
			// native backend (its /dev has no shm).
			{Destination: "/dev/shm", Type: "tmpfs", Source: "tmpfs", Options: []string{"ro", "nosuid", "nodev", "noexec", "size=4096"}},
		},
		Linux: &specs.Linux{
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace}, {Type: specs.NetworkNamespace}, {Type: specs.IPCNamespace},
				{Type: specs.UTSNamespace}, {Type: specs.MountNamespace},
			},
			// The sandbox's memory in all (the sentry's memory file: the guest's
			// pages, its tmpfs files in /tmp and runsc's writable /dev, the cache of
			// the files it reads): RLIMIT_AS does not count files in memory. Past
			// it, the sentry kills the guest (SIGKILL).
			Resources: &specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: &sandboxMemory}},
		},
	}
	if h.Seccomp != nil {
		sp.Linux.Seccomp = gvisorSeccomp(*h.Seccomp)
	}
	return sp
}

// runGVisor runs req (native, its workspace open as wsDir) in a runsc container.
// Without a runsc the run ends rejected: policy requires a layer this daemon cannot
// give, and no code runs.
func (s *Spawner) runGVisor(ctx context.Context, req protocol.Request, wsDir *os.File, observe Observer) (protocol.Result, error) {
	g := s.GVisor
	if g == nil {
		return rejected("policy requires the gvisor layer (native.require) and this daemon has no runsc " +
			"(install Debian's runsc package, or leave gvisor out of native.require); no code was run"), nil
	}
	prog, err := protocol.Program(&req, "")
	if err != nil {
		return protocol.Result{}, fmt.Errorf("%w: %v", ErrBadRequest, err)
	}
	dir, err := os.MkdirTemp(g.Dir, runDirPrefix())
	if err != nil {
		return protocol.Result{}, fmt.Errorf("sandbox: gvisor: %w", err)
	}
	defer os.RemoveAll(dir)
	// The workspace by the path prepare resolved (runsc's gofer cannot mount a
	// descriptor's /proc link). Only the daemon (or, for `sandcell run`, the caller
	// who named it) can change that path: a guest reaches files inside workspaces.
	spec := g.spec(req, req.Workspace)
	b, err := json.Marshal(spec)
	if err != nil {
		return protocol.Result{}, fmt.Errorf("sandbox: gvisor: %w", err)
	}
	if err := os.Mkdir(filepath.Join(dir, "bundle"), 0o700); err != nil {
		return protocol.Result{}, fmt.Errorf("sandbox: gvisor: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "bundle", "config.json"), b, 0o600); err != nil {
		return protocol.Result{}, fmt.Errorf("sandbox: gvisor: %w", err)
	}
	digest := sha256.Sum256(b)

	p, err := g.start(dir)
	if err != nil {
		return protocol.Result{}, fmt.Errorf("sandbox: gvisor: %w", err)
	}
	collected := false // collect closes what p holds; until then, this does
	defer func() {
		if !collected {
			p.ctl.Close()
			p.outR.Close()
			p.errR.Close()
		}
	}()

	// The runner's contract first, within the run's own time.
	began := time.Now()
	wall := time.Duration(req.Limits.TimeoutMS) * time.Millisecond
	type first struct {
		f   protocol.Frame
		err error
	}
	got := make(chan first, 1)
	go func() {
		f, err := protocol.ReceiveMax(p.ctl, protocol.MaxGuestFrame, protocol.StepExec)
		got <- first{f, err}
	}()
	var fr first
	select {
	case fr = <-got:
	case <-time.After(wall):
		p.kill()
		return stopped(p, protocol.Timeout, "runsc did not start the guest within the run's wall-clock limit"), nil
	case <-ctx.Done():
		p.kill()
		reason, detail := stopCause(ctx)
		return stopped(p, reason, detail), nil
	}
	if fr.err != nil || fr.f.Report == nil || fr.f.Report.Enforcement == nil {
		p.kill()
		<-p.exited
		return rejected(fmt.Sprintf("runsc did not start the guest (%v): %s; no code was run",
			fr.err, tail(p.errR))), nil
	}
	enf := gvisorContract(*fr.f.Report.Enforcement, req.Hardening, g, hex.EncodeToString(digest[:]))
	if missing := enf.Missing(req.Hardening.Require); len(missing) > 0 {
		p.kill()
		<-p.exited
		res := rejected(fmt.Sprintf("the guest under gVisor lacks required layers %v; no code was run", missing))
		res.Enforcement = &enf
		return res, nil
	}

	// The contract holds: the program, then its stdin, and the run's clock from here.
	go func() {
		if _, err := p.ctl.Write(prog); err == nil && len(req.Stdin) > 0 {
			_, _ = p.ctl.Write(req.Stdin)
		}
		if c, err := p.ctl.SyscallConn(); err == nil {
			_ = c.Control(func(fd uintptr) { _ = unix.Shutdown(int(fd), unix.SHUT_WR) })
		}
	}()
	p.execd = &protocol.Report{Enforcement: &enf}
	if left := wall - time.Since(began); left < wall {
		req.Limits.TimeoutMS = max(left.Milliseconds(), 1)
	}
	cctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	if budget := gvisorCPU(req); budget > 0 {
		// The sentry, its gofer and the guest's stubs: every process under runsc.
		over := watchCPU(p, budget, nil, treeCPU)
		go func() {
			select {
			case <-over:
				cancel(&Stop{Reason: protocol.CPULimit, Detail: fmt.Sprintf(
					"the program used its CPU time (%d ms, counted across gVisor's processes for the run)", budget.Milliseconds())})
			case <-p.exited:
			}
		}()
	}
	collected = true
	res := p.collect(cctx, nil, req, observe)
	// runsc's own peak, not the guest's: the sentry's memory is not the program's.
	res.PeakMemoryBytes = 0
	if res.Reason == protocol.Exited && res.ExitCode > 128 && res.ExitCode < 128+65 && !p.reported {
		// runsc ends with 128+N when its guest was killed by signal N; a runner
		// that ends by itself reports first (os._exit(137) would read the same).
		sig := syscall.Signal(res.ExitCode - 128)
		res.ExitCode, res.Reason = -1, protocol.Trap
		why := fmt.Sprintf("the interpreter was killed by signal %d (%s)", int(sig), sig)
		if sig == syscall.SIGKILL {
			why += fmt.Sprintf(": under gVisor, what the sandbox's memory limit does (%d MiB: the run's memory, "+
				"its /tmp and %d MiB for the files it reads, together)", gvisorMemory(req.Hardening)>>20, gvisorMemoryHeadroom>>20)
		}
		res.Diagnostics = append(res.Diagnostics, why)
	}
	if res.Reason == protocol.MemoryLimit {
		res.Diagnostics = []string{fmt.Sprintf("the program ran out of memory: an allocation was refused "+
			"(uncaught MemoryError; address space limit %d MiB, RLIMIT_AS under gVisor)", req.Hardening.Rlimits.DATA>>20)}
	}
	return res, nil
}

// start starts runsc on the bundle in dir: stdout and stderr pipes as a worker's,
// and p.ctl the parent's end of the socket pair whose other end is the container's
// stdin (and its runner's control channel).
func (g *GVisor) start(dir string) (*proc, error) {
	p, stdin, outW, errW, err := newProc()
	if err != nil {
		return nil, err
	}
	// runsc passes its container no descriptor but its stdio: no tools channel
	// (the runner's sandcell.tools says so).
	p.tools.Close()
	p.toolsChild.Close()
	p.tools, p.toolsChild = nil, nil
	defer stdin.Close()
	defer outW.Close()
	defer errW.Close()
	p.cmd = &exec.Cmd{
		Path: g.Runsc,
		Args: []string{"runsc", "--rootless", "--network=none", "--platform=" + GVisorPlatform, "--oci-seccomp",
			"--root", filepath.Join(dir, "state"), "run", "--bundle", filepath.Join(dir, "bundle"),
			"sandcell-" + filepath.Base(dir)},
		Env:    []string{"PATH=/usr/bin:/bin"},
		Stdin:  stdin,
		Stdout: outW,
		Stderr: errW,
		// Killing runsc's group ends the container: its sandbox and gofer die with
		// runsc (their parent-death signal).
		SysProcAttr: &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL},
	}
	if err := p.start(nil, nil); err != nil {
		return nil, err
	}
	return p, nil
}

// gvisorContract is the contract of a run under gVisor: what the runner found in
// force (e, read inside the container before any of the caller's code), with what
// the daemon alone knows: the namespaces (every one the guest has is the sentry's,
// none the host's), the seccomp profile's identity, Landlock's absence, and gVisor.
func gvisorContract(e protocol.Enforcement, h protocol.Hardening, g *GVisor, digest string) protocol.Enforcement {
	e.Backend = protocol.BackendNative
	e.Namespaces = map[string]bool{}
	for layer := range protocol.Namespaces() {
		e.Namespaces[layer] = true
	}
	e.MountRoot = nil // the native root's own entries, with /proc, /tmp and /ws mounted on theirs
	if e.Seccomp.Active && h.Seccomp != nil {
		if b, err := json.Marshal(gvisorSeccomp(*h.Seccomp)); err == nil {
			sum := sha256.Sum256(b)
			e.Seccomp.SHA256 = hex.EncodeToString(sum[:])
		}
		e.Seccomp.DefaultAction = string(h.Seccomp.DefaultAction)
		e.Seccomp.Arch = "x86_64 (the sentry's)"
	}
	e.Landlock = protocol.LandlockState{}
	e.Errors = map[string]string{protocol.LayerLandlock: "gVisor's kernel has no Landlock: its gofer serves the guest the container's mounts alone"}
	if !slices.Contains(e.ActiveLayers(), protocol.LayerRlimits) {
		e.Errors[protocol.LayerRlimits] = "the limits read back in the container are not all in force"
	}
	e.GVisor = &protocol.GVisorState{Active: true, Version: g.Version, Platform: GVisorPlatform, Spec: digest}
	return e
}

// gvisorCPU is the CPU time a run under gVisor may use: its cpu_ms, else its
// RLIMIT_CPU seconds (which the sentry does not enforce).
func gvisorCPU(req protocol.Request) time.Duration {
	if req.Limits.CPUMS > 0 {
		return time.Duration(req.Limits.CPUMS) * time.Millisecond
	}
	return time.Duration(req.Hardening.Rlimits.CPU) * time.Second
}

// rejected is the result of a run that policy or the host kept from running.
func rejected(why string) protocol.Result {
	return protocol.Result{ExitCode: -1, Reason: protocol.Rejected, Diagnostics: []string{why}}
}

// stopped is the result of a run under gVisor ended (reason) before its program.
func stopped(p *proc, reason protocol.Reason, detail string) protocol.Result {
	<-p.exited
	res := protocol.Result{ExitCode: -1, Reason: reason, ElapsedMS: float64(time.Since(p.started).Microseconds()) / 1000}
	if detail != "" {
		res.Diagnostics = []string{detail}
	}
	return res
}

// tail returns up to 2 KiB of what is left to read on r (runsc's stderr, once it
// has ended), trimmed.
func tail(r *os.File) string {
	_ = r.SetReadDeadline(time.Now().Add(time.Second))
	b := make([]byte, 64<<10)
	n, _ := r.Read(b)
	s := strings.TrimSpace(string(b[:n]))
	if len(s) > 2048 {
		s = s[len(s)-2048:]
	}
	return s
}
