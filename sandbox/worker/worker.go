// Package worker is the body of a worker process (`sandcell __worker`): it reads one
// Request from the control fd, runs python.wasm through the engine with the workspace
// preopened as /ws, and writes one Report back. See sandbox/protocol for the exchange.
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
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandcell/sandcell/bundle"
	"github.com/sandcell/sandcell/sandbox/engine"
	"github.com/sandcell/sandcell/sandbox/protocol"
)

// GuestWorkdir is the guest path of the workspace preopen, and its working directory.
const GuestWorkdir = "/ws"

//go:embed bootstrap.py
var bootstrap string

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
// status (see Serve). A warm worker starts the interpreter before its run is known.
func Main() int { return serve(runGuest, true) }

func probeProcfs() int {
	fd, err := procMount(true)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
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
	GuestRoot   string
	Enforcement protocol.Enforcement

	reply *reply
}

// Serve is the body of every worker entry point. It reads one Request from the
// control fd, loads the precompiled module, hardens the process (prepare, then narrow), and
// calls body only if every layer in req.Hardening.Require is active; otherwise the
// run ends rejected and body never runs. The Report, with the contract attached,
// goes back on the control fd. The exit status is 0 when a Report was sent (whatever
// the guest did), 1 when the exchange itself failed.
//
// A warm request (req.Warm) is prepared, answered with Warmed, and followed by the
// claim: the run's own Request, narrowed to and then run the same way.
//
// The escape suite's test worker calls Serve with its own body, so it is hardened by
// exactly this code.
func Serve(body func(req *protocol.Request, env *Env) protocol.Report) int { return serve(body, false) }

