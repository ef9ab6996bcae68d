// Package sandbox is the parent side of a run: it spawns a one-shot worker from the
// running binary, sends it the Request, reads the guest's stdout and stderr with byte
// caps, owns the wall clock and cancellation, and merges what it saw with the worker's
// Report into a Result.
//
// The worker is started with an environment built from nothing (never the parent's),
// only the fds the protocol names, its own session and process group, and SIGKILL as
// its parent-death signal. At the deadline, on cancel or when an output cap is hit the
// whole process group is killed.
package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/sandcell/sandcell/sandbox/protocol"
)

// ErrBadRequest is wrapped by Run for a request it refuses before starting a worker.
var ErrBadRequest = errors.New("sandbox: bad request")

// ErrUnavailable is wrapped by OpenSession for a session its backend cannot serve
// here under its policy (a native session where policy requires gVisor, or
// processes a root daemon cannot bound): nothing was started.
var ErrUnavailable = errors.New("sandbox: unavailable")

// Stop is a cause to cancel a run's context with (context.WithCancelCause) when the
// caller ends the run for a limit of its own, not as a cancel: the Result then has
// Reason and Detail as its one diagnostic instead of cancelled. The daemon's
// workspace quota is one (protocol.QuotaExceeded).
type Stop struct {
	Reason protocol.Reason
	Detail string
}

func (s *Stop) Error() string { return string(s.Reason) + ": " + s.Detail }

// stopCause is why ctx, which has ended, ended a run: its *Stop cause's reason and
// detail, or cancelled with no detail.
func stopCause(ctx context.Context) (protocol.Reason, string) {
	var stop *Stop
	if errors.As(context.Cause(ctx), &stop) {
		return stop.Reason, stop.Detail
	}
	return protocol.Cancelled, ""
}

type workerKey struct{}

// WithWorker returns ctx carrying f: RunStreaming calls f with the pid of the
// worker process that runs the guest, once it has one (a cold worker at its start,
// a warm one at its claim), so a caller can measure what that process holds (the
// daemon's quota counts the files it keeps open after deleting them).
func WithWorker(ctx context.Context, f func(pid int)) context.Context {
	return context.WithValue(ctx, workerKey{}, f)
}

// Spawner starts workers. The zero value is not usable: set Exe.
type Spawner struct {
	// Exe is the binary to re-execute as `Exe __worker`; normally "/proc/self/exe".
	Exe string
	// Protected are host directories that no workspace may contain or lie inside:
	// the bundle and the .cwasm cache, whose compiled code later runs outside
	// WebAssembly. The directory of each request's module is always protected.
	Protected []string
	// Private are host directories that no workspace may contain (or be), though
	// a workspace may lie inside one: a daemon's state directory, whose audit log,
	// socket and checkpoints are no guest's, and which holds the daemon's own
	// workspaces.
	Private []string
	// Command is the worker's argv[1]; empty means protocol.WorkerCommand. Tests use it to
	// start a test-only worker entry (the escape suite).
	Command string

	mu      sync.Mutex
	modules map[moduleKey]*os.File // sealed copies of modules, by file identity

	pool       atomic.Pointer[pool] // warm workers, or nil (see Warm)
	poolCounts poolCounts
	native     nativeWarm // warm native workers (see WarmNative)

	// GVisor is the runsc native runs go through where their policy requires the
	// gvisor layer; nil: such runs end rejected.
	GVisor *GVisor

	pidProbe  sync.Mutex
	pidProbed bool                   // the probe had a definite answer (see pidNamespace)
	pidRetry  time.Time              // after a probe without one, when to probe again
	pidnsErr  atomic.Pointer[string] // why workers get no pid namespace, or nil (see pidNamespace)

	netOnce sync.Once
	netns   *os.File // the empty network namespace workers share, or nil (see sharedNetns)
	hostNet *os.File // this process's own network namespace, to return to
}

// moduleKey identifies a module file's content as far as the file system tells.
type moduleKey struct {
	path             string
	dev, ino         uint64
	size, mtime, ctm int64
}

// sealedModule returns a sealed in-memory copy of the module at path (memfd_create(2)
// with F_SEAL_WRITE, F_SEAL_SHRINK, F_SEAL_GROW and F_SEAL_SEAL, see
// memfd_create(2) and fcntl(2)), made once per file identity and shared by every
// worker. A worker holds its module open for as long as it runs; were that the file
// in the bundle, a guest that escaped wasmtime could reopen it for writing through
// /proc/self/fd and rewrite the code every worker executes. Nobody can change a
// sealed memfd. The caller closes the descriptor it is given (its own: Forget or a
// replaced file closes only the spawner's).
func (s *Spawner) sealedModule(path string) (*os.File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return nil, err
	}
	key := moduleKey{path, uint64(st.Dev), st.Ino, st.Size, st.Mtim.Nano(), st.Ctim.Nano()}
	s.mu.Lock()
	defer s.mu.Unlock()
	if m, ok := s.modules[key]; ok {
		return dupFile(m)
	}
	m, err := sealedCopy("sandcell-module", func(m *os.File) error {
		if n, err := io.Copy(m, f); err != nil || n != st.Size {
			return fmt.Errorf("copy module: %d of %d bytes: %v", n, st.Size, err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if s.modules == nil {
		s.modules = map[moduleKey]*os.File{}
	}
	for k, old := range s.modules {
		if k.path == path { // the file was replaced: forget the old copy
			old.Close()
			delete(s.modules, k)
		}
	}
	s.modules[key] = m
	return dupFile(m)
}

// dupFile returns a new descriptor of f's open file, close-on-exec.
func dupFile(f *os.File) (*os.File, error) {
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("dup %s: %w", f.Name(), err)
	}
	return os.NewFile(uintptr(fd), f.Name()), nil
}

// ForgetExcept closes the spawner's sealed copies of modules (see sealedModule) but
// those of the files at keep: for modules new runs no longer use. A straggler that
// uses one still makes a copy again; workers that hold one keep their own
// descriptor.
func (s *Spawner) ForgetExcept(keep ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, m := range s.modules {
		if !slices.Contains(keep, k.path) {
			m.Close()
			delete(s.modules, k)
		}
	}
}

// sealedCopy returns a memfd named name holding what fill wrote to it, sealed
// against every change (F_SEAL_WRITE, F_SEAL_SHRINK, F_SEAL_GROW, F_SEAL_SEAL;
// memfd_create(2), fcntl(2)).
func sealedCopy(name string, fill func(*os.File) error) (*os.File, error) {
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("memfd_create: %w", err)
	}
	f := os.NewFile(uintptr(fd), name)
	if err := fill(f); err != nil {
		f.Close()
		return nil, err
	}
	if _, err := unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS,
		unix.F_SEAL_WRITE|unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		f.Close()
		return nil, fmt.Errorf("seal %s: %w", name, err)
	}
	return f, nil
}

