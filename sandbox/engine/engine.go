// Package engine runs a WASI preview1 module under wasmtime with explicit limits: a
// snapshot of the initialised interpreter (see Snapshot), or a command module. It is
// the only package that imports wasmtime-go.
//
// An Engine is built from Options that fix everything compiled code depends on
// (Cranelift, epoch interruption, fuel metering, copy-on-write memory images, the wasm
// stack size). A precompiled module (.cwasm) loads only into an engine with the same
// configuration, so Fingerprint names that configuration for cache keys.
//
// Limits inside a run: linear memory through the store limiter; CPU time through an
// epoch deadline that a ticker trips once the process has used its CPU budget (an
// engine without epoch interruption cannot stop a call: the same ticker hands the
// outcome to Spec.Overrun, which ends the process); optional fuel. The wall clock is
// not enforced here: the parent process kills the worker.
package engine

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/bytecodealliance/wasmtime-go/v44"

	"github.com/sandcell/sandcell/sandbox/protocol"
)

// WasmtimeVersion is the wasmtime release linked through wasmtime-go. It is part of
// every Fingerprint; a test checks it against the module version in go.mod.
const WasmtimeVersion = "44.0.0"

// DefaultWasmStack is the wasm stack limit in bytes when Options.WasmStack is zero
// (wasmtime's default, made explicit). The wasm stack lives on the native stack of the
// thread that calls into wasm and must stay well below it: a wasm stack larger than
// the real one turns a clean stack-overflow trap into SIGSEGV. The worker sizes both
// together (see sandbox/worker).
const DefaultWasmStack = 512 << 10

// epochTick is how often the CPU-time ticker samples the process's CPU usage.
const epochTick = 5 * time.Millisecond

// ErrModule is wrapped by Load when a .cwasm cannot be used with this engine: it was
// built by another wasmtime, for another configuration or CPU, or it is damaged.
var ErrModule = errors.New("engine: module not loadable")

// Options fixes the engine configuration. Compiled modules depend on every field.
type Options struct {
	// Fuel turns on fuel metering (49-63% slower on CPU-bound Python, measured).
	Fuel bool

	// WasmStack is the wasm stack limit in bytes (0: DefaultWasmStack). It is a
	// run-time limit, not part of the compiled code or of the Fingerprint.
	WasmStack int

	// Epochless turns epoch interruption off: compiled code checks no deadline at
	// every loop and call (Python code runs 10-20% faster: make bench's guest table),
	// and nothing can stop a call from outside. A CPU limit is then enforced by ending
	// the process (Spec.Overrun), so only a single-use worker's run may use it, never
	// a session, whose cell must end without losing the interpreter.
	Epochless bool
}

// Variant names one engine configuration the interpreter is precompiled for (the
// bundle's and each hash secret's .cwasm files, bundle precompile --variant).
type Variant string

const (
	// Plain has epoch interruption: a CPU limit or an interrupt ends the call and the
	// instance lives on. Sessions use it.
	Plain Variant = "plain"
	// Fuel has fuel metering (and epoch interruption): runs with limits.fuel.
	Fuel Variant = "fuel"
	// Epochless is Options.Epochless: runs without fuel, in single-use workers.
	Epochless Variant = "epochless"
)

// Variants returns every Variant, in the order they are compiled and checked.
func Variants() []Variant { return []Variant{Plain, Fuel, Epochless} }

// Options returns the engine options of v (WasmStack left zero).
func (v Variant) Options() Options {
	return Options{Fuel: v == Fuel, Epochless: v == Epochless}
}

// Engine is a configured wasmtime engine. It is safe for concurrent use.
type Engine struct {
	opts Options
	we   *wasmtime.Engine
}

