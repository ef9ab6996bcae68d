// Package protocol defines the versioned messages between the parent (the supervisor or
// the CLI) and a worker process, and how they are framed on the control fd.
//
// A worker is `/proc/self/exe __worker`, started with these file descriptors:
//
//	fd 0  stdin   /dev/null (user stdin travels inside the Request)
//	fd 1  stdout  pipe -> parent (the guest's stdout, read with a byte cap)
//	fd 2  stderr  pipe -> parent (the guest's stderr, read with a byte cap)
//	fd 3  control one end of a Unix socketpair; the parent holds the other end
//	fd 4  the workspace directory, opened and checked by the parent
//	fd 5  the precompiled module: a sealed memfd copy of the verified .cwasm
//	fd 6  tools   one end of a Unix socketpair: the guest's tool calls (tools.go)
//
// Every message on fd 3 is a Frame: its Step, and the Request or Report that step
// carries. A worker serves one run, in one of two ways.
//
// A cold worker is given its run at once:
//
//	parent                                            worker
//	  |  spawn (clean env, new session, PDEATHSIG,       |
//	  |  new user/net/mnt/pid/ipc/uts namespaces)        |
//	  |------------------------------------------------->|
//	  |  run {Request: program, limits, hardening}       |
//	  |------------------------------------------------->| check; prepare (verify the
//	  |                                                  | namespaces, a root of its own);
//	  |                                                  | load the .cwasm; narrow
//	  |                                                  | (rlimits, capabilities,
//	  |                                                  | Landlock, seccomp); verify the
//	  |                                                  | contract; run a fresh instance
//	  |                                                  | of the interpreter's snapshot
//	  |             (guest stdout/stderr on fds 1, 2)    |
//	  |<- - - - - - - - - - - - - - - - - - - - - - - - -|
//	  |  report {Report: exit code, reason, contract}    |
//	  |<-------------------------------------------------| exit
//	  |  wait(); merge the Report with what the parent   |
//	  |  saw (deadline, cancel, output caps) -> Result   |
//
// A warm worker is prepared before its run is known, from a template, and idles in
// the parent's pool until a run claims it:
//
//	|  template {Request: limits, hardening, roots}    |
//	|------------------------------------------------->| check; prepare (namespaces,
//	|                                                  | root, seccomp compiled); load
//	|                                                  | the .cwasm
//	|  ready                                           |
//	|<-------------------------------------------------|
//	|                 (idle in the pool)               |
//	|  claim {Request: program, workspace, limits}     |
//	|------------------------------------------------->|
//	|  ack                                             | (at once: from here the run
//	|<-------------------------------------------------|  is this worker's)
//	|                                                  | check the claim against the
//	|                                                  | template; attach the workspace;
//	|                                                  | narrow; verify the contract;
//	|                                                  | instantiate the snapshot and
//	|                                                  | give it the program
//	|             (guest stdout/stderr on fds 1, 2)    |
//	|  report {Report}                                 |
//	|<-------------------------------------------------| exit
//
// A worker that cannot go on reports instead of the next step it owes (a template it
// cannot prepare gets a report, not ready), and a report is always the last frame.
// A parent that gets no ack within a second runs the claim elsewhere.
//
// The parent owns the wall clock: at the deadline, on cancel, or when an output cap
// is reached it kills the worker's process group, and a missing Report then means
// the worker was killed or crashed. Each frame is a 4-byte big-endian length followed
// by that many bytes of JSON; frames over MaxFrame bytes are refused.
package protocol

import (
	"bufio"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"unicode/utf8"
)