// command is the worker's argv[1].
func (s *Spawner) command() string {
	if s.Command != "" {
		return s.Command
	}
	return protocol.WorkerCommand
}

// hostNamespaces returns this process's namespaces as the targets of /proc/self/ns/*
// links, for the worker to tell its own from the parent's.
func hostNamespaces() map[string]string {
	out := map[string]string{}
	for _, name := range protocol.Namespaces() {
		if link, err := os.Readlink("/proc/self/ns/" + name); err == nil {
			out[name] = link
		}
	}
	return out
}

func requiresNamespace(require []string) bool {
	for _, l := range require {
		if _, ok := protocol.Namespaces()[l]; ok {
			return true
		}
	}
	return false
}

// checkContract returns a message when a report says the guest ran (anything but
// rejected or an internal error before the run) while a required layer was missing.
func checkContract(rep protocol.Report, require []string) string {
	if rep.Reason == protocol.Rejected || len(require) == 0 {
		return ""
	}
	if rep.Enforcement == nil {
		if rep.Reason == protocol.InternalError {
			return ""
		}
		return "worker reported no enforcement contract"
	}
	if missing := rep.Enforcement.Missing(require); len(missing) > 0 {
		return fmt.Sprintf("worker ran without required layers %v", missing)
	}
	return ""
}

// workerExe is the lean worker's path once UseWorkerBinary has made it, else "";
// workerFile holds its memfd open (unreferenced, an os.File is closed when collected).
var (
	workerExe  atomic.Pointer[string]
	workerFile atomic.Pointer[os.File]
)

// UseWorkerBinary makes the spawners that NewSpawner returns from now on start
// workers from bin, an executable whose `__worker` verb is the worker (the daemon
// binary carries cmd/sandcell-worker, which links only the sandbox, so that a worker
// runs none of the daemon's package initialisers). bin is copied once into a sealed
// memfd (as the modules are, see sealedCopy) that workers execute as
// /proc/self/fd/N: the code that runs is the bytes linked into this binary, and
// nothing on disk can swap it, as with re-executing /proc/self/exe. It may be called
// once per process. Errors leave spawners re-executing the running binary.
func UseWorkerBinary(bin []byte) error {
	if workerExe.Load() != nil {
		return errors.New("the worker binary is already set")
	}
	m, err := sealedCopy("sandcell-worker", func(m *os.File) error {
		// Executable by the worker whatever the umask: in its user namespace it is
		// not the memfd's owner.
		if err := m.Chmod(0o555); err != nil {
			return fmt.Errorf("chmod worker memfd: %w", err)
		}
		_, err := m.Write(bin)
		return err
	})
	if err != nil {
		return err
	}
	defer m.Close()
	// Above the descriptors a worker is given (0-5), which a child's dup2 would
	// overwrite before its exec reads the path.
	high, err := unix.FcntlInt(m.Fd(), unix.F_DUPFD_CLOEXEC, 16)
	if err != nil {
		return fmt.Errorf("dup worker memfd: %w", err)
	}
	f := os.NewFile(uintptr(high), "sandcell-worker")
	exe := fmt.Sprintf("/proc/self/fd/%d", high)
	workerFile.Store(f) // open for the life of the process
	workerExe.Store(&exe)
	return nil
}

// NewSpawner returns the spawner of workers that run the lean worker (see
// UseWorkerBinary) or else re-execute the running binary, with protected (the bundle
// and its .cwasm cache, say) and the binary's own directory as Protected: a guest
// must not replace the binary that runs later workers either.
func NewSpawner(protected ...string) *Spawner {
	sp := &Spawner{Exe: "/proc/self/exe", Protected: protected}
	if exe := workerExe.Load(); exe != nil {
		sp.Exe = *exe
	}
	if exe, err := os.Executable(); err == nil {
		sp.Protected = append(sp.Protected, filepath.Dir(exe))
	}
	return sp
}

// Observer receives the guest's output as the parent reads it, in order per stream:
// stream is "stdout" or "stderr", and b, valid only during the call, holds exactly
// the bytes captured (nothing past a stream's cap, which the Result's truncation
// flags then say). It is called from the
// goroutines reading the streams, so it must not block for long.
type Observer func(stream string, b []byte)

// Run is RunStreaming without an observer.
func (s *Spawner) Run(ctx context.Context, req protocol.Request) (protocol.Result, error) {
	return s.RunStreaming(ctx, req, nil)
}

