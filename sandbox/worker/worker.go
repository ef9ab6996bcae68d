// Package worker is the body of a worker process (`sandcell __worker`): it reads one
// Request from the control fd, runs python.wasm through the engine with the workspace
// preopened as /ws, and writes one Report back. See sandbox/protocol for the exchange.
//
// The worker's own stdout and stderr are the guest's: it never writes to them itself.
// Everything it has to say goes into the Report.
package worker

import (
	_ "embed"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandcell/sandcell/bundle"
	"github.com/sandcell/sandcell/sandbox/engine"
	"github.com/sandcell/sandcell/sandbox/protocol"
)

// Command is the hidden argv[1] that makes the binary run Main; cmd/appliance
// dispatches it before anything else.
const Command = "__worker"

// ControlFD is the worker's control socket (request in, report out).
const ControlFD = 3

// WorkspaceFD is the workspace directory, opened and checked by the parent. Without
// its own mount namespace the worker preopens it through /proc/self/fd; with one, it
// reopens the path inside the namespace and refuses it unless it is this directory.
// Either way the directory it gets is the one the parent checked.
const WorkspaceFD = 4

// ModuleFD is the precompiled module (.cwasm): a sealed in-memory copy the parent
// made of the verified file, which nobody can write.
const ModuleFD = 5

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
// status (see Serve).
func Main() int { return Serve(runGuest) }

// Env is what a hardened worker hands to its body: the loaded interpreter, where the
// workspace and the library are now reachable, and the verified contract.
type Env struct {
	Engine      *engine.Engine
	Module      *engine.Module
	Workspace   string // host path of the workspace as this process now sees it
	Library     string // host path of the interpreter's library as this process now sees it
	Enforcement protocol.Enforcement
}

// Serve is the body of every worker entry point. It reads one Request from the
// control fd, sets its resource limits, loads the precompiled module, hardens the
// process (see harden), and calls body only if every layer in
// req.Hardening.Require is active; otherwise the run ends rejected and body never
// runs. The Report, with the contract attached, goes back on the control fd. The exit
// status is 0 when a Report was sent (whatever the guest did), 1 when the exchange
// itself failed.
//
// The escape suite's test worker calls Serve with its own body, so it is hardened by
// exactly this code.
func Serve(body func(req *protocol.Request, env *Env) protocol.Report) int {
	closeStrayFDs()
	// When memory runs out (the service's MemoryMax, the host), the kernel kills a
	// worker, not the daemon (proc(5): raising one's own score needs no privilege).
	os.WriteFile("/proc/self/oom_score_adj", []byte("1000"), 0)
	ctl := os.NewFile(ControlFD, "control")
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
	rep := serve(&req, body)
	if status != nil {
		rep.PeakRSSBytes = peakRSS(status)
		status.Close()
	}
	if err := protocol.WriteFrame(ctl, rep); err != nil {
		return 1
	}
	return 0
}

// peakRSS reads VmHWM from an open /proc/PID/status, in bytes (0 if unknown).
func peakRSS(f *os.File) int64 {
	buf := make([]byte, 4096)
	n, _ := f.ReadAt(buf, 0)
	for _, line := range strings.Split(string(buf[:n]), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err == nil {
				return kb << 10
			}
		}
	}
	return 0
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
		if err != nil || fd <= ModuleFD {
			continue
		}
		target, err := os.Readlink("/proc/self/fd/" + e.Name())
		if err != nil || target == "anon_inode:[eventpoll]" || target == "anon_inode:[eventfd]" {
			continue // gone (the directory's own fd), or the runtime's poller
		}
		unix.Close(fd)
	}
}