// Version is the protocol version, in every Frame. A worker refuses a frame of
// another version, so a parent and a worker from different builds never guess at
// each other's fields (version 2 added Hardening: a version-1 worker would run
// without it; version 3 warm workers, and the program travels on the guest's stdin;
// version 4 the steps of the exchange as frames of their own; version 5 sessions:
// StepSession, StepCell, StepInterrupt, CellEnd, RolledBack; version 6 a session's
// state saved and resumed: StepSave, StepCheckpoint, Resume; version 7 a cell's
// value apart from its output: ValueMark; version 8 the native backend: Backend,
// RootDir, StepExec; version 9 the tools channel: ToolsFD, StepToolCall,
// StepToolAnswer; version 10 the epochless module of a run: EpochlessModulePath,
// Enforcement.Engine).
const Version = 10

// Step is a frame's place in the exchange (see the package doc).
type Step string

// The steps.
const (
	// StepRun (parent to worker, with a Request): prepare and run it (a cold worker).
	StepRun Step = "run"
	// StepTemplate (parent to worker, with a Request): prepare for a run not yet
	// known, with these limits and this hardening (a warm worker).
	StepTemplate Step = "template"
	// StepReady (worker to parent): prepared for the template; waiting for a claim.
	// A warm native worker's runner sends it after StepExec, once it has imported
	// Request.Preimport.
	StepReady Step = "ready"
	// StepClaim (parent to worker, with a Request): the run, within the template.
	StepClaim Step = "claim"
	// StepAck (worker to parent): the claim is taken; it runs nowhere else. In a
	// session: the cell has its program and starts now (the parent's clock for it
	// starts here).
	StepAck Step = "ack"
	// StepReport (worker to parent, with a Report): how the run ended, or why
	// nothing ran. The last frame of every exchange but a session's, where it also
	// answers StepSession (the session is open: Reason Exited, with the contract)
	// and each StepCell.
	StepReport Step = "report"
	// StepSession (parent to worker, with a Request without a program): prepare as
	// for a run, instantiate the interpreter's snapshot once, report, then run the
	// StepCell frames that follow on that instance, one at a time, until the
	// control fd ends or a cell does not end by itself.
	StepSession Step = "session"
	// StepCell (parent to worker, with a Request: Code, Filename, Stdin, Env,
	// Limits.CPUMS and CellEnd): one cell of a session.
	StepCell Step = "cell"
	// StepInterrupt (parent to worker, with Interrupt): end the running cell, as its
	// wall clock, a cancel or the daemon's quota asks; the worker restores the
	// session's last checkpoint and reports the cell with Interrupt as its reason.
	StepInterrupt Step = "interrupt"
	// StepSave (parent to worker, between a session's cells): send the session's
	// state, its last checkpoint, as a StepCheckpoint; the session goes on.
	StepSave Step = "save"
	// StepCheckpoint (with a Checkpoint, followed on the control fd by the
	// Checkpoint's body, raw): a session's state. The worker sends it for StepSave;
	// the parent sends it right after a StepSession whose Request says Resume, and
	// the worker restores it before it reports the session open.
	StepCheckpoint Step = "checkpoint"
	// StepExec (worker to parent, with a Report carrying only the Enforcement): a
	// native worker (Backend "native") is hardened and now replaces itself with the
	// guest's interpreter (execve(2)), which keeps every layer. What follows on the
	// control fd comes from the guest's own process and is not trusted: at most one
	// StepReport from the interpreter's runner, of which the parent reads only the
	// reason memory_limit for a program that ended with status 1. The run's exit
	// status is the process's own, from wait(2).
	StepExec Step = "exec"
)

// Frame is one message on the control fd.
type Frame struct {
	// Version is the sender's protocol version (Send sets it).
	Version int  `json:"version"`
	Step    Step `json:"step"`
	// Request is the member of StepRun, StepTemplate and StepClaim.
	Request *Request `json:"request,omitempty"`
	// Report is the member of StepReport and StepExec.
	Report *Report `json:"report,omitempty"`
	// Interrupt is the member of StepInterrupt: the reason the cell ends with.
	Interrupt Reason `json:"interrupt,omitempty"`
	// Checkpoint is the member of StepCheckpoint.
	Checkpoint *Checkpoint `json:"checkpoint,omitempty"`
}

