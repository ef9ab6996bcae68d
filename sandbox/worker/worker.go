// Package worker is the body of a worker process (`sandcell __worker`): it reads its
// run from the control fd (at once, or as a claim after a template), runs a fresh
// instance of the interpreter's snapshot (see bundle) through the engine with the
// workspace preopened as /ws, and writes one Report back.
// See sandbox/protocol for the exchange. The files follow its phases: worker.go the
// entry, the cold path and what both paths share; harden.go prepare and narrow;
// warm.go the warm path (template, ready, claim, ack); guest.go the guest's run.
//
// The worker's own stdout and stderr are the guest's: it never writes to them itself.
// Everything it has to say goes into the Report.
package worker

import (
	_ "embed"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/sandcell/sandcell/sandbox/engine"
	"github.com/sandcell/sandcell/sandbox/protocol"
)

// The guest runs on the process's main thread, whose stack the worker sizes itself
// (sizeStacks). Locking in init is the one way Go guarantees that main() runs on the
// main thread; for programs that are not the worker it only pins their main goroutine.
func init() { runtime.LockOSThread() }

// Stack sizes: the main thread's stack may grow to RLIMIT_STACK, which the worker
// raises to mainStackTarget where the hard limit allows; the wasm stack gets all but
// hostStackMargin of it (for wasmtime's and WASI's own frames), at most maxWasmStack.
const (
	mainStackTarget = 64 << 20
	hostStackMargin = 4 << 20
	maxWasmStack    = 8 << 20 // what CPython's own WASI test runs use
	minWasmStack    = 1 << 20
)

// sizeStacks raises this process's RLIMIT_STACK soft limit towards mainStackTarget
// (the main thread's stack grows on demand up to the soft limit in force) and returns
// the wasm stack that fits in it with room for the host's frames.
func sizeStacks() int {
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_STACK, &lim); err != nil {
		return minWasmStack
	}
	if lim.Cur != unix.RLIM_INFINITY && lim.Cur < mainStackTarget {
		want := uint64(mainStackTarget)
		if lim.Max != unix.RLIM_INFINITY && lim.Max < want {
			want = lim.Max
		}
		if want > lim.Cur {
			lim.Cur = want
			if unix.Setrlimit(unix.RLIMIT_STACK, &lim) != nil {
				unix.Getrlimit(unix.RLIMIT_STACK, &lim)
			}
		}
	}
	avail := uint64(mainStackTarget)
	if lim.Cur != unix.RLIM_INFINITY && lim.Cur < avail {
		avail = lim.Cur
	}
	stack := int64(avail) - hostStackMargin
	switch {
	case stack > maxWasmStack:
		return maxWasmStack
	case stack < minWasmStack:
		// Little stack: a quarter of it for wasm still traps cleanly (deep
		// recursion ends as a trap, never SIGSEGV).
		return int(avail / 4)
	}
	return int(stack)
}

// Main is the worker: it runs one request's Python and returns the process exit
// status (see Serve).
func Main() int { return Serve(runGuest) }

func probeProcfs() int {
	fd, err := procMount(true)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return protocol.ProbeRefused
	}
	unix.Close(fd)
	return 0
}

// Env is what a hardened worker hands to its body: the loaded interpreter, where the
// workspace and the library are now reachable, and the verified contract.
type Env struct {
	Engine    *engine.Engine
	Module    *engine.Module
	Workspace string // host path of the workspace as this process now sees it
	Library   string // host path of the interpreter's library as this process now sees it
	// GuestRoot is the host directory to preopen as the guest's "/" (it holds the
	// workspace as "ws"), or "" without a root of the worker's own: then the
	// workspace itself is preopened as /ws.
	GuestRoot string
	// Tmp is the host directory of the guest's /tmp, or "" (it has none).
	Tmp         string
	Enforcement protocol.Enforcement

	reply *reply
}