// New returns an engine for opts: Cranelift at speed, epoch interruption on (unless
// opts.Epochless), copy-on-write memory images on, the wasm stack set to
// opts.WasmStack.
func New(opts Options) *Engine {
	cfg := wasmtime.NewConfig()
	cfg.SetStrategy(wasmtime.StrategyCranelift)
	cfg.SetCraneliftOptLevel(wasmtime.OptLevelSpeed)
	cfg.SetEpochInterruption(!opts.Epochless)
	cfg.SetConsumeFuel(opts.Fuel)
	cfg.SetMemoryInitCOWSet(true)
	stack := opts.WasmStack
	if stack <= 0 {
		stack = DefaultWasmStack
	}
	setAsyncStackSize(cfg, stack)
	cfg.SetMaxWasmStack(stack)
	cfg.SetParallelCompilation(true)
	return &Engine{opts: opts, we: wasmtime.NewEngineWithConfig(cfg)}
}

// Fingerprint names the engine configuration that compiled code depends on, e.g.
// "wasmtime=44.0.0 cranelift opt=speed epoch=1 fuel=0 cow=1 target=amd64-linux".
// Two engines with equal fingerprints accept each other's .cwasm files (the host CPU
// features are checked by wasmtime itself when a module is loaded).
func (e *Engine) Fingerprint() string {
	return fmt.Sprintf("wasmtime=%s cranelift opt=speed epoch=%d fuel=%d cow=1 target=%s-%s",
		WasmtimeVersion, b2i(!e.opts.Epochless), b2i(e.opts.Fuel), runtime.GOARCH, runtime.GOOS)
}

// Variant is the Variant of e's options (Fuel when fuel is metered).
func (e *Engine) Variant() Variant {
	switch {
	case e.opts.Fuel:
		return Fuel
	case e.opts.Epochless:
		return Epochless
	}
	return Plain
}

// Options returns the options the engine was built with.
func (e *Engine) Options() Options { return e.opts }

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Precompile compiles wasm (the bytes of a module) to wasmtime's serialized form for
// this engine. Compiling python.wasm takes seconds and hundreds of MB.
func (e *Engine) Precompile(wasm []byte) ([]byte, error) {
	m, err := wasmtime.NewModule(e.we, wasm)
	if err != nil {
		return nil, fmt.Errorf("engine: compile: %w", err)
	}
	defer m.Close()
	out, err := m.Serialize()
	if err != nil {
		return nil, fmt.Errorf("engine: serialize: %w", err)
	}
	return out, nil
}

// Compile compiles wasm in memory and returns it ready to run, for tools that run a
// module once (the interpreter build's host runner). Workers use Load.
func (e *Engine) Compile(wasm []byte) (*Module, error) {
	m, err := wasmtime.NewModule(e.we, wasm)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrModule, err)
	}
	return &Module{m: m}, nil
}

// Module is a loaded, ready-to-instantiate module.
type Module struct {
	m *wasmtime.Module
}

// Load maps a .cwasm file produced by Precompile with the same fingerprint. Loading
// maps the file (about 1-3 ms) instead of reading it. The file must not change while
// the module is in use. Errors wrap ErrModule.
func (e *Engine) Load(path string) (*Module, error) {
	m, err := wasmtime.NewModuleDeserializeFile(e.we, path)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrModule, err)
	}
	return &Module{m: m}, nil
}

// Check loads the .cwasm at path and releases it: it proves this engine accepts the
// file on this host (same wasmtime, configuration and CPU features).
func (e *Engine) Check(path string) error {
	m, err := e.Load(path)
	if err != nil {
		return err
	}
	m.Close()
	return nil
}

// Close releases the module.
func (m *Module) Close() { m.m.Close() }

// Preopen is a host directory the guest sees at Guest.
type Preopen struct {
	Host     string
	Guest    string
	ReadOnly bool
}