// ErrStep is returned by Receive for a frame of a step the receiver does not expect
// now, or without the member its step carries.
var ErrStep = errors.New("protocol: unexpected step")

// Send writes f as one frame, with this build's Version.
func Send(w io.Writer, f Frame) error {
	buf, err := Encode(f)
	if err != nil {
		return err
	}
	if _, err := w.Write(buf); err != nil {
		return fmt.Errorf("protocol: write frame: %w", err)
	}
	return nil
}

// Receive reads one frame and checks it: this build's Version (else ErrVersion), one
// of the steps want (else ErrStep), with the member its step carries (else ErrStep).
// It returns io.EOF when r ends before a frame starts.
func Receive(r io.Reader, want ...Step) (Frame, error) { return ReceiveMax(r, MaxFrame, want...) }

// MaxGuestFrame bounds a frame a native guest's process sends (its runner's
// reports, which the guest can forge): 64 KiB, so that a forged one costs the
// parent little to read and decode.
const MaxGuestFrame = 64 << 10

// ReceiveMax is Receive for frames of at most max bytes (ErrFrameTooLarge past it).
func ReceiveMax(r io.Reader, max int, want ...Step) (Frame, error) {
	var f Frame
	if err := readFrame(r, &f, max); err != nil {
		return f, err
	}
	if f.Version != Version {
		return f, fmt.Errorf("%w: this side speaks %d, the frame is %d", ErrVersion, Version, f.Version)
	}
	if !slices.Contains(want, f.Step) {
		return f, fmt.Errorf("%w: %q where %v was expected", ErrStep, f.Step, want)
	}
	switch f.Step {
	case StepRun, StepTemplate, StepClaim, StepSession, StepCell:
		if f.Request == nil {
			return f, fmt.Errorf("%w: %q without its request", ErrStep, f.Step)
		}
	case StepReport, StepExec:
		if f.Report == nil {
			return f, fmt.Errorf("%w: %q without its report", ErrStep, f.Step)
		}
	case StepCheckpoint:
		if f.Checkpoint == nil {
			return f, fmt.Errorf("%w: %q without its checkpoint", ErrStep, f.Step)
		}
	case StepInterrupt:
		if f.Interrupt == "" {
			return f, fmt.Errorf("%w: %q without its reason", ErrStep, f.Step)
		}
	}
	return f, nil
}

// MaxFrame is the largest frame either side accepts, in bytes (16 MiB). It bounds the
// code, the stdin and the argv a Request may carry.
const MaxFrame = 16 << 20

// MaxCellProgram bounds a session's cell as its worker hands it to the interpreter,
// code, stdin and environment together (1 MiB, the default most a pipe may hold,
// /proc/sys/fs/pipe-max-size): it is written whole before the cell starts.
const MaxCellProgram = 1 << 20

// ErrFrameTooLarge is returned for a frame whose length prefix exceeds MaxFrame.
var ErrFrameTooLarge = errors.New("protocol: frame too large")

// ErrVersion is returned by Receive for a frame of another protocol version.
var ErrVersion = errors.New("protocol: version mismatch")

// Reason says why a run ended. It is a closed set shared by the API, the CLI and the
// audit log.
type Reason string

// The termination reasons.
const (
	// Exited: the program ended by itself; ExitCode is its status.
	Exited Reason = "exited"
	// Timeout: the wall-clock limit was reached and the worker was killed.
	Timeout Reason = "timeout"
	// Cancelled: the caller cancelled the run and the worker was killed.
	Cancelled Reason = "cancelled"
	// CPULimit: the CPU-time limit (epoch deadline) or the fuel was used up.
	CPULimit Reason = "cpu_limit"
	// OutputLimit: stdout or stderr reached its byte cap and the worker was killed.
	OutputLimit Reason = "output_limit"
	// MemoryLimit: the program ended with an uncaught MemoryError (ExitCode 1, as
	// CPython's): an allocation was refused, past the memory limit where the guest
	// grew its memory to it. The interpreter inside the sandbox says so (a program
	// that raises MemoryError itself ends the same way); the limit itself is the
	// engine's, which never lets linear memory past Limits.MemoryBytes.
	MemoryLimit Reason = "memory_limit"
	// QuotaExceeded: the run's workspace grew past its byte or name quota while it
	// ran (the daemon measures it as the run goes) and the worker was killed.
	QuotaExceeded Reason = "quota_exceeded"
	// Trap: WebAssembly trapped (stack exhausted, unreachable, ...).
	Trap Reason = "trap"
	// Rejected: the request was refused before any code ran (policy, bad input).
	Rejected Reason = "rejected"
	// InternalError: the sandbox itself failed (worker crashed, module failed to load).
	InternalError Reason = "internal_error"
)