// Serve is the body of every worker entry point. It reads the first frame from the
// control fd: a run (cold) or a template (warm; see warm.go). It loads the
// precompiled module, hardens the process (prepare, then narrow), and calls body only
// if every layer in the run's Hardening.Require is active; otherwise the run ends
// rejected and body never runs. The Report, with the contract attached, goes back on
// the control fd. The exit status is 0 when a Report was sent (whatever the guest
// did), 1 when the exchange itself failed.
//
// The escape suite's test worker calls Serve with its own body, so it is hardened by
// exactly this code.
func Serve(body func(req *protocol.Request, env *Env) protocol.Report) int {
	if len(os.Args) > 2 && os.Args[2] == protocol.ProbeProcfs {
		return probeProcfs()
	}
	closeStrayFDs()
	// When memory runs out (the service's MemoryMax, the host), the kernel kills a
	// worker, not the daemon (proc(5): raising one's own score needs no privilege).
	os.WriteFile("/proc/self/oom_score_adj", []byte("1000"), 0)
	ctl := os.NewFile(protocol.ControlFD, "control")
	if ctl == nil {
		return 1
	}
	defer ctl.Close()
	// /proc/self/status, opened before the process is narrowed, to read its peak
	// resident set at the end (VmHWM: of this program only; the parent's rusage
	// would include what the parent had mapped before the exec).
	status, _ := os.Open("/proc/self/status")
	r := &reply{ctl: ctl, status: status}
	f, err := protocol.Receive(ctl, protocol.StepRun, protocol.StepTemplate, protocol.StepSession)
	switch {
	case errors.Is(err, protocol.ErrVersion), errors.Is(err, protocol.ErrStep):
		// A parent of another build, or a frame out of turn: say so, run nothing.
		r.send(failed(err.Error()))
	case err != nil:
		return 1 // no frame: the parent is gone
	case f.Step == protocol.StepTemplate:
		if !warm(r, f.Request, body) {
			return 1
		}
	case f.Step == protocol.StepSession && f.Request.Backend != protocol.BackendNative:
		session(r, f.Request)
	case f.Request.Backend == protocol.BackendNative:
		native(r, f.Request, f.Step == protocol.StepSession)
	default:
		cold(r, f.Request, body)
	}
	if !r.ok {
		return 1
	}
	return 0
}

// reply sends the one Report of a worker.
type reply struct {
	once   sync.Once
	ctl    *os.File
	status *os.File  // /proc/self/status, or nil
	st     *hardened // the hardening in force, once there is one
	ok     bool      // the report was written
}

// send writes rep, with the contract and the peak resident set, after ending the
// guest's output: fds 1 and 2 are closed, so the parent reads end of file at once,
// not when this process exits (which unmaps the guest's memory, milliseconds of
// work). Only the first call sends anything.
func (r *reply) send(rep protocol.Report) { r.deliver(rep, true) }

// deliver is send, closing the guest's output first only when closeOutput is set.
func (r *reply) deliver(rep protocol.Report, closeOutput bool) {
	r.once.Do(func() {
		if r.st != nil && rep.Enforcement == nil {
			enf := r.st.enf
			rep.Enforcement = &enf
		}
		if closeOutput {
			unix.Close(1)
			unix.Close(2)
		}
		if r.status != nil {
			rep.PeakRSSBytes = peakRSS(r.status)
		}
		r.ok = protocol.Send(r.ctl, protocol.Frame{Step: protocol.StepReport, Report: &rep}) == nil
	})
}

// peakRSS reads VmHWM from an open /proc/PID/status, in bytes (0 if unknown).
func peakRSS(f *os.File) int64 {
	buf := make([]byte, 4096)
	n, _ := f.ReadAt(buf, 0)
	return protocol.StatusBytes(buf[:n], "VmHWM")
}

// closeStrayFDs closes every descriptor above the protocol's (0-6) that the Go
// runtime did not open itself. The parent passes no others; this makes sure of it.
// The runtime's network poller (an epoll instance and its eventfd) may already exist
// when this runs, so those two kinds are left alone: closing them kills the process,
// and neither reaches a file, a socket or another process.
func closeStrayFDs() {
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return
	}
	for _, e := range entries {
		fd, err := strconv.Atoi(e.Name())
		if err != nil || fd <= protocol.ToolsFD {
			continue
		}
		target, err := os.Readlink("/proc/self/fd/" + e.Name())
		if err != nil || target == "anon_inode:[eventpoll]" || target == "anon_inode:[eventfd]" {
			continue // gone (the directory's own fd), or the runtime's poller
		}
		unix.Close(fd)
	}
}