// RunStreaming executes req in a worker (a warm one from the pool when one matches,
// see Warm, else a new one) and returns the Result. With an observer, the Result's
// Stdout and Stderr are empty: observe was given every byte, so the output is held
// once, by the observer. req.Limits must be complete (see policy.Resolve).
// Cancelling ctx kills the worker and ends the run as cancelled, or as its *Stop
// cause says.
// The error is non-nil only when no run took place (bad request, the worker could
// not be started); every outcome of a run, failures included, is a Result.
func (s *Spawner) RunStreaming(ctx context.Context, req protocol.Request, observe Observer) (protocol.Result, error) {
	res, err := s.runStreaming(ctx, req, observe)
	if why := s.pidnsErr.Load(); why != nil && res.Enforcement != nil && !res.Enforcement.Namespaces[protocol.LayerPidNS] {
		if res.Enforcement.Errors == nil {
			res.Enforcement.Errors = map[string]string{}
		}
		res.Enforcement.Errors[protocol.LayerPidNS] = *why
	}
	return res, err
}

// pidNamespace reports whether workers get a pid namespace of their own. A worker
// in one must mount a procfs of it, which the kernel refuses under a container's
// masked /proc (podman's and Docker's defaults; mount_too_revealing in
// fs/namespace.c); a worker that only tries (protocol.ProbeProcfs) finds out and, if
// the kernel refuses, later workers keep the parent's pid namespace, and the
// enforcement contract says why (pidns inactive). Only the kernel's answer is kept:
// a probe that ends otherwise (killed at its timeout on a loaded machine, out of
// processes) decides nothing, this worker gets a pid namespace anyway (its own
// verification rejects a run that requires one it cannot have), and a launch
// pidProbeBackoff later probes again. Where even the other namespaces are refused, launch's caller goes
// on without any.
func (s *Spawner) pidNamespace() bool {
	s.pidProbe.Lock()
	defer s.pidProbe.Unlock()
	if s.pidProbed || time.Now().Before(s.pidRetry) {
		return s.pidnsErr.Load() == nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, s.Exe, s.command(), protocol.ProbeProcfs)
	cmd.Args[0] = "sandcell"
	cmd.Env = []string{}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	cmd.SysProcAttr = namespaceAttr(true, false)
	err := cmd.Start()
	if err != nil && !errors.Is(err, syscall.EAGAIN) && !errors.Is(err, syscall.ENOMEM) {
		s.pidProbed = true // no namespaces at all: RunStreaming's fallback handles that
		return true
	}
	if err == nil {
		err = cmd.Wait()
	}
	var exit *exec.ExitError
	switch {
	case err == nil:
		s.pidProbed = true
	case errors.As(err, &exit) && exit.ExitCode() == protocol.ProbeRefused:
		s.pidProbed = true
		why := fmt.Sprintf("no pid namespace: a procfs of one cannot be mounted here (%s); under a container's masked /proc "+
			"podman and docker run --security-opt unmask=/proc/* allow it", strings.TrimSpace(stderr.String()))
		s.pidnsErr.Store(&why)
	default:
		// No answer (out of processes or memory, killed, crashed): launches go on
		// with a pid namespace, without waiting on another probe for a while.
		s.pidRetry = time.Now().Add(pidProbeBackoff)
	}
	return s.pidnsErr.Load() == nil
}

// pidProbeBackoff is how long launches after a probe without an answer wait before
// another probe: they go on with a pid namespace meanwhile.
const pidProbeBackoff = 10 * time.Second

// namespaceAttr returns the clone attributes of a worker in new user, mount,
// network, IPC and UTS namespaces, and a pid namespace when pid is true: uid and gid
// 0 inside mapped to the parent's own, setgroups denied (user_namespaces(7)). The
// worker cannot unshare a user namespace itself (it is multithreaded from its first
// instruction), so it is cloned into them. With sharedNet, the network namespace is
// not new: the worker is cloned from a thread that has joined the shared one (see
// sharedNetns).
func namespaceAttr(pid, sharedNet bool) *syscall.SysProcAttr {
	attr := &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL,
		Cloneflags:  syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS | syscall.CLONE_NEWNET | syscall.CLONE_NEWIPC | syscall.CLONE_NEWUTS,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getuid(), Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getgid(), Size: 1}}}
	if pid {
		attr.Cloneflags |= syscall.CLONE_NEWPID
	}
	if sharedNet {
		attr.Cloneflags &^= syscall.CLONE_NEWNET
	}
	return attr
}

// sharedNetns returns the empty network namespace this spawner's workers join
// instead of each creating its own (creating one takes a kernel-wide lock: 0.6-1.3
// ms at the median on a 2-core VM, with tails of 24-98 ms), made once, and this
// process's own; nil when it cannot be made (it needs CAP_SYS_ADMIN: an unprivileged
// daemon's workers create their own). It holds nothing but a loopback device that
// is down, and no worker can change that (its capabilities are in its own user
// namespace, not the one that owns this network namespace) or open a socket in it
// (launch shares it only with workers whose seccomp filter denies socket(2)), so
// sharing it gives workers no way to reach each other: a guest sees what it would
// see in a new one.
func (s *Spawner) sharedNetns() (netns, host *os.File) {
	s.netOnce.Do(func() {
		done := make(chan struct{})
		go func() {
			defer close(done)
			// This thread ends with its goroutine (no UnlockOSThread): it is the only
			// one that leaves this process's network namespace.
			runtime.LockOSThread()
			h, err := os.Open("/proc/thread-self/ns/net")
			if err != nil {
				return
			}
			if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
				h.Close()
				return
			}
			n, err := os.Open("/proc/thread-self/ns/net")
			if err != nil {
				h.Close()
				return
			}
			s.netns, s.hostNet = n, h
		}()
		<-done
	})
	return s.netns, s.hostNet
}