// Reasons lists every Reason, in documentation order.
func Reasons() []Reason {
	return []Reason{Exited, Timeout, Cancelled, CPULimit, MemoryLimit, OutputLimit, QuotaExceeded, Trap, Rejected, InternalError}
}

// Limits bounds one run. Zero means "no limit of this kind" only where a field says so;
// the parent fills every field from policy before sending a Request.
type Limits struct {
	// TimeoutMS is the wall-clock limit in milliseconds, enforced by the parent.
	TimeoutMS int64 `json:"timeout_ms"`
	// CPUMS is the CPU-time limit in milliseconds, enforced in the worker (its CPU
	// time sampled every 5 ms: a session's cell ends at an epoch deadline, a run on
	// the epochless engine ends the worker); 0 means the wall clock is the only time
	// limit.
	CPUMS int64 `json:"cpu_ms,omitempty"`
	// MemoryBytes caps the guest's linear memory, enforced by the store limiter.
	MemoryBytes int64 `json:"memory_bytes"`
	// Fuel, when non-zero, is the number of fuel units the guest may consume; the
	// worker then uses the fuel-metered module variant.
	Fuel uint64 `json:"fuel,omitempty"`
	// MaxStdoutBytes and MaxStderrBytes cap each stream, enforced by the parent.
	MaxStdoutBytes int64 `json:"max_stdout_bytes"`
	MaxStderrBytes int64 `json:"max_stderr_bytes"`
}

// The backends: where the guest's Python runs (see Request.Backend).
const (
	// BackendWasm runs the bundle's CPython compiled to WebAssembly inside the
	// worker's wasmtime: the guest never executes native code.
	BackendWasm = "wasm"
	// BackendNative runs Debian's CPython and its scientific stack from a read-only
	// root filesystem as the worker process itself, after the worker has hardened it:
	// the kernel's system call surface, narrowed by the seccomp profile for native
	// code, is the boundary.
	BackendNative = "native"
)

// RunModule is the module a run (StepRun, or a warm worker's StepTemplate) of r
// runs, and whether it is the epochless one: EpochlessModulePath for a run without
// fuel when set, else ModulePath. Parent and worker both choose with it.
func (r *Request) RunModule() (path string, epochless bool) {
	if r.EpochlessModulePath != "" && r.Limits.Fuel == 0 {
		return r.EpochlessModulePath, true
	}
	return r.ModulePath, false
}

// Backends lists the backends, the default first.
func Backends() []string { return []string{BackendWasm, BackendNative} }