// Spec describes one run of a command module.
type Spec struct {
	// Argv is the guest's argv, argv[0] included.
	Argv []string
	// Env is the guest's whole environment.
	Env map[string]string
	// InheritStdin gives the guest this process's fd 0 as stdin; StdinFile, when
	// set, the file at that path instead; otherwise the guest's stdin is empty.
	InheritStdin bool
	StdinFile    string
	// Preopens are the only host directories the guest can name.
	Preopens []Preopen
	// MemoryBytes caps linear memory (store limiter); must be positive.
	MemoryBytes int64
	// CPU caps the process's CPU time (an epoch deadline, or on an epochless engine
	// Overrun); 0 means no CPU limit.
	CPU time.Duration
	// Fuel is the fuel budget; it must be positive exactly when the engine meters fuel.
	Fuel uint64
	// Tools, when not nil, carries the guest's tool calls (see ToolCaller); without
	// it the guest's _sandcell.tool_call says there is no channel.
	Tools ToolCaller
	// Ended, when not nil, is called with the outcome as soon as the guest has
	// ended, before the store is torn down (unmapping a large linear memory takes
	// milliseconds): a single-use worker reports from it.
	Ended func(Outcome)
	// Overrun is called, on an engine without epoch interruption, with the outcome of
	// a call that used up its CPU limit, from another goroutine while the guest still
	// runs (PeakMemoryBytes unknown, 0). It must end the process: the engine cannot
	// stop the guest. Such an engine refuses a call with a CPU limit without it.
	Overrun func(Outcome)
}

// Outcome is what Run observed.
type Outcome struct {
	ExitCode int
	Reason   protocol.Reason
	// ProcExit: the guest ended through WASI's proc_exit (os._exit), not by
	// returning: its stack was unwound mid-call, so the instance must not be called
	// again as it is.
	ProcExit        bool
	FuelConsumed    uint64
	PeakMemoryBytes int64
	Diagnostics     []string
}

// Run instantiates m in a fresh store and calls its RunExport (a snapshot, whose
// result is the exit status) or its _start export (a command module), with the
// guest's stdout and stderr inherited from this process (fds 1 and 2). It returns
// when the guest returns, exits or traps; errors in setting up the run are reported as an Outcome with
// Reason InternalError, never as a panic.
func (e *Engine) Run(m *Module, spec Spec) Outcome {
	inst, out := e.Instantiate(m, spec)
	if inst == nil {
		return out
	}
	defer inst.Close()
	out = inst.Call(spec.CPU)
	if spec.Ended != nil {
		spec.Ended(out)
	}
	return out
}

// Instance is an instantiated module with its own store: a run's, or a session's,
// whose RunExport is called once per cell on the same memory. Not safe for
// concurrent use.
type Instance struct {
	e        *Engine
	m        *Module
	inst     *wasmtime.Instance
	store    *wasmtime.Store
	linker   *wasmtime.Linker
	entry    *wasmtime.Func
	snapshot bool
	memory   *wasmtime.Memory
	fuel     uint64
	overrun  func(Outcome)
}