func (s *Spawner) runStreaming(ctx context.Context, req protocol.Request, observe Observer) (protocol.Result, error) {
	if err := check(&req); err != nil {
		return protocol.Result{}, err
	}
	wsDir, err := s.prepare(&req)
	if err != nil {
		return protocol.Result{}, err
	}
	defer wsDir.Close()

	var res protocol.Result
	if req.Backend == protocol.BackendNative {
		res, err = s.runNative(ctx, req, wsDir, observe)
	} else {
		res, err = s.runWasm(ctx, req, wsDir, observe)
	}
	if err != nil {
		return res, err
	}
	var diags []string
	res.Displays, diags = checkDisplays(wsDir, res.Displays) // as the guest named them: checked here
	res.Diagnostics = append(res.Diagnostics, diags...)
	return res, nil
}

// runWasm runs req on the wasm backend: a warm worker of the pool, else a cold one.
// Its displays are as the guest named them.
func (s *Spawner) runWasm(ctx context.Context, req protocol.Request, wsDir *os.File, observe Observer) (protocol.Result, error) {
	if w := s.pooled(&req); w != nil {
		if res, ran, err := s.runWarm(ctx, w, req, observe); ran {
			return res, err
		}
		req.Roots = nil // the worker was gone: cold
	}
	frame, err := protocol.Encode(protocol.Frame{Step: protocol.StepRun, Request: &req})
	if err != nil {
		return protocol.Result{}, fmt.Errorf("%w: %v (code, stdin and arguments together)", ErrBadRequest, err)
	}
	path, _ := req.RunModule()
	module, err := s.sealedModule(path)
	if err != nil {
		return protocol.Result{}, fmt.Errorf("sandbox: module: %w", err)
	}
	defer module.Close()
	p, err := s.launch(req.Hardening.Namespaces, req.Hardening.SharedNetwork, wsDir, module, nil)
	var nsErr error
	if err != nil && req.Hardening.Namespaces && !requiresNamespace(req.Hardening.Require) {
		// Namespaces refused (a container's default profile, userns disabled):
		// go on without them when policy allows; the contract will say so.
		nsErr = err
		req.Hardening.Namespaces, req.Hardening.SharedNetwork = false, false
		if frame, err = protocol.Encode(protocol.Frame{Step: protocol.StepRun, Request: &req}); err == nil {
			p, err = s.launch(false, false, wsDir, module, nil)
		}
	}
	if err != nil {
		if req.Hardening.Namespaces {
			return protocol.Result{ExitCode: -1, Reason: protocol.Rejected, Diagnostics: []string{
				"cannot start the worker in new user, network, mount, pid, IPC and UTS namespaces (" + err.Error() +
					"), which policy requires; no code was run. Where the kernel or a container forbids them, a policy " +
					"whose require list leaves out userns, netns, mntns, pidns, ipcns and utsns runs without them"}}, nil
		}
		return protocol.Result{}, fmt.Errorf("sandbox: start worker: %w", err)
	}
	res := p.collect(ctx, frame, req, observe)
	if res.Enforcement != nil && nsErr != nil {
		if res.Enforcement.Errors == nil {
			res.Enforcement.Errors = map[string]string{}
		}
		res.Enforcement.Errors[protocol.LayerUserNS] = "cannot create namespaces: " + nsErr.Error()
	}
	return res, nil
}

// prepare opens and checks req's workspace (the caller closes it) and completes
// req for a worker: the workspace as the kernel names what was checked, its
// identity, the host's namespaces, and whether the worker shares the network
// namespace.
func (s *Spawner) prepare(req *protocol.Request) (*os.File, error) {
	protected := []string{filepath.Dir(req.ModulePath), req.LibDir}
	if req.EpochlessModulePath != "" {
		protected = append(protected, filepath.Dir(req.EpochlessModulePath))
	}
	if req.Backend == protocol.BackendNative {
		protected = []string{req.RootDir}
	}
	wsDir, err := openWorkspace(req.Workspace, append(protected, s.Protected...), s.Private)
	if err != nil {
		return nil, err
	}
	// The worker reopens the workspace by path inside its mount namespace (and checks
	// it is this directory): give it the kernel's path of what was checked.
	if p, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", wsDir.Fd())); err == nil {
		req.Workspace = p
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(wsDir.Fd()), &st); err != nil {
		wsDir.Close()
		return nil, fmt.Errorf("sandbox: workspace: %w", err)
	}
	req.WorkspaceID = &protocol.FileID{Dev: uint64(st.Dev), Ino: st.Ino}
	req.Hardening.HostNamespaces = hostNamespaces()
	req.Hardening.SharedNetwork = s.shareNetwork(req.Hardening)
	return wsDir, nil
}

// proc is a started worker.
type proc struct {
	cmd        *exec.Cmd
	ctl        *os.File // the parent's end of the control socket
	outR, errR *os.File // the guest's stdout and stderr
	// tools is the parent's end of the tools channel, toolsChild the worker's
	// (protocol.ToolsFD), closed once the worker has started.
	tools, toolsChild *os.File
	started           time.Time

	mu     sync.Mutex
	gone   bool          // exited: its pid may be reused once reaped, so never signal it again
	exited chan struct{} // closed when reaped; then cmd.ProcessState is set
	werr   error         // cmd.Wait's error

	claimed atomic.Bool // a warm worker taken for a run

	// execd is the contract of a warm native worker, which became its guest before
	// the run was known (see runNativeWarm); nil for every other worker.
	execd *protocol.Report
	// reported says that the guest's runner sent its report (collect sets it).
	reported bool
}

// launch starts a worker (in new namespaces when asked) with fds 3, 4, 5 the control
// socket, dir and module, and reaps it in the background. The goroutine that forks
// stays on its thread until the worker is reaped: Linux sends the parent-death signal
// when the thread that forked the child exits.
// shareNetwork says whether a worker hardened with h joins the shared network
// namespace: it asks for namespaces and a seccomp filter that denies socket(2), and
// the namespace exists.
func (s *Spawner) shareNetwork(h protocol.Hardening) bool {
	if !h.Namespaces || h.Seccomp == nil || !protocol.DeniesSyscall(*h.Seccomp, "socket") {
		return false
	}
	n, _ := s.sharedNetns()
	return n != nil
}