// Request is a run, or a warm worker's template: the member of StepRun, StepClaim
// and StepTemplate.
type Request struct {
	// Backend is BackendWasm (or "", the same) or BackendNative. A native request
	// names RootDir instead of ModulePath and LibDir.
	Backend string `json:"backend,omitempty"`
	// RootDir (native) is the host directory of the native backend's root file
	// system, verified by the parent against its manifest; the worker mounts it
	// read-only as the guest's "/".
	RootDir string `json:"root_dir,omitempty"`
	// Preimport (native runs) names modules the runner imports before it reads the
	// program: a warm native worker's request (see the sandbox package's
	// NativeWarmOptions), which carries no program. Its fd 0 is then a pipe of the
	// parent's, which the parent fills with Program's bytes and the run's stdin once
	// the run is known. A module that fails to import is left for the program to
	// import (and fail) itself.
	Preimport []string `json:"preimport,omitempty"`
	// ModulePath is the host path of the precompiled module (.cwasm) to run. The
	// parent has verified it against the bundle, and hands the worker a sealed copy
	// of it as fd 5; the worker never opens this path.
	ModulePath string `json:"module_path"`
	// EpochlessModulePath, when set, is the same interpreter precompiled without
	// epoch interruption (the engine's epochless variant), for a run without fuel in
	// a single-use worker: such a run's CPU limit ends the worker. Sessions always
	// run ModulePath. See RunModule.
	EpochlessModulePath string `json:"epochless_module_path,omitempty"`
	// LibDir is the host directory of the interpreter's library, preopened read-only
	// at /usr/local/lib.
	LibDir string `json:"lib_dir"`
	// Workspace is the host directory preopened as /ws (read-write). The parent opens
	// and checks it and hands the worker the open directory as fd 4; the worker uses
	// that, not this path.
	Workspace string `json:"workspace"`
	// Code is Python source to run as `-c`. Exactly one of Code and Path is set.
	Code string `json:"code,omitempty"`
	// Filename is the name Code is compiled under, shown in tracebacks and as
	// sys.argv[0]; empty means "<string>" (as `python -c`).
	Filename string `json:"filename,omitempty"`
	// Path is a script path relative to the workspace, run as /ws/Path.
	Path string `json:"path,omitempty"`
	// Isolated marks Code as a program of the daemon's own (the SQL tool, the
	// self-test's canary and probes), which the workspace must not be able to change:
	// its sys.path is the read-only standard library alone, with no entry for the
	// workspace or the working directory (where `python -c` puts ""), so a module
	// file planted in /ws is never imported. It requires Code, not Path.
	Isolated bool `json:"isolated,omitempty"`
	// Args are the program's arguments (sys.argv[1:]).
	Args []string `json:"args,omitempty"`
	// Stdin is the guest's whole standard input; empty means end of file at once.
	Stdin []byte `json:"stdin,omitempty"`
	// Env is the guest's whole environment, already filtered by the policy allowlist.
	Env map[string]string `json:"env,omitempty"`
	// Limits bounds the run.
	Limits Limits `json:"limits"`
	// Hardening is what the worker must set up before the guest runs.
	Hardening Hardening `json:"hardening"`

	// Roots are host directories (as the parent's kernel names them) beneath which
	// the workspace of a warm worker's claim must lie; the worker keeps them reachable
	// until the claim and then detaches them. Set in the template and the claim alike.
	Roots []string `json:"roots,omitempty"`
	// WorkspaceID identifies the directory the parent checked as the workspace of a
	// claim (a warm worker has no fd 4 to compare with).
	WorkspaceID *FileID `json:"workspace_id,omitempty"`
	// WorkspaceQuota (wasm backend) is the most bytes the workspace and the guest's
	// /tmp may hold together (the daemon's workspaces.max_bytes, which the daemon
	// keeps by measuring both as the run goes), or 0 when nothing but its file
	// system bounds the workspace (a local run). The guest's /tmp is DefaultTmpBytes,
	// or the quota where that is smaller, and the guest's shutil.disk_usage reports
	// the quota; the
	// guest's program cannot change it (it travels in the program's header, not in
	// its environment). A native worker does not use it: its guest's /tmp is
	// Hardening.TmpBytes, bounded on its own, and its statfs(2) is the kernel's.
	WorkspaceQuota int64 `json:"workspace_quota,omitempty"`
	// CellEnd (StepCell) is what the worker writes to the guest's stdout and to its
	// stderr once the cell has ended, before its report: random bytes of the
	// parent's, which the guest never sees, so the parent knows where the cell's
	// output ends on streams that outlive it.
	CellEnd []byte `json:"cell_end,omitempty"`
	// ValueMark (StepCell) is random hex of the parent's for this cell: the
	// interpreter writes the value of the cell's last expression to stdout between
	// marks made of it (see bundle/bootstrap.py), after the cell's own output, and
	// the parent takes it out as the cell's value. Empty: the value is shown on
	// stdout as the interactive interpreter shows it.
	ValueMark string `json:"value_mark,omitempty"`
	// Resume (StepSession) says a StepCheckpoint follows: the session's state to
	// restore into its instance before it opens, instead of the snapshot's.
	Resume bool `json:"resume,omitempty"`
	// Fork (StepSession, with Resume) says the state restored is another
	// session's, forked from it: what the interpreter seeded from a one-time random
	// source (random's generator, tempfile's names) is seeded afresh at the next
	// cell, and again at each later one until a cell keeps its state (one rolled
	// back goes back to the state before the reseed).
	Fork bool `json:"fork,omitempty"`
}