// serve turns a request into a report; a panic becomes an internal_error report.
func serve(req *protocol.Request, body func(*protocol.Request, *Env) protocol.Report) (rep protocol.Report) {
	defer func() {
		if r := recover(); r != nil {
			rep = failed(fmt.Sprintf("worker panic: %v", r))
		}
	}()
	if req.Version != protocol.Version {
		return failed(fmt.Sprintf("%v: worker speaks %d, request is %d", protocol.ErrVersion, protocol.Version, req.Version))
	}
	if len(os.Environ()) > 0 {
		// The parent builds the environment from nothing; anything here is a bug
		// that must not reach the guest or the host.
		return failed("worker started with a non-empty environment")
	}
	if err := protocol.CheckLayers(req.Hardening.Require); err != nil {
		return failed(err.Error())
	}
	// Writing past RLIMIT_FSIZE must fail with EFBIG, not kill the worker.
	signal.Ignore(syscall.SIGXFSZ)

	eng := engine.New(engine.Options{Fuel: req.Limits.Fuel > 0, WasmStack: sizeStacks()})
	mod, err := eng.Load(fmt.Sprintf("/proc/self/fd/%d", ModuleFD))
	if err != nil {
		// Say why (version, configuration, damage), but not where: no host paths.
		msg := strings.ReplaceAll(err.Error(), req.ModulePath, filepath.Base(req.ModulePath))
		return failed("cannot load the precompiled interpreter: " + msg)
	}
	defer mod.Close()
	if len(req.Stdin) > 0 {
		if err := stdinPipe(req.Stdin); err != nil {
			return failed("cannot prepare stdin")
		}
	}

	st := harden(req)
	enf := st.enf
	if missing := enf.Missing(req.Hardening.Require); len(missing) > 0 {
		var why []string
		for _, l := range missing {
			msg := l
			if e := enf.Errors[l]; e != "" {
				msg += " (" + e + ")"
			}
			why = append(why, msg)
		}
		return protocol.Report{ExitCode: -1, Reason: protocol.Rejected, Enforcement: &enf,
			Diagnostics: []string{"required enforcement layer not active, no code was run: " + strings.Join(why, "; ")}}
	}
	rep = body(req, &Env{Engine: eng, Module: mod, Workspace: st.workspace, Library: st.library, Enforcement: enf})
	rep.Enforcement = &enf
	return rep
}

// runGuest runs the request's Python program.
func runGuest(req *protocol.Request, env *Env) protocol.Report {
	argv, err := Argv(req)
	if err != nil {
		return failed(err.Error())
	}
	spec := engine.Spec{
		Argv: argv,
		Env:  req.Env,
		Preopens: []engine.Preopen{
			{Host: env.Workspace, Guest: GuestWorkdir},
			{Host: env.Library, Guest: bundle.GuestLibDir, ReadOnly: true},
		},
		MemoryBytes:  req.Limits.MemoryBytes,
		CPU:          time.Duration(req.Limits.CPUMS) * time.Millisecond,
		Fuel:         req.Limits.Fuel,
		InheritStdin: len(req.Stdin) > 0,
	}
	out := env.Engine.Run(env.Module, spec)
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

// Argv is the guest argv for req: the interpreter running the embedded bootstrap,
// which makes /ws the working directory and then runs the code or the workspace
// script with req.Args.
func Argv(req *protocol.Request) ([]string, error) {
	argv := append([]string{bundle.GuestExecutable}, interpreterFlags...)
	argv = append(argv, "-c", bootstrap)
	switch {
	case req.Code != "" && req.Path != "":
		return nil, fmt.Errorf("request sets both code and path")
	case req.Path != "":
		argv = append(argv, "path", GuestWorkdir+"/"+req.Path)
	default:
		name := req.Filename
		if name == "" {
			name = "<string>"
		}
		argv = append(argv, "code", req.Code, name)
	}
	return append(argv, req.Args...), nil
}

// stdinPipe makes fd 0 a pipe that a goroutine fills with data and then closes, so
// the guest reads data and then end of file, however often it reads past it. (A file
// given to wasmtime as stdin traps after repeated reads at end of file.)
func stdinPipe(data []byte) error {
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	defer r.Close()
	if err := unix.Dup3(int(r.Fd()), 0, 0); err != nil {
		w.Close()
		return err
	}
	go func() {
		w.Write(data)
		w.Close()
	}()
	return nil
}

func failed(msg string) protocol.Report {
	return protocol.Report{ExitCode: -1, Reason: protocol.InternalError, Diagnostics: []string{msg}}
}