// launch starts a worker, in new namespaces when namespaces is true (sharing the
// empty network namespace when shareNet is true and one exists, see sharedNetns),
// with stdin as its fd 0 (nil: /dev/null).
func (s *Spawner) launch(namespaces, shareNet bool, dir, module, stdin *os.File) (*proc, error) {
	p, childCtl, outW, errW, err := newProc()
	if err != nil {
		return nil, err
	}
	defer childCtl.Close()
	defer outW.Close()
	defer errW.Close()

	attr := &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL}
	var netns, hostNet *os.File
	if namespaces {
		if shareNet {
			netns, hostNet = s.sharedNetns()
		}
		attr = namespaceAttr(s.pidNamespace(), netns != nil)
	}
	defer p.toolsChild.Close()
	p.cmd = &exec.Cmd{
		Path:   s.Exe,
		Args:   []string{"sandcell", s.command()},
		Env:    []string{}, // built from nothing: no NOTIFY_SOCKET, LISTEN_*, secrets
		Stdout: outW,
		Stderr: errW,
		// fds 3, 4, 5, 6: protocol.ControlFD, WorkspaceFD, ModuleFD, ToolsFD
		ExtraFiles:  []*os.File{childCtl, dir, module, p.toolsChild},
		SysProcAttr: attr,
	}
	if stdin != nil {
		p.cmd.Stdin = stdin // (a nil *os.File would not be /dev/null)
	}
	if err := p.start(netns, hostNet); err != nil {
		return nil, err
	}
	return p, nil
}

// newProc returns a proc not yet started: the parent's end of its control socket
// pair (p.ctl) and of its stdout and stderr pipes, and the child's ends, which the
// caller gives the process and then closes.
func newProc() (p *proc, childCtl, outW, errW *os.File, err error) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, nil, nil, fmt.Errorf("socketpair: %w", err)
	}
	p = &proc{ctl: os.NewFile(uintptr(fds[0]), "control"), exited: make(chan struct{})}
	childCtl = os.NewFile(uintptr(fds[1]), "control-child")
	if p.outR, outW, err = os.Pipe(); err == nil {
		if p.errR, errW, err = os.Pipe(); err != nil {
			p.outR.Close()
			outW.Close()
		} else if p.tools, p.toolsChild, err = toolsPair(); err != nil {
			p.outR.Close()
			outW.Close()
			p.errR.Close()
			errW.Close()
		}
	}
	if err != nil {
		p.ctl.Close()
		childCtl.Close()
		return nil, nil, nil, nil, fmt.Errorf("pipe: %w", err)
	}
	return p, childCtl, outW, errW, nil
}

// start starts p.cmd from a goroutine locked to its thread, which stays until the
// process is reaped (Linux sends the parent-death signal when the thread that forked
// the child exits), in the network namespace netns when not nil (returning to
// hostNet), and marks p gone before reaping it. When it cannot start, p's ends of
// its channels are closed.
func (p *proc) start(netns, hostNet *os.File) error {
	startErr := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if netns != nil {
			// The child is cloned in this thread's network namespace.
			if err := unix.Setns(int(netns.Fd()), unix.CLONE_NEWNET); err != nil {
				runtime.UnlockOSThread()
				startErr <- fmt.Errorf("join the shared network namespace: %w", err)
				return
			}
		}
		err := p.cmd.Start()
		// Back to this process's namespace; a thread that cannot return ends with
		// this goroutine instead of serving others (no UnlockOSThread). While it is
		// locked, the Go runtime starts new threads from its template thread, never
		// from this one (runtime.LockOSThread).
		if netns == nil || unix.Setns(int(hostNet.Fd()), unix.CLONE_NEWNET) == nil {
			defer runtime.UnlockOSThread()
		}
		startErr <- err
		if err != nil {
			return
		}
		// Wait for the exit without reaping (WNOWAIT), mark the worker gone, then
		// reap: a signal sent while not gone reaches this worker, never a process
		// that reused its pid.
		var info unix.Siginfo
		for unix.Waitid(unix.P_PID, p.cmd.Process.Pid, &info, unix.WEXITED|unix.WNOWAIT, nil) == unix.EINTR {
		}
		p.mu.Lock()
		p.gone = true
		p.mu.Unlock()
		p.werr = p.cmd.Wait()
		close(p.exited)
	}()
	p.started = time.Now()
	if err := <-startErr; err != nil {
		p.ctl.Close()
		p.outR.Close()
		p.errR.Close()
		p.tools.Close()
		return err
	}
	return nil
}

// kill sends SIGKILL to the worker's process group (it is a session leader) unless
// it has exited.
func (p *proc) kill() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.gone {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	}
}

// signalGroup sends sig to the worker's process group (it is a session leader) unless
// it has exited.
func (p *proc) signalGroup(sig syscall.Signal) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.gone {
		_ = syscall.Kill(-p.cmd.Process.Pid, sig)
	}
}