// DefaultTmpBytes is the size of a wasm guest's /tmp (a tmpfs of its worker's own
// mount namespace: memory, which no memory limit counts) unless the request's
// WorkspaceQuota is smaller (64 MiB, as the native backend's default).
const DefaultTmpBytes = 64 << 20

// GuestTmpDir is where a wasm worker with its own mount namespace mounts the guest's
// /tmp, in that namespace: the parent reaches it as /proc/PID/root/GuestTmpDir to
// count what it holds against the workspace's quota.
const GuestTmpDir = "/guest/tmp"

// FileID is a file's identity: its device and inode numbers (stat(2)).
type FileID struct {
	Dev uint64 `json:"dev"`
	Ino uint64 `json:"ino"`
}

// Report is what a worker sends back after the guest ends (StepReport). The parent merges it with
// what it observed itself into a Result.
type Report struct {
	// ExitCode is the guest's WASI exit status (0 when it returned normally).
	ExitCode int `json:"exit_code"`
	// Reason is Exited, CPULimit, Trap or InternalError.
	Reason Reason `json:"reason"`
	// FuelConsumed is the fuel used, when fuel metering was on.
	FuelConsumed uint64 `json:"fuel_consumed,omitempty"`
	// PeakMemoryBytes is the guest's linear memory size at the end (it never shrinks).
	PeakMemoryBytes int64 `json:"peak_memory_bytes"`
	// Diagnostics are short messages for the operator (trap text, load errors). They
	// never contain host paths.
	Diagnostics []string `json:"diagnostics,omitempty"`
	// Enforcement is the contract the worker verified before the guest ran; nil when
	// the worker failed before it could tell.
	Enforcement *Enforcement `json:"enforcement,omitempty"`
	// RolledBack (a session's cell) says the cell did not end by itself and the
	// session's interpreter was restored to its state before the cell.
	RolledBack bool `json:"rolled_back,omitempty"`
	// PeakRSSBytes is the worker's peak resident set (VmHWM, proc(5)).
	PeakRSSBytes int64 `json:"peak_rss_bytes,omitempty"`
	// Displays (from a native guest's runner: untrusted) name the files of what
	// the program displayed; the parent checks each before it becomes a Display of
	// the Result.
	Displays []Display `json:"displays,omitempty"`
}

// Display is one item a program displayed, in order: a figure open at its end, an
// object given to display() (its richest representation, as IPython defines them:
// _repr_mimebundle_, _repr_png_, _repr_svg_, _repr_html_, _repr_json_, then its
// repr as text/plain). The whole item is a workspace file (Path); the parent has
// checked it is a regular file of at most MaxDisplayBytes, of its type.
type Display struct {
	// Type is the MIME type: one of DisplayTypes.
	Type string `json:"type"`
	// Path is the file's path in the workspace (under displays/).
	Path string `json:"path"`
	// Bytes is the file's size.
	Bytes int64 `json:"bytes"`
	// Width and Height are an image's size in pixels (image/png).
	Width  int `json:"width,omitempty"`
	Height int `json:"height,omitempty"`
	// Text is the content of a text type (text/plain, text/html, application/json)
	// when it is at most MaxDisplayText bytes of UTF-8; larger, read the file.
	Text string `json:"text,omitempty"`
}