// Instantiate makes a fresh store for spec (its WASI context, preopens and limits)
// and instantiates m in it. spec.CPU and spec.Ended are Run's, not the instance's.
// On failure the Instance is nil and the Outcome says why (Reason InternalError, or
// what instantiation trapped with).
func (e *Engine) Instantiate(m *Module, spec Spec) (*Instance, Outcome) {
	if e.opts.Fuel != (spec.Fuel > 0) {
		return nil, internal("fuel budget does not match the engine's fuel metering")
	}
	if spec.MemoryBytes <= 0 {
		return nil, internal("memory limit must be positive")
	}
	wasi := wasmtime.NewWasiConfig()
	wasi.SetArgv(spec.Argv)
	keys := make([]string, 0, len(spec.Env))
	vals := make([]string, 0, len(spec.Env))
	for k, v := range spec.Env {
		keys = append(keys, k)
		vals = append(vals, v)
	}
	wasi.SetEnv(keys, vals)
	if spec.InheritStdin {
		wasi.InheritStdin()
	} else if spec.StdinFile != "" {
		if err := wasi.SetStdinFile(spec.StdinFile); err != nil {
			return nil, internal("cannot open the guest's stdin")
		}
	}
	wasi.InheritStdout()
	wasi.InheritStderr()
	for _, p := range spec.Preopens {
		dirPerms, filePerms := wasmtime.DIR_READ, wasmtime.FILE_READ
		if !p.ReadOnly {
			dirPerms |= wasmtime.DIR_WRITE
			filePerms |= wasmtime.FILE_WRITE
		}
		if err := wasi.PreopenDir(p.Host, p.Guest, dirPerms, filePerms); err != nil {
			return nil, internal("cannot preopen " + p.Guest)
		}
	}

	in := &Instance{e: e, m: m, store: wasmtime.NewStore(e.we), fuel: spec.Fuel, overrun: spec.Overrun}
	in.store.SetWasi(wasi)
	// Memory, table elements, instances, tables, memories; -1 keeps wasmtime's default.
	in.store.Limiter(spec.MemoryBytes, -1, 1, -1, 1)
	if spec.Fuel > 0 {
		if err := in.store.SetFuel(spec.Fuel); err != nil {
			in.Close()
			return nil, internal("cannot set fuel")
		}
	}
	in.linker = wasmtime.NewLinker(e.we)
	if err := in.linker.DefineWasi(); err != nil {
		in.Close()
		return nil, internal("cannot define WASI")
	}
	if err := defineTools(in.linker, spec.Tools); err != nil {
		in.Close()
		return nil, internal("cannot define the tools channel")
	}
	if !e.opts.Epochless {
		in.store.SetEpochDeadline(1)
	}
	inst, err := in.linker.Instantiate(in.store, m.m)
	if err != nil {
		in.Close()
		return nil, classify(err, internal("cannot instantiate module"))
	}
	in.inst = inst
	if ex := inst.GetExport(in.store, "memory"); ex != nil {
		in.memory = ex.Memory()
	}
	// A snapshot runs its program through RunExport; a command module, _start.
	in.entry, in.snapshot = inst.GetFunc(in.store, RunExport), true
	if in.entry == nil {
		in.entry, in.snapshot = inst.GetFunc(in.store, "_start"), false
	}
	switch {
	case in.entry == nil:
		in.Close()
		return nil, internal("module has neither a " + RunExport + " nor a _start export")
	case in.snapshot && inst.GetFunc(in.store, InitExport) != nil:
		in.Close()
		return nil, internal("module is a reactor that was never initialised: run its snapshot")
	}
	return in, Outcome{}
}

// Call calls the instance's entry once, within cpu of this process's CPU time (0:
// no CPU limit), and returns how it ended. A snapshot's RunExport may be called
// again on the same instance (a session's next cell) after a call that returned;
// after a trap or an exit the instance's state is whatever the guest left.
func (in *Instance) Call(cpu time.Duration) Outcome {
	in.Arm()
	return in.CallArmed(cpu)
}

// Arm sets the instance's epoch deadline to the next tick: from now on an Interrupt
// (or the CPU watch) ends the next call. Call arms itself; a caller that must not
// lose an interrupt sent between its own steps arms first and calls CallArmed.
func (in *Instance) Arm() {
	if !in.e.opts.Epochless {
		in.store.SetEpochDeadline(1)
	}
}