// collect sends frame (the request; nil when sent already), reads the guest's
// output and the report, and makes the Result. The worker owns nothing after: it is
// killed if it has not exited.
func (p *proc) collect(ctx context.Context, frame []byte, req protocol.Request, observe Observer) protocol.Result {
	if f, ok := ctx.Value(workerKey{}).(func(int)); ok {
		f(p.cmd.Process.Pid)
	}
	defer p.ctl.Close()
	defer p.kill()
	dl := newDeadline(time.Duration(req.Limits.TimeoutMS) * time.Millisecond)
	defer dl.Stop()
	calls, endCalls := context.WithCancel(ctx) // a call waiting when the run ends is ended
	defer endCalls()
	p.serveTools(calls, dl)
	defer p.tools.Close()
	var once sync.Once
	var killReason protocol.Reason
	kill := func(r protocol.Reason) {
		once.Do(func() {
			killReason = r
			p.kill()
		})
	}

	var wg sync.WaitGroup
	waited := make(chan struct{})
	stdout, stderr := capture{stream: "stdout", observe: observe}, capture{stream: "stderr", observe: observe}
	wg.Add(3)
	go func() { defer wg.Done(); stdout.read(p.outR, req.Limits.MaxStdoutBytes, kill) }()
	go func() { defer wg.Done(); stderr.read(p.errR, req.Limits.MaxStderrBytes, kill) }()
	var rep protocol.Report
	var repErr error
	var execd bool                // the worker became the guest (native): rep holds the contract alone
	var guestRep *protocol.Report // what the guest's runner said (untrusted), if anything
	go func() {
		defer wg.Done()
		if p.execd != nil {
			// A warm native worker: its contract came before the run (see
			// runNativeWarm); its runner's report follows the program.
			rep, execd = *p.execd, true
			if g, err := protocol.ReceiveMax(p.ctl, protocol.MaxGuestFrame, protocol.StepReport); err == nil {
				guestRep = g.Report
			}
			return
		}
		if frame != nil {
			if _, err := p.ctl.Write(frame); err != nil {
				repErr = err
				kill(protocol.InternalError) // the worker would wait for its request forever
				return
			}
		}
		var f protocol.Frame
		if f, repErr = protocol.Receive(p.ctl, protocol.StepReport, protocol.StepExec); repErr != nil {
			return
		}
		rep = *f.Report
		if f.Step == protocol.StepExec {
			// The guest's own process from here (see protocol.StepExec): at most
			// one report of its runner's, read until the process ends.
			execd = true
			if g, err := protocol.ReceiveMax(p.ctl, protocol.MaxGuestFrame, protocol.StepReport); err == nil {
				guestRep = g.Report
			}
			return
		}
		// A worker closes its output before it reports; one that did not (it
		// crashed half-way) is ended now, so the reads end.
		go func() {
			select {
			case <-time.After(time.Second):
				p.kill()
			case <-waited:
			}
		}()
	}()

	go func() { wg.Wait(); close(waited) }()
	var stopDetail string
	select {
	case <-waited:
	case <-dl.C:
		kill(protocol.Timeout)
	case <-ctx.Done():
		var why protocol.Reason
		why, stopDetail = stopCause(ctx)
		kill(why)
	}
	<-waited
	elapsed := time.Since(p.started)

	res := protocol.Result{
		Stdout:          stdout.buf,
		Stderr:          stderr.buf,
		StdoutTruncated: stdout.truncated,
		StderrTruncated: stderr.truncated,
		ElapsedMS:       float64(elapsed.Microseconds()) / 1000,
	}
	exitState := func() *os.ProcessState {
		<-p.exited
		return p.cmd.ProcessState
	}
	switch {
	case stdout.truncated || stderr.truncated:
		// Output was cut: the run ends output_limit even if the worker managed to
		// finish before it was killed, so the same program always ends the same way.
		res.ExitCode = -1
		res.Reason = protocol.OutputLimit
	case repErr == nil && !execd:
		res.ExitCode = rep.ExitCode
		res.Reason = rep.Reason
		res.FuelConsumed = rep.FuelConsumed
		res.PeakMemoryBytes = rep.PeakMemoryBytes
		res.Diagnostics = rep.Diagnostics
		res.Enforcement = rep.Enforcement
		res.WorkerMaxRSSBytes = rep.PeakRSSBytes
		res.Displays = rep.Displays // unchecked: runStreaming checks them
		if missing := checkContract(rep, req.Hardening.Require); missing != "" {
			// The worker ran code without a required layer: never report that as a
			// normal outcome.
			res.ExitCode = -1
			res.Reason = protocol.InternalError
			res.Diagnostics = append(res.Diagnostics, missing)
		}
	case killReason == protocol.InternalError:
		res.ExitCode = -1
		res.Reason = killReason
		res.Diagnostics = []string{"could not send the request to the worker: " + repErr.Error()}
	case killReason != "":
		res.ExitCode = -1
		res.Reason = killReason
		if stopDetail != "" {
			res.Diagnostics = []string{stopDetail}
		}
	case execd:
		p.reported = guestRep != nil
		guestEnded(&res, exitState(), guestRep, req)
		if missing := checkContract(rep, req.Hardening.Require); missing != "" {
			res.ExitCode = -1
			res.Reason = protocol.InternalError
			res.Diagnostics = append(res.Diagnostics, missing)
		}
	case cpuBackstop(exitState(), req.Hardening.Rlimits.CPU):
		res.ExitCode = -1
		res.Reason = protocol.CPULimit
		res.Diagnostics = []string{fmt.Sprintf("the worker reached its CPU-time backstop (RLIMIT_CPU, %d s)", req.Hardening.Rlimits.CPU)}
	default:
		exitState()
		res.ExitCode = -1
		res.Reason = protocol.InternalError
		res.Diagnostics = []string{"worker ended without a report: " + describeExit(p.werr)}
	}
	if execd {
		// The contract the worker verified before it became the guest holds however
		// the run ended.
		res.Enforcement = rep.Enforcement
		if guestRep != nil {
			res.Displays = guestRep.Displays // unchecked: runStreaming checks them
		}
	}
	if res.WorkerMaxRSSBytes == 0 {
		if ru, ok := exitState().SysUsage().(*syscall.Rusage); ok {
			res.WorkerMaxRSSBytes = ru.Maxrss << 10 // ru_maxrss is in KiB on Linux
			if execd {
				res.PeakMemoryBytes = res.WorkerMaxRSSBytes
			}
		}
	}
	return res
}