// DisplayTypes are the MIME types a Display may have.
func DisplayTypes() []string {
	return []string{"image/png", "image/svg+xml", "text/html", "application/json", "text/plain"}
}

// Bounds of displays: at most MaxDisplays per run, each file at most
// MaxDisplayBytes (16 MiB), a PNG at most MaxDisplayPixels (40 megapixels), text
// carried inline up to MaxDisplayText bytes (64 KiB).
const (
	MaxDisplays      = 64
	MaxDisplayBytes  = 16 << 20
	MaxDisplayPixels = 40_000_000
	MaxDisplayText   = 64 << 10
)

// Result is the outcome of one run as the parent reports it to callers.
//
// In JSON, stdout and stderr are strings when they are valid UTF-8 (the usual case);
// otherwise they are base64 and stdout_encoding or stderr_encoding says "base64", so
// no byte is lost or replaced.
type Result struct {
	ExitCode int    `json:"exit_code"`
	Reason   Reason `json:"reason"`
	// Stdout and Stderr are the output, one slice each. A parent that keeps the
	// output it gathers (the daemon's runs) holds it in pieces instead, in
	// StdoutPieces and StderrPieces (see Output), and leaves these nil; Streams
	// returns the output whichever way it is held.
	Stdout          []byte  `json:"-"`
	Stderr          []byte  `json:"-"`
	StdoutPieces    *Output `json:"-"`
	StderrPieces    *Output `json:"-"`
	StdoutTruncated bool    `json:"stdout_truncated"`
	StderrTruncated bool    `json:"stderr_truncated"`
	ElapsedMS       float64 `json:"elapsed_ms"`
	FuelConsumed    uint64  `json:"fuel_consumed,omitempty"`
	PeakMemoryBytes int64   `json:"peak_memory_bytes"`
	// WorkerMaxRSSBytes is the worker process's peak resident set, engine and
	// interpreter included (VmHWM as the worker reports it; getrusage(2) ru_maxrss
	// when it could not, which may count the parent's memory from before the exec).
	WorkerMaxRSSBytes int64    `json:"worker_max_rss_bytes"`
	Diagnostics       []string `json:"diagnostics,omitempty"`
	// Enforcement is the worker's contract: the layers that were in force while the
	// guest ran (see Enforcement).
	Enforcement *Enforcement `json:"enforcement,omitempty"`
	// Displays are what the program displayed, in order (see Display).
	Displays []Display `json:"displays,omitempty"`
}

// resultJSON is Result's wire form; see Result.
type resultJSON struct {
	resultAlias
	Stdout         string `json:"stdout"`
	StdoutEncoding string `json:"stdout_encoding,omitempty"`
	Stderr         string `json:"stderr"`
	StderrEncoding string `json:"stderr_encoding,omitempty"`
}

type resultAlias Result

// Streams returns r's stdout and stderr whichever way r holds them: its pieces, or
// Stdout and Stderr as one piece each (not copied).
func (r Result) Streams() (stdout, stderr *Output) {
	stdout, stderr = r.StdoutPieces, r.StderrPieces
	if stdout == nil {
		stdout = OutputOf(r.Stdout)
	}
	if stderr == nil {
		stderr = OutputOf(r.Stderr)
	}
	return stdout, stderr
}

// Joined returns r with its output in Stdout and Stderr, one slice each: output held
// in several pieces is copied into one.
func (r Result) Joined() Result {
	stdout, stderr := r.Streams()
	r.Stdout, r.Stderr = stdout.Bytes(), stderr.Bytes()
	r.StdoutPieces, r.StderrPieces = nil, nil
	return r
}