// serve is Serve; guest says that body is runGuest, whose interpreter a warm worker
// starts before the claim.
func serve(body func(*protocol.Request, *Env) protocol.Report, guest bool) int {
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
	var req protocol.Request
	if err := protocol.ReadFrame(ctl, &req); err != nil {
		return 1
	}
	// /proc/self/status, opened before the process is narrowed, to read its peak
	// resident set at the end (VmHWM: of this program only; the parent's rusage
	// would include what the parent had mapped before the exec).
	status, _ := os.Open("/proc/self/status")
	r := &reply{ctl: ctl, status: status}
	if req.Warm {
		if !warm(r, &req, body, guest) {
			return 1
		}
	} else {
		cold(r, &req, body)
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
func (r *reply) send(rep protocol.Report) {
	r.once.Do(func() {
		if r.st != nil && rep.Enforcement == nil {
			enf := r.st.enf
			rep.Enforcement = &enf
		}
		unix.Close(1)
		unix.Close(2)
		if r.status != nil {
			rep.PeakRSSBytes = peakRSS(r.status)
		}
		r.ok = protocol.WriteFrame(r.ctl, rep) == nil
	})
}

// peakRSS reads VmHWM from an open /proc/PID/status, in bytes (0 if unknown).
func peakRSS(f *os.File) int64 {
	buf := make([]byte, 4096)
	n, _ := f.ReadAt(buf, 0)
	return protocol.StatusBytes(buf[:n], "VmHWM")
}

// closeStrayFDs closes every descriptor above the protocol's (0-5) that the Go
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
		if err != nil || fd <= protocol.ModuleFD {
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
	if msg := check(req); msg != "" {
		rep = failed(msg)
		return
	}
	// Prepared before the engine starts threads: the capabilities' bounding set is
	// dropped on every thread, one capability at a time.
	st := prepare(req)
	eng, mod, failure := load(req)
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

// warm prepares a worker for a run not yet known (tmpl is the template), answers
// Warmed, reads the claim and runs it. For the guest body, the interpreter starts
// before the claim and blocks reading its program from stdin, which the claim
// fills. It returns false when there is nothing to report (the parent dropped an
// idle worker, or the template was refused, which Warmed said).
func warm(r *reply, tmpl *protocol.Request, body func(*protocol.Request, *Env) protocol.Report, guest bool) bool {
	defer func() {
		if p := recover(); p != nil {
			r.send(failed(fmt.Sprintf("worker panic: %v", p)))
		}
	}()
	refuse := func(msg string) bool {
		protocol.WriteFrame(r.ctl, protocol.Warmed{Diagnostics: []string{msg}})
		return false
	}
	if msg := check(tmpl); msg != "" {
		return refuse(msg)
	}
	st := prepare(tmpl) // before the engine starts threads (see cold)
	if st.guestRoot == "" {
		return refuse("a warm worker needs a root of its own: " + st.enf.Errors[protocol.LayerMountNS])
	}
	eng, mod, failure := load(tmpl)
	if failure != "" {
		return refuse(failure)
	}
	// fd 0 becomes a pipe whose write end the claim fills.
	pr, w, err := os.Pipe()
	if err == nil {
		err = unix.Dup3(int(pr.Fd()), 0, 0)
		pr.Close()
	}
	if err != nil {
		return refuse("cannot prepare stdin")
	}
	// claim answers Warmed and narrows the process to the claim that follows; it
	// returns false with nothing to report when the parent drops the worker, and
	// false after sending the report when the claim cannot run.
	claim := func() (*protocol.Request, bool) {
		if protocol.WriteFrame(r.ctl, protocol.Warmed{Ready: true}) != nil {
			return nil, false
		}
		var c protocol.Request
		if protocol.ReadFrame(r.ctl, &c) != nil {
			return nil, false // dropped unclaimed
		}
		// Acknowledged at once: until then, a parent that finds this worker gone
		// runs the claim elsewhere.
		if protocol.WriteFrame(r.ctl, protocol.Warmed{Ready: true}) != nil {
			return nil, false
		}
		// The roots and the seccomp filter are the template's (the parent matched
		// the claim to it): the claim carries neither.
		c.Roots, c.Hardening.Seccomp = tmpl.Roots, tmpl.Hardening.Seccomp
		if msg := checkClaim(tmpl, &c); msg != "" {
			r.send(failed(msg))
			return nil, false
		}
		narrow(&c, st)
		if rep, ok := contract(&c, st); !ok {
			r.send(rep) // the program never reaches the guest
			return nil, false
		}
		r.st = st
		return &c, true
	}
	if !guest {
		c, ok := claim()
		if !ok {
			return r.ok
		}
		if err := feedStdin(c, w); err != nil {
			r.send(failed("cannot prepare stdin"))
			return true
		}
		r.send(body(c, st.env(eng, mod, r)))
		return true
	}

	// The guest: its interpreter starts on this (the main) thread while the claim
	// is awaited on another; the claim narrows the whole process (every layer
	// covers every thread) before the program is written to the guest's stdin.
	var ended atomic.Bool
	arm := make(chan time.Duration, 1)
	claimed := make(chan struct{})
	clock := engine.NewClock()
	go func() {
		// Narrowing ends with no_new_privs on this thread, which the seccomp filter's
		// TSYNC then gives every thread: it must all happen on one thread.
		runtime.LockOSThread()
		// Ready means the interpreter is started and waits for its program.
		if err := awaitReady(rootWorkspace+"/"+readyFIFO, &ended); err != nil {
			refuse(err.Error())
			os.Exit(1)
		}
		c, ok := claim()
		if !ok {
			os.Exit(0) // dropped, or refused and reported: nothing ran
		}
		close(claimed)
		// The run starts now: its CPU limit and its monotonic clock count from here.
		clock.Restart()
		arm <- time.Duration(c.Limits.CPUMS) * time.Millisecond
		feedStdin(c, w)
	}()
	spec := guestSpec(tmpl, st.env(eng, mod, r), arm)
	spec.Clock = clock
	// The bootstrap's sign that it is warm (it removes the variable before the
	// program's own environment is set).
	spec.Env = map[string]string{warmVariable: "1"}
	// (A guest that ended before its claim, which should not happen, is reported
	// once claimed.)
	spec.Ended = func(out engine.Outcome) {
		ended.Store(true)
		<-claimed
		r.send(report(out))
	}
	out := eng.Run(mod, spec)
	ended.Store(true)
	<-claimed
	r.send(report(out))
	return true
}

// warmVariable is set in a warm guest's environment; see bootstrap.py.
const warmVariable = "SANDCELL_WARM"

// awaitReady waits until the guest opens the start-up FIFO at path for reading: a
// writer's non-blocking open fails with ENXIO until then (fifo(7)). It fails once
// the guest has ended, or after a minute.
func awaitReady(path string, ended *atomic.Bool) error {
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); {
		fd, err := unix.Open(path, unix.O_WRONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err == nil {
			return unix.Close(fd)
		}
		if err != unix.ENXIO {
			return fmt.Errorf("start-up FIFO: %w", err)
		}
		if ended.Load() {
			return errors.New("the interpreter ended during its start-up")
		}
		time.Sleep(time.Millisecond)
	}
	return errors.New("the interpreter did not start within a minute")
}

// checkClaim returns why a claim cannot run in a worker prepared for tmpl, or "".
func checkClaim(tmpl, c *protocol.Request) string {
	switch {
	case c.Version != protocol.Version:
		return fmt.Sprintf("%v: worker speaks %d, claim is %d", protocol.ErrVersion, protocol.Version, c.Version)
	case c.Warm:
		return "a claim cannot be a template"
	case c.Limits.MemoryBytes != tmpl.Limits.MemoryBytes || c.Limits.Fuel != 0 || tmpl.Limits.Fuel != 0:
		return "the claim's memory or fuel differs from the warm worker's"
	case c.ModulePath != tmpl.ModulePath || c.LibDir != tmpl.LibDir:
		return "the claim's interpreter differs from the warm worker's"
	}
	return ""
}

// check returns why req cannot be served at all, or "".
func check(req *protocol.Request) string {
	if req.Version != protocol.Version {
		return fmt.Sprintf("%v: worker speaks %d, request is %d", protocol.ErrVersion, protocol.Version, req.Version)
	}
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

// load loads req's module; failure says why it cannot.
func load(req *protocol.Request) (*engine.Engine, *engine.Module, string) {
	// Writing past RLIMIT_FSIZE must fail with EFBIG, not kill the worker.
	signal.Ignore(syscall.SIGXFSZ)
	eng := engine.New(engine.Options{Fuel: req.Limits.Fuel > 0, WasmStack: sizeStacks()})
	mod, err := eng.Load(fmt.Sprintf("/proc/self/fd/%d", protocol.ModuleFD))
	if err != nil {
		// Say why (version, configuration, damage), but not where: no host paths.
		msg := strings.ReplaceAll(err.Error(), req.ModulePath, filepath.Base(req.ModulePath))
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
		Enforcement: st.enf, reply: r}
}

// runGuest runs the request's Python program, whose program feedStdin has written.
func runGuest(req *protocol.Request, env *Env) protocol.Report {
	spec := guestSpec(req, env, nil)
	spec.Ended = func(out engine.Outcome) { env.reply.send(report(out)) }
	return report(env.Engine.Run(env.Module, spec))
}

// guestSpec is the engine's run of the bootstrap for req's limits in env; arm, when
// not nil, delivers the CPU limit later (see engine.Spec).
func guestSpec(req *protocol.Request, env *Env, arm <-chan time.Duration) engine.Spec {
	preopens := []engine.Preopen{{Host: env.Workspace, Guest: GuestWorkdir}}
	if env.GuestRoot != "" {
		preopens = []engine.Preopen{{Host: env.GuestRoot, Guest: "/"}}
	}
	return engine.Spec{
		Argv:         Argv(),
		Preopens:     append(preopens, engine.Preopen{Host: env.Library, Guest: bundle.GuestLibDir, ReadOnly: true}),
		MemoryBytes:  req.Limits.MemoryBytes,
		CPU:          time.Duration(req.Limits.CPUMS) * time.Millisecond,
		CPUArm:       arm,
		Fuel:         req.Limits.Fuel,
		InheritStdin: true,
	}
}

func report(out engine.Outcome) protocol.Report {
	return protocol.Report{
		ExitCode:        out.ExitCode,
		Reason:          out.Reason,
		FuelConsumed:    out.FuelConsumed,
		PeakMemoryBytes: out.PeakMemoryBytes,
		Diagnostics:     out.Diagnostics,
	}
}

// interpreterFlags: -S skips the site module (nothing to find in a sandbox, and it
// costs start-up time); -I isolates from PYTHON* variables and the user site.
var interpreterFlags = []string{"-S", "-I"}

// Argv is the guest argv: the interpreter running the embedded bootstrap, which
// reads the program from stdin (see Program).
func Argv() []string {
	return append(append([]string{bundle.GuestExecutable}, interpreterFlags...), "-c", bootstrap)
}

// Program is what the bootstrap reads from stdin before the program's own stdin: ten
// decimal digits giving the header's length, then the header (see bootstrap.py).
func Program(req *protocol.Request) ([]byte, error) {
	var fields []string
	switch {
	case req.Code != "" && req.Path != "":
		return nil, fmt.Errorf("request sets both code and path")
	case req.Isolated && req.Path != "":
		return nil, fmt.Errorf("an isolated request runs code, not a path")
	case req.Path != "":
		fields = []string{"path", GuestWorkdir + "/" + req.Path, ""}
	default:
		name := req.Filename
		if name == "" {
			name = "<string>"
		}
		mode := "code"
		if req.Isolated {
			mode = "isolated"
		}
		fields = []string{mode, req.Code, name}
	}
	fields = append(fields, strconv.Itoa(len(req.Args)))
	fields = append(fields, req.Args...)
	keys := make([]string, 0, len(req.Env))
	for k := range req.Env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fields = append(fields, k, req.Env[k])
	}
	for _, f := range fields {
		if strings.ContainsRune(f, 0) {
			return nil, fmt.Errorf("the program contains a NUL byte")
		}
	}
	header := strings.Join(fields, "\x00")
	return fmt.Appendf(nil, "%010d%s", len(header), header), nil
}

// feedStdin writes req's program and then its stdin to w, the write end of the pipe
// that is fd 0, from a goroutine, and closes it, so the guest reads the program, the
// data and then end of file, however often it reads past it. (A file given to
// wasmtime as stdin traps after repeated reads at end of file.) With w nil it makes
// fd 0 such a pipe first.
func feedStdin(req *protocol.Request, w *os.File) error {
	prog, err := Program(req)
	if err != nil {
		return err
	}
	if w == nil {
		r, pw, err := os.Pipe()
		if err != nil {
			return err
		}
		defer r.Close()
		if err := unix.Dup3(int(r.Fd()), 0, 0); err != nil {
			pw.Close()
			return err
		}
		w = pw
	}
	go func() {
		w.Write(prog)
		w.Write(req.Stdin)
		w.Close()
	}()
	return nil
}

func failed(msg string) protocol.Report {
	return protocol.Report{ExitCode: -1, Reason: protocol.InternalError, Diagnostics: []string{msg}}
}