// guestEnded fills res from how a native guest's process ended (ps) and what its
// runner reported (rep, untrusted: only a MemoryError for a program that ended with
// status 1 is taken from it, the one thing the exit status cannot say, and which the
// program could as well have raised itself; the worker that cannot exec the
// interpreter says so on stderr and exits 127).
func guestEnded(res *protocol.Result, ps *os.ProcessState, rep *protocol.Report, req protocol.Request) {
	ws, _ := ps.Sys().(syscall.WaitStatus)
	switch {
	case ws.Exited():
		res.ExitCode, res.Reason = ws.ExitStatus(), protocol.Exited
		if rep != nil && rep.Reason == protocol.MemoryLimit && res.ExitCode == 1 {
			res.Reason = protocol.MemoryLimit
			res.Diagnostics = []string{fmt.Sprintf("the program ran out of memory: an allocation was refused "+
				"(uncaught MemoryError; private memory limit %d MiB, RLIMIT_DATA)", req.Hardening.Rlimits.DATA>>20)}
		}
	case cpuBackstop(ps, req.Hardening.Rlimits.CPU):
		res.ExitCode, res.Reason = -1, protocol.CPULimit
		res.Diagnostics = []string{fmt.Sprintf("the program used its CPU time (RLIMIT_CPU, %d s)", req.Hardening.Rlimits.CPU)}
	case ws.Signaled():
		res.ExitCode, res.Reason = -1, protocol.Trap
		res.Diagnostics = []string{fmt.Sprintf("the interpreter was killed by signal %d (%s)", int(ws.Signal()), ws.Signal())}
	default:
		res.ExitCode, res.Reason = -1, protocol.InternalError
		res.Diagnostics = []string{"the interpreter ended without an exit status"}
	}
}

// runNative runs req on the native backend: under runsc where policy requires
// gVisor (runGVisor), else a warm native worker prepared for its workspace and
// policy (see WarmNative), else a cold one, which hardens itself and becomes the
// guest (see protocol.StepExec). Namespaces are not optional here: the worker's own
// mount namespace is what gives the guest the native root. Its displays are as the
// guest named them.
func (s *Spawner) runNative(ctx context.Context, req protocol.Request, wsDir *os.File, observe Observer) (protocol.Result, error) {
	if why := unboundedProcesses(req.Hardening); why != "" {
		return rejected(why), nil
	}
	if slices.Contains(req.Hardening.Require, protocol.LayerGVisor) {
		return s.runGVisor(ctx, req, wsDir, observe)
	}
	frame, err := protocol.Encode(protocol.Frame{Step: protocol.StepRun, Request: &req})
	if err != nil {
		return protocol.Result{}, fmt.Errorf("%w: %v (code, stdin and arguments together)", ErrBadRequest, err)
	}
	// Whichever way it runs, the next native run in this workspace may find a warm
	// worker prepared once this one has ended.
	defer s.warmNativeAfter(req)
	res, ran := protocol.Result{}, false
	if w := s.takeNative(&req, wsDir); w != nil {
		res, ran = s.runNativeWarm(ctx, w, req, observe)
	}
	if !ran {
		p, err := s.launch(true, req.Hardening.SharedNetwork, wsDir, nil, nil)
		if err != nil {
			return rejected("cannot start the worker in new user, network, mount, pid, IPC and UTS namespaces (" +
				err.Error() + "), without which the native backend cannot run; no code was run"), nil
		}
		res = p.collect(ctx, frame, req, observe)
	}
	return res, nil
}

// unboundedProcesses says why a native guest allowed processes (h.Processes) could
// start them without bound here, or "". RLIMIT_NPROC, counted per user, is their
// bound, and setrlimit(2) says it is "not enforced for processes that ... run with
// real user ID 0": a worker of a root daemon is the root user outside its
// namespace, and a fork bomb in it would fill the host. Such runs are refused
// (no code runs) rather than run unbounded: run the daemon as its own user, as the
// packages do, or keep native.processes off.
func unboundedProcesses(h protocol.Hardening) string {
	if !h.Processes || os.Geteuid() != 0 {
		return ""
	}
	return "the native backend's processes are bounded by RLIMIT_NPROC, which does not bind the root user, and " +
		"this daemon runs as root: a guest could start processes without end, so none is run. Run the daemon " +
		"as an unprivileged user (the packages do) or turn native.processes off"
}

// check refuses requests that cannot be run before a worker is spent on them.
func check(req *protocol.Request) error {
	switch req.Backend {
	case "", protocol.BackendWasm:
		if req.ModulePath == "" || req.LibDir == "" || req.Workspace == "" {
			return fmt.Errorf("%w: module path, library directory and workspace are required", ErrBadRequest)
		}
	case protocol.BackendNative:
		if req.RootDir == "" || req.Workspace == "" {
			return fmt.Errorf("%w: the native root and the workspace are required", ErrBadRequest)
		}
		if req.Limits.Fuel > 0 {
			return fmt.Errorf("%w: fuel is counted by the wasm engine; the native backend has none", ErrBadRequest)
		}
	default:
		return fmt.Errorf("%w: unknown backend %q (known: %s)", ErrBadRequest, req.Backend, strings.Join(protocol.Backends(), ", "))
	}
	if req.Code != "" && req.Path != "" {
		return fmt.Errorf("%w: give code or path, not both", ErrBadRequest)
	}
	if req.Isolated && req.Path != "" {
		return fmt.Errorf("%w: an isolated program is code, not a path in the workspace", ErrBadRequest)
	}
	if req.Path != "" {
		clean := path.Clean(req.Path)
		if path.IsAbs(req.Path) || clean == ".." || strings.HasPrefix(clean, "../") || clean == "." {
			return fmt.Errorf("%w: path must be a file name relative to the workspace", ErrBadRequest)
		}
		req.Path = clean
	}
	if err := CheckProgram(req); err != nil {
		return err
	}
	l := req.Limits
	if l.TimeoutMS <= 0 || l.MemoryBytes <= 0 || l.MaxStdoutBytes <= 0 || l.MaxStderrBytes <= 0 {
		return fmt.Errorf("%w: limits are incomplete", ErrBadRequest)
	}
	return nil
}