// MarshalJSON encodes r with its output as text or, if not UTF-8, as base64.
func (r Result) MarshalJSON() ([]byte, error) {
	stdout, stderr := r.Streams()
	out := resultJSON{resultAlias: resultAlias(r)}
	out.Stdout, out.StdoutEncoding = encodeOutput(stdout.Bytes())
	out.Stderr, out.StderrEncoding = encodeOutput(stderr.Bytes())
	return json.Marshal(out)
}

// UnmarshalJSON is the inverse of MarshalJSON.
func (r *Result) UnmarshalJSON(b []byte) error {
	var in resultJSON
	if err := json.Unmarshal(b, &in); err != nil {
		return err
	}
	*r = Result(in.resultAlias)
	var err error
	if r.Stdout, err = decodeOutput(in.Stdout, in.StdoutEncoding); err != nil {
		return fmt.Errorf("protocol: stdout: %w", err)
	}
	if r.Stderr, err = decodeOutput(in.Stderr, in.StderrEncoding); err != nil {
		return fmt.Errorf("protocol: stderr: %w", err)
	}
	return nil
}

// WriteJSON writes what MarshalJSON returns (members in another order) to w,
// streaming the output from where it is held: it needs a small buffer whatever the
// output's size, where MarshalJSON holds the whole encoding (up to six bytes per
// byte of output).
func (r Result) WriteJSON(w io.Writer) error {
	meta, err := json.Marshal(resultAlias(r)) // the output is left out ("-")
	if err != nil {
		return err
	}
	stdout, stderr := r.Streams()
	bw := bufio.NewWriterSize(w, 32<<10)
	bw.Write(meta[:len(meta)-1]) // without the closing brace
	for _, s := range []struct {
		name string
		out  *Output
	}{{"stdout", stdout}, {"stderr", stderr}} {
		bw.WriteString(`,"` + s.name + `":"`)
		if s.out.ValidUTF8() {
			s.out.writeJSONText(bw)
			bw.WriteString(`"`)
			continue
		}
		enc := base64.NewEncoder(base64.StdEncoding, bw)
		for i := range s.out.NumPieces() {
			enc.Write(s.out.Piece(i))
		}
		enc.Close()
		bw.WriteString(`","` + s.name + `_encoding":"base64"`)
	}
	bw.WriteString("}")
	return bw.Flush()
}

func encodeOutput(b []byte) (text, encoding string) {
	if utf8.Valid(b) {
		return string(b), ""
	}
	return base64.StdEncoding.EncodeToString(b), "base64"
}

func decodeOutput(text, encoding string) ([]byte, error) {
	switch encoding {
	case "":
		return []byte(text), nil
	case "base64":
		return base64.StdEncoding.DecodeString(text)
	default:
		return nil, fmt.Errorf("unknown encoding %q", encoding)
	}
}

// Encode returns f, with this build's Version, as one frame: a 4-byte big-endian
// length, then JSON. A frame over MaxFrame is refused with ErrFrameTooLarge, so a
// sender can check before it starts a worker.
func Encode(f Frame) ([]byte, error) {
	f.Version = Version
	body, err := json.Marshal(f)
	if err != nil {
		return nil, fmt.Errorf("protocol: encode frame: %w", err)
	}
	if len(body) > MaxFrame {
		return nil, fmt.Errorf("protocol: frame of %d bytes: %w", len(body), ErrFrameTooLarge)
	}
	buf := make([]byte, 4+len(body))
	binary.BigEndian.PutUint32(buf, uint32(len(body)))
	copy(buf[4:], body)
	return buf, nil
}

// readFrame reads one frame from r into v. It returns io.EOF when r ends before a
// frame starts, and io.ErrUnexpectedEOF when it ends inside one.
func readFrame(r io.Reader, v any, max int) error {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if int64(n) > int64(max) {
		return fmt.Errorf("protocol: read %d bytes: %w", n, ErrFrameTooLarge)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return err
	}
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("protocol: decode frame: %w", err)
	}
	return nil
}