// cold runs a request and sends its report; a panic becomes an internal_error
// report.
func cold(r *reply, req *protocol.Request, body func(*protocol.Request, *Env) protocol.Report) {
	var rep protocol.Report
	defer func() { recoverReport(&rep); r.send(rep) }()
	st, eng, mod, failure := setUp(req, false)
	if failure != "" {
		rep = failed(failure)
		return
	}
	defer mod.Close()
	if err := feedStdin(req, nil); err != nil {
		rep = failed("cannot prepare stdin")
		return
	}
	narrow(req, st)
	var ok bool
	if rep, ok = contract(req, st); !ok {
		return
	}
	r.st = st
	rep = body(req, st.env(eng, mod, r))
}

// setUp is what a cold run and a session do first: check req, prepare the process
// (before the engine starts threads: the capabilities' bounding set is dropped on
// every thread, one capability at a time), and load the module; failure says why
// it cannot.
func setUp(req *protocol.Request, session bool) (*hardened, *engine.Engine, *engine.Module, string) {
	if msg := check(req); msg != "" {
		return nil, nil, nil, msg
	}
	st := prepare(req, false)
	eng, mod, failure := load(req, session)
	if eng != nil {
		st.enf.Engine = string(eng.Variant())
	}
	return st, eng, mod, failure
}

// check returns why req cannot be served at all, or "".
func check(req *protocol.Request) string {
	if len(os.Environ()) > 0 {
		// The parent builds the environment from nothing; anything here is a bug
		// that must not reach the guest or the host.
		return "worker started with a non-empty environment"
	}
	if err := protocol.CheckLayers(req.Hardening.Require); err != nil {
		return err.Error()
	}
	return ""
}

// load loads the module the parent passed for req (a session's: ModulePath; a
// run's: see protocol.Request.RunModule) into an engine of its variant; failure says
// why it cannot.
func load(req *protocol.Request, session bool) (*engine.Engine, *engine.Module, string) {
	// Writing past RLIMIT_FSIZE must fail with EFBIG, not kill the worker.
	signal.Ignore(syscall.SIGXFSZ)
	path, epochless := req.ModulePath, false
	if !session {
		path, epochless = req.RunModule()
	}
	eng := engine.New(engine.Options{Fuel: req.Limits.Fuel > 0, Epochless: epochless, WasmStack: sizeStacks()})
	mod, err := eng.Load(fmt.Sprintf("/proc/self/fd/%d", protocol.ModuleFD))
	if err != nil {
		// Say why (version, configuration, damage), but not where: no host paths.
		msg := strings.ReplaceAll(err.Error(), path, filepath.Base(path))
		return nil, nil, "cannot load the precompiled interpreter: " + msg
	}
	return eng, mod, ""
}

// contract returns a rejected report and false unless every layer req requires is
// active.
func contract(req *protocol.Request, st *hardened) (protocol.Report, bool) {
	enf := st.enf
	missing := enf.Missing(req.Hardening.Require)
	if len(missing) == 0 {
		return protocol.Report{}, true
	}
	var why []string
	for _, l := range missing {
		msg := l
		if e := enf.Errors[l]; e != "" {
			msg += " (" + e + ")"
		}
		why = append(why, msg)
	}
	return protocol.Report{ExitCode: -1, Reason: protocol.Rejected, Enforcement: &enf,
		Diagnostics: []string{"required enforcement layer not active, no code was run: " + strings.Join(why, "; ")}}, false
}

func recoverReport(rep *protocol.Report) {
	if r := recover(); r != nil {
		*rep = failed(fmt.Sprintf("worker panic: %v", r))
	}
}

// env is the Env for a body once st is in force; r sends its report.
func (st *hardened) env(eng *engine.Engine, mod *engine.Module, r *reply) *Env {
	return &Env{Engine: eng, Module: mod, Workspace: st.workspace, Library: st.library, GuestRoot: st.guestRoot,
		Tmp: st.tmp, Enforcement: st.enf, reply: r}
}

func failed(msg string) protocol.Report {
	return protocol.Report{ExitCode: -1, Reason: protocol.InternalError, Diagnostics: []string{msg}}
}