// CallArmed is Call on an instance already armed (see Arm).
func (in *Instance) CallArmed(cpu time.Duration) Outcome {
	if cpu > 0 {
		reached := in.e.we.IncrementEpoch
		if in.e.opts.Epochless {
			if in.overrun == nil {
				return internal("an engine without epoch interruption enforces a CPU limit only through Spec.Overrun")
			}
			reached = func() { in.overrun(cpuLimit(Outcome{ExitCode: -1})) }
		}
		stop := watchCPU(cpu, reached)
		defer stop()
	}
	res, err := in.entry.Call(in.store)

	out := Outcome{Reason: protocol.Exited}
	if err != nil {
		out = classify(err, out)
	} else if status, ok := res.(int32); in.snapshot && ok {
		out.ExitCode = int(status)
	}
	if in.memory != nil {
		out.PeakMemoryBytes = int64(in.memory.DataSize(in.store))
	}
	if in.fuel > 0 {
		if left, err := in.store.GetFuel(); err == nil {
			out.FuelConsumed = in.fuel - left
			// wasmtime-go's TrapCode constants stop matching the C API after
			// Interrupt, so fuel exhaustion is recognised by the empty tank.
			if left == 0 && out.Reason == protocol.Trap {
				out.Reason = protocol.CPULimit
				out.Diagnostics = []string{"fuel exhausted"}
			}
		}
	}
	return out
}

// Close releases the instance's store.
func (in *Instance) Close() {
	if in.linker != nil {
		in.linker.Close()
	}
	in.store.Close()
}

// classify maps an error from instantiation or _start to an Outcome. A WASI proc_exit
// is a normal exit; traps map by code; anything else keeps fallback's reason.
func classify(err error, fallback Outcome) Outcome {
	var werr *wasmtime.Error
	if errors.As(err, &werr) {
		if code, ok := werr.ExitStatus(); ok {
			return Outcome{ExitCode: int(code), Reason: protocol.Exited, ProcExit: true}
		}
	}
	var trap *wasmtime.Trap
	if errors.As(err, &trap) {
		out := Outcome{ExitCode: -1, Reason: protocol.Trap, Diagnostics: []string{cause(trap.Message())}}
		if c := trap.Code(); c != nil {
			switch *c {
			case wasmtime.Interrupt:
				// Interrupts come only from the CPU-time epoch deadline.
				out = cpuLimit(out)
			case wasmtime.StackOverflow:
				out.Diagnostics = []string{"wasm stack exhausted"}
			}
		}
		return out
	}
	if fallback.Reason == "" || fallback.Reason == protocol.Exited {
		fallback = Outcome{ExitCode: -1, Reason: protocol.Trap}
	}
	fallback.Diagnostics = append(fallback.Diagnostics, cause(err.Error()))
	return fallback
}

// cpuLimit is out ended by its CPU limit.
func cpuLimit(out Outcome) Outcome {
	out.Reason = protocol.CPULimit
	out.Diagnostics = []string{"cpu time limit reached"}
	return out
}

func internal(msg string) Outcome {
	return Outcome{ExitCode: -1, Reason: protocol.InternalError, Diagnostics: []string{msg}}
}

// cause keeps the line that says what happened from a wasmtime message: the first
// line after "Caused by:" (e.g. "wasm trap: integer divide by zero"), else the first
// line. The rest is a backtrace, which names no host paths but helps no caller.
func cause(msg string) string {
	if _, after, ok := strings.Cut(msg, "Caused by:\n"); ok {
		msg = after
	}
	msg = strings.TrimSpace(msg)
	if i := strings.IndexByte(msg, '\n'); i >= 0 {
		msg = msg[:i]
	}
	// Several causes are numbered "0: ...", "1: ...": keep the text.
	if n, rest, ok := strings.Cut(msg, ": "); ok && strings.Trim(n, "0123456789") == "" {
		msg = rest
	}
	return msg
}

// watchCPU calls reached once, from its own goroutine, when this process has used
// budget more CPU time than when it was called (sampled every epochTick): reached
// increments the engine's epoch, interrupting the guest at its next epoch check, or
// on an epochless engine hands the outcome to Spec.Overrun.
func watchCPU(budget time.Duration, reached func()) (stop func()) {
	done := make(chan struct{})
	base := processCPU()
	go func() {
		t := time.NewTicker(epochTick)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				if processCPU()-base >= budget {
					reached()
					return
				}
			}
		}
	}()
	return func() { close(done) }
}

// processCPU is the user+system CPU time of this process (getrusage(2), RUSAGE_SELF).
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