// CheckProgram refuses code, arguments, environment or stdin that no worker can run
// as given: NUL bytes (argv cannot carry them), code that is not UTF-8 (Python source
// is, PEP 3120), arguments or environment that are not UTF-8 (the request is JSON),
// stdin over half a frame. Errors wrap ErrBadRequest. Callers may use it to refuse a
// request before admitting it.
func CheckProgram(req *protocol.Request) error {
	if strings.ContainsRune(req.Code, 0) {
		return fmt.Errorf("%w: code contains a NUL byte", ErrBadRequest)
	}
	if !utf8.ValidString(req.Code) {
		// Python source is UTF-8 (PEP 3120); argv cannot carry other bytes faithfully.
		return fmt.Errorf("%w: code is not valid UTF-8", ErrBadRequest)
	}
	if strings.ContainsRune(req.Path, 0) || !utf8.ValidString(req.Path) {
		return fmt.Errorf("%w: path is not NUL-free UTF-8", ErrBadRequest)
	}
	for _, a := range append(req.Args, req.Filename) {
		if strings.ContainsRune(a, 0) {
			return fmt.Errorf("%w: an argument contains a NUL byte", ErrBadRequest)
		}
		if !utf8.ValidString(a) {
			// The request travels as JSON, which would replace the bytes with U+FFFD:
			// the program would see other arguments than those given.
			return fmt.Errorf("%w: an argument is not valid UTF-8", ErrBadRequest)
		}
	}
	for k, v := range req.Env {
		if strings.ContainsRune(k+v, 0) || !utf8.ValidString(k+v) {
			return fmt.Errorf("%w: environment variable %q is not NUL-free UTF-8", ErrBadRequest, k)
		}
		if k == "" || strings.ContainsRune(k, '=') {
			// environ(7): NAME=value, where the first '=' ends the name.
			return fmt.Errorf("%w: environment variable name %q is empty or holds '='", ErrBadRequest, k)
		}
	}
	if len(req.Stdin) > protocol.MaxFrame/2 {
		return fmt.Errorf("%w: stdin is larger than %d bytes", ErrBadRequest, protocol.MaxFrame/2)
	}
	return nil
}

// resolve returns p made absolute with every symbolic link resolved; for a path that
// does not exist, its deepest existing ancestor is resolved and the rest appended.
func resolve(p string) (string, error) {
	abs, err := filepath.Abs(p)
	if err != nil {
		return "", err
	}
	if real, err := filepath.EvalSymlinks(abs); err == nil {
		return real, nil
	}
	parent := filepath.Dir(abs)
	if parent == abs {
		return abs, nil
	}
	real, err := resolve(parent)
	if err != nil {
		return "", err
	}
	return filepath.Join(real, filepath.Base(abs)), nil
}

// within reports whether path is dir or lies beneath it (both absolute and clean). It
// answers yes when it cannot tell.
func within(path, dir string) bool {
	rel, err := filepath.Rel(dir, path)
	return err != nil || (rel != ".." && !strings.HasPrefix(rel, "../"))
}

// cpuBackstop reports whether the worker was killed by its RLIMIT_CPU (SIGXCPU at
// the soft limit, SIGKILL at the hard one, setrlimit(2)): killed by one of those
// signals, not by the parent, after using at least limit seconds of CPU.
func cpuBackstop(ps *os.ProcessState, limit uint64) bool {
	ws, ok := ps.Sys().(syscall.WaitStatus)
	if limit == 0 || !ok || !ws.Signaled() || (ws.Signal() != syscall.SIGKILL && ws.Signal() != syscall.SIGXCPU) {
		return false
	}
	return ps.UserTime()+ps.SystemTime() >= time.Duration(limit)*time.Second
}

func describeExit(err error) string {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return fmt.Sprintf("killed by signal %d (%s)", int(ws.Signal()), ws.Signal())
		}
		return fmt.Sprintf("exit status %d", ee.ExitCode())
	}
	if err != nil {
		return err.Error()
	}
	return "exit status 0"
}

// capture reads one output stream, keeping at most max bytes.
type capture struct {
	stream    string
	observe   Observer // or nil
	buf       []byte   // the output, when there is no observer
	n         int64    // bytes captured
	truncated bool
}

// smallRead, smallReads and coalesce: after smallReads reads in a row shorter than
// smallRead, a streaming capture waits coalesce before each further read, so a
// guest's flood of tiny writes reaches the observer as a few larger pieces (300,000
// one-byte writes had made up to 149,000), while a program that prints a line or
// two is not delayed at all.
const (
	smallRead  = 4 << 10
	smallReads = 8
	coalesce   = 2 * time.Millisecond
)

// read copies r into c.buf, or to c.observe when there is one (which then holds the
// only copy), until EOF. Past max bytes it marks the stream truncated, asks for the
// worker to be killed, and discards the rest, so memory stays bounded.
func (c *capture) read(r io.ReadCloser, max int64, kill func(protocol.Reason)) {
	defer r.Close()
	chunk := make([]byte, 32<<10)
	small := 0
	for {
		n, err := r.Read(chunk)
		if n > 0 && !c.truncated {
			kept := chunk[:n]
			if room := max - c.n; int64(n) > room {
				kept = chunk[:room]
				c.truncated = true
				kill(protocol.OutputLimit)
			}
			c.n += int64(len(kept))
			switch {
			case c.observe == nil:
				c.buf = append(c.buf, kept...)
			case len(kept) > 0:
				c.observe(c.stream, kept)
			}
		}
		if err != nil {
			return
		}
		if small = small + 1; n >= smallRead {
			small = 0
		}
		if c.observe != nil && small >= smallReads {
			time.Sleep(coalesce)
		}
	}
}
