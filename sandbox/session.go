package sandbox

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sandcell/sandcell/sandbox/protocol"
)

// ErrSessionLost is returned by Session.Run once the session's worker is gone: a
// cell that could not be interrupted and rolled back, a worker that died, or Close
// ended it. Its interpreter state went with it.
var ErrSessionLost = errors.New("sandbox: the session's interpreter state is lost")

// ErrNoCheckpoint is returned by Save for a session on the native backend, whose
// interpreter (and its checkpoint) is a process the sandbox cannot save to disk
// (nothing is lost: the session goes on).
var ErrNoCheckpoint = errors.New("sandbox: a native session keeps no checkpoint on disk")

// openTimeout bounds how long a session's worker may take to harden itself and
// instantiate the snapshot.
const openTimeout = 30 * time.Second

// SessionCPU is the CPU time a session's worker may use in all (RLIMIT_CPU, its
// backstop): each cell is bounded by its own CPU and wall-clock limits, and the
// whole session by this; past it the worker is killed and the session lost.
const SessionCPU = time.Hour

// sessionCPU is SessionCPU as the daemon keeps it for a native session with
// checkpoints (startLimits); tests lower it.
var sessionCPU = SessionCPU

// Session is one worker, hardened exactly as a cold run's, that runs many cells on
// one instance of the interpreter's snapshot: what one cell defines, the next sees.
// It serves one cell at a time (Run holds it). Create it with OpenSession; Close it.
type Session struct {
	p      *proc
	native bool     // a native session
	ws     *os.File // the session's workspace, where its displays are read
	// forks are a native session's checkpoints (nil: it keeps none, and a cell
	// that does not end by itself ends the session); listener is the filter's,
	// received with the contract, until they are made.
	forks    *forks
	listener *os.File
	// processes: a native session whose guest may start processes (see idle).
	processes bool
	memory    int64 // the memory limit: a saved checkpoint is at most that
	opened    protocol.Enforcement
	mu        sync.Mutex
	lost      string // why the state is lost, once it is
	// calls is the running cell's tool scope (nil between cells): the session's
	// tools channel is served for its whole life, each call for the cell it
	// comes in.
	calls      atomic.Pointer[toolScope]
	toolServer *toolServer // serves the channel (nil: none)
	endCalls   func()      // ends the running cell's calls (under mu)
	closing    atomic.Bool
}

// OpenSession starts a session's worker for req (a run's request without a
// program: workspace, module, library, limits and hardening, which every cell keeps;
// the pool is not used) and waits until it has hardened itself, verified the
// contract and instantiated the snapshot. Errors wrap ErrBadRequest for a request
// no worker can serve; a worker that refused (a required layer not active) or failed
// gives an error that says why, and nothing keeps running.
func (s *Spawner) OpenSession(ctx context.Context, req protocol.Request) (*Session, error) {
	req.Resume, req.Fork = false, false
	return s.openSession(ctx, req, nil)
}

// ResumeSession starts a session's worker for req as OpenSession does, with the
// state a Session's Save wrote to from (a checkpoint file) in place of the
// snapshot's: its first cell finds what the saved session's cells defined (files
// it held open are closed: see Run). req must be the saved session's (its memory
// limit at least; the same interpreter: a checkpoint is one module's memory). A
// damaged or malformed checkpoint is an error wrapping ErrCheckpoint, and nothing
// runs.
func (s *Spawner) ResumeSession(ctx context.Context, req protocol.Request, from io.Reader) (*Session, error) {
	c, err := ReadCheckpointHeader(from, req.Limits.MemoryBytes)
	if err != nil {
		return nil, err
	}
	req.Resume = true
	return s.openSession(ctx, req, func(ctl io.Writer) error {
		if err := protocol.Send(ctl, protocol.Frame{Step: protocol.StepCheckpoint, Checkpoint: c}); err != nil {
			return err
		}
		h := crc32.New(crc32.MakeTable(crc32.Castagnoli))
		if n, err := io.CopyN(io.MultiWriter(ctl, h), from, c.BodyBytes()); err != nil {
			if n < c.BodyBytes() && errors.Is(err, io.EOF) {
				return fmt.Errorf("%w: it ends after %d of its %d bytes", ErrCheckpoint, n, c.BodyBytes())
			}
			return err
		}
		if h.Sum32() != c.CRC32C {
			// The worker has restored it, but runs nothing before it opens.
			return fmt.Errorf("%w: its body does not match its checksum (damaged)", ErrCheckpoint)
		}
		return nil
	})
}

// openSession starts a session's worker; resume, when not nil, gives it the
// checkpoint after the StepSession frame.
func (s *Spawner) openSession(ctx context.Context, req protocol.Request, resume func(ctl io.Writer) error) (*Session, error) {
	req.Code, req.Path = "", ""
	if err := check(&req); err != nil {
		return nil, err
	}
	req.Hardening.Rlimits.CPU = uint64(SessionCPU / time.Second)
	wsDir, err := s.prepare(&req)
	if err != nil {
		return nil, err
	}
	defer wsDir.Close()
	native := req.Backend == protocol.BackendNative
	if native && resume != nil {
		return nil, fmt.Errorf("%w: a native session keeps no checkpoint to resume", ErrBadRequest)
	}
	if why := unboundedProcesses(req.Hardening); native && why != "" {
		return nil, fmt.Errorf("%w: session refused (%s): %s", ErrUnavailable, protocol.Rejected, why)
	}
	if native && slices.Contains(req.Hardening.Require, protocol.LayerGVisor) {
		// Not yet: a native session's cell CPU watch and its stop between cells act
		// on the interpreter's own process, which under runsc is the sentry's to
		// run; and no session runs without a layer policy requires.
		return nil, fmt.Errorf("%w: session refused (%s): policy requires the gvisor layer, under which "+
			"native sessions are not offered yet (native runs are); no code was run", ErrUnavailable, protocol.Rejected)
	}
	if native && resume == nil {
		if w := s.takeNative(&req, wsDir); w != nil {
			if ss := s.openSessionWarm(ctx, w, req, wsDir); ss != nil {
				ss.idle()
				s.warmNativeAfter(req)
				return ss, nil
			}
		}
	}
	var module *os.File
	if !native {
		if module, err = s.sealedModule(req.ModulePath); err != nil {
			return nil, fmt.Errorf("sandbox: module: %w", err)
		}
		defer module.Close()
	}
	p, err := s.launch(req.Hardening.Namespaces || native, req.Hardening.SharedNetwork, wsDir, module, nil)
	if err != nil {
		return nil, fmt.Errorf("sandbox: start the session's worker: %w", err)
	}
	ss := &Session{p: p, memory: req.Limits.MemoryBytes, processes: native && req.Hardening.Processes, native: native}
	ss.serveTools()
	if ss.ws, err = dupFile(wsDir); err != nil {
		p.kill()
		return nil, fmt.Errorf("sandbox: session: %w", err)
	}
	if err := protocol.Send(p.ctl, protocol.Frame{Step: protocol.StepSession, Request: &req}); err != nil {
		ss.Close()
		return nil, fmt.Errorf("sandbox: session: %w", err)
	}
	ch := ss.first() // a worker that refuses reports at once, and reads no checkpoint
	if resume != nil {
		// A write that fails because the worker refused and left is told by its
		// report; a checkpoint that cannot be read is told at once.
		if err := resume(p.ctl); errors.Is(err, ErrCheckpoint) {
			ss.Close()
			return nil, fmt.Errorf("sandbox: session: %w", err)
		}
	}
	rep, err := ss.wait(ctx, ch, openTimeout)
	if native && err == nil && rep.Reason == "" && rep.Enforcement != nil {
		// The worker's contract (StepExec); the interpreter it became says the
		// session is open with a report of its own.
		contract := rep.Enforcement
		if ss.listener != nil {
			// Before the interpreter's report: its pid 1 forks it first.
			ss.forks, ss.listener = superviseForks(ss.listener, p.cmd.Process.Pid, true), nil
		}
		if rep, err = ss.wait(ctx, ss.next(), openTimeout); err == nil {
			rep.Enforcement = contract
		}
	}
	switch {
	case err != nil:
		ss.Close()
		return nil, fmt.Errorf("sandbox: session: the worker did not open it: %w", err)
	case rep.Reason != protocol.Exited:
		ss.Close()
		return nil, fmt.Errorf("sandbox: session refused (%s): %v", rep.Reason, rep.Diagnostics)
	}
	if missing := checkContract(rep, req.Hardening.Require); missing != "" {
		ss.Close()
		return nil, fmt.Errorf("sandbox: session: %s", missing)
	}
	ss.opened = *rep.Enforcement
	if ss.forks != nil {
		if err := ss.forks.adopt(0); err != nil {
			ss.Close()
			return nil, fmt.Errorf("sandbox: session: %w", err)
		}
	}
	if native {
		ss.idle()
		// The next native session or run in this workspace may find a warm worker.
		s.warmNativeAfter(req)
	}
	return ss, nil
}

// idle stops a native session's interpreter between cells (SIGSTOP to its process
// group: every thread), so that nothing it left running (a thread's loop, a
// process) uses CPU that no cell's cpu_ms counts; the next cell continues it first.
// With processes allowed, the processes a cell started end with it: every process of
// the session's pid namespace but the interpreter is killed (a process that left the
// interpreter's group would escape the stop, and could continue the interpreter).
// With checkpoints, the last cell's checkpoint is killed (the cell ended by itself):
// the session's only process besides pid 1 and the interpreter.
// A wasm session's worker runs nothing of the guest's between cells.
func (ss *Session) idle() {
	if ss.processes {
		endOthers(ss.p.cmd.Process.Pid)
	}
	if ss.forks != nil {
		ss.forks.drop() // the last cell's checkpoint, if the cell ended by itself
	}
	ss.p.signalGroup(syscall.SIGSTOP)
}

// PID is the session's worker process.
func (ss *Session) PID() int { return ss.p.cmd.Process.Pid }

// Enforcement is the contract the session's worker verified when it opened; every
// cell runs under it.
func (ss *Session) Enforcement() protocol.Enforcement { return ss.opened }

// wait reads the frame ch (of next) brings, the worker's report, within d (or
// until ctx ends); it kills the worker when none comes.
func (ss *Session) wait(ctx context.Context, ch <-chan received, d time.Duration) (protocol.Report, error) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case g := <-ch:
		return g.rep, g.err
	case <-t.C:
		ss.p.kill()
		<-ch
		return protocol.Report{}, errors.New("timed out")
	case <-ctx.Done():
		ss.p.kill()
		<-ch
		return protocol.Report{}, ctx.Err()
	}
}

type received struct {
	ack bool // StepAck: the cell started
	rep protocol.Report
	err error
}

// first is next for the worker's first frame, which may carry a file: a native
// session's seccomp listener, with its contract (protocol.SendFile), kept in
// ss.listener before the frame is given.
func (ss *Session) first() <-chan received {
	if !ss.native {
		return ss.next()
	}
	ch := make(chan received, 1)
	go func() {
		f, file, err := protocol.ReceiveFile(ss.p.ctl, protocol.MaxFrame, protocol.StepReport, protocol.StepExec)
		switch {
		case err != nil:
			ch <- received{err: err}
		default:
			ss.listener = file
			ch <- received{rep: *f.Report}
		}
	}()
	return ch
}

// next reads the worker's next frame (a report, or a cell's ack) in the background.
func (ss *Session) next() <-chan received {
	ch := make(chan received, 1)
	go func() {
		max := protocol.MaxFrame
		if ss.native && ss.opened.Backend != "" {
			max = protocol.MaxGuestFrame // the interpreter's own frames, which the guest can forge
		}
		f, err := protocol.ReceiveMax(ss.p.ctl, max, protocol.StepReport, protocol.StepAck, protocol.StepExec)
		switch {
		case err != nil:
			ch <- received{err: err}
		case f.Step == protocol.StepAck:
			ch <- received{ack: true}
		default:
			ch <- received{rep: *f.Report}
		}
	}()
	return ch
}

// envBytes is the size of env's names and values.
func envBytes(env map[string]string) int {
	n := 0
	for k, v := range env {
		n += len(k) + len(v) + 2
	}
	return n
}

// Cell is how a session's cell ended.
type Cell struct {
	// Result is a run's, with the session's contract.
	protocol.Result
	// Value is the value of the cell's last expression as sys.displayhook shows it
	// (its repr, without the line end), apart from the output; "" when the cell
	// does not end with an expression, when its value is None, or when the cell
	// ended before it was shown. ValueTruncated says it was cut at the stdout cap.
	Value          string
	ValueTruncated bool
	// RolledBack says the cell did not end by itself and the interpreter is back
	// to its state before it.
	RolledBack bool
}

// interruptGrace is how long a cell's worker has, once interrupted, to restore the
// session's checkpoint and report before it is killed (and the state lost).
const interruptGrace = 2 * time.Second

// Run runs one cell: cell.Code (its name in tracebacks cell.Filename, "<cell>" when
// empty), with cell.Stdin, cell.Env added to the environment, and cell.Limits's
// TimeoutMS, CPUMS and stream caps (the memory limit is the session's). The Result
// is a run's, with the session's contract; a last expression's value is the Cell's
// Value, apart from stdout. A cell that ends by itself (an exception
// included) keeps what it did. One that does not (its wall clock or CPU limit, a
// trap, an uncaught MemoryError, a cancel through ctx, or a *Stop cause of ctx's) is
// rolled back: the interpreter is back to its state before the cell (RolledBack;
// files it wrote stay written). When even that fails (the worker does not
// answer within interruptGrace, or dies), the session is lost: ErrSessionLost from
// then on. Output past a stream's cap is cut (the flag set) without ending the cell.
// The Result holds the output as one slice per stream (Stdout, Stderr).
func (ss *Session) Run(ctx context.Context, cell protocol.Request) (Cell, error) {
	c, err := ss.RunStreaming(ctx, cell, nil)
	c.Result = c.Result.Joined()
	return c, err
}

// CheckCell returns an error wrapping ErrBadRequest when cell cannot run in any
// session, whatever its state and limits: CheckProgram's refusals, or code, stdin,
// filename and environment over protocol.MaxCellProgram-4096 bytes together. Callers
// may use it to refuse a cell before admitting it (before an approval is asked for
// or spent).
func CheckCell(cell protocol.Request) error {
	if err := CheckProgram(&protocol.Request{Code: cell.Code, Stdin: cell.Stdin, Env: cell.Env}); err != nil {
		return err
	}
	if n := len(cell.Code) + len(cell.Stdin) + len(cell.Filename) + envBytes(cell.Env); n > protocol.MaxCellProgram-4096 {
		return fmt.Errorf("%w: a cell's code, stdin and environment are %d bytes, over %d",
			ErrBadRequest, n, protocol.MaxCellProgram-4096)
	}
	return nil
}

// RunStreaming is Run, with observe (when not nil) given the cell's output as the
// worker produces it, stream by stream ("stdout", "stderr"; the value is not
// output), within the caps, from the goroutines that read it, as slices of the
// pieces the Cell's Result holds the output in (StdoutPieces, StderrPieces: each
// byte is held once, by both). An observer that blocks holds the cell's output, and so the cell:
// it must give up on a reader that stops (the API's does after 2 s).
func (ss *Session) RunStreaming(ctx context.Context, cell protocol.Request, observe Observer) (Cell, error) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.lost != "" {
		return Cell{}, fmt.Errorf("%w: %s", ErrSessionLost, ss.lost)
	}
	if err := CheckCell(cell); err != nil {
		return Cell{}, err
	}
	l := cell.Limits
	if l.TimeoutMS <= 0 || l.MaxStdoutBytes <= 0 || l.MaxStderrBytes <= 0 {
		return Cell{}, fmt.Errorf("%w: limits are incomplete", ErrBadRequest)
	}
	if ctx.Err() != nil {
		// Stopped before it was sent: the cell never runs, and the state is as
		// before it (RolledBack, as for any cell that did not end by itself).
		why, detail := stopCause(ctx)
		res := protocol.Result{ExitCode: -1, Reason: why,
			Diagnostics: []string{"the cell was stopped before it started; the session's state is as it was"}}
		if detail != "" {
			res.Diagnostics = append(res.Diagnostics, detail)
		}
		enf := ss.opened
		res.Enforcement = &enf
		return Cell{Result: res, RolledBack: true}, nil
	}
	end := make([]byte, 32)
	rand.Read(end)
	mark := make([]byte, 16)
	rand.Read(mark)
	frame := protocol.Request{Code: cell.Code, Filename: cell.Filename, Stdin: cell.Stdin, Env: cell.Env,
		Limits: protocol.Limits{CPUMS: l.CPUMS}, CellEnd: end, ValueMark: hex.EncodeToString(mark)}
	began := time.Now()
	// The cell's wall clock: a tool call may hold it (see Clock); it runs from
	// lim.start. Its calls end when it does (an interrupted cell's call first, so
	// that a wasm worker waiting in one hears its interrupt).
	clock, startClock := heldDeadline(time.Duration(l.TimeoutMS) * time.Millisecond)
	defer clock.Stop()
	// The calls end when the cell has (or a rollback ends them), not when its
	// context does: a cell stopped in a call returns into its interrupt first.
	calls, endCalls := context.WithCancel(context.WithoutCancel(ctx))
	defer endCalls()
	ss.endCalls = endCalls // (a rollback ends them once the interpreter has)
	ss.calls.Store(&toolScope{ctx: calls, tools: toolsOf(ctx), clock: clock})
	defer ss.calls.Store(nil)
	lim := cellLimits{clock: clock, startClock: startClock}
	if ss.native {
		ss.p.signalGroup(syscall.SIGCONT) // stopped since the last cell (see idle)
	}
	// A native cell's limits run from its frame: what the runner does before its
	// ack (the checkpoint's fork, with the guest's at-fork hooks and signal
	// handlers) is the cell's. A wasm cell's clock starts at its ack (after the
	// previous cell's checkpoint, which the worker may still be taking), and a
	// cancel is heard once it has started.
	if ss.native {
		if err := ss.startLimits(&lim, ctx, l); err != nil {
			return Cell{}, err
		}
		defer lim.stop()
	}
	if ss.forks != nil {
		ss.forks.window(true) // for the cell's checkpoint, until its ack
	}
	if err := protocol.Send(ss.p.ctl, protocol.Frame{Step: protocol.StepCell, Request: &frame}); err != nil {
		ss.lose("the worker is gone")
		return Cell{}, fmt.Errorf("%w: the worker is gone", ErrSessionLost)
	}
	stdout := cellStream{out: protocol.NewOutput(l.MaxStdoutBytes), value: valueMarks(frame.ValueMark), name: "stdout", observe: observe}
	stderr := cellStream{out: protocol.NewOutput(l.MaxStderrBytes), name: "stderr", observe: observe}
	if ss.forks != nil {
		// A rolled back cell's output ends with its checkpoint's marker instead.
		stdout.alt, stderr.alt = rollbackMarker(end), rollbackMarker(end)
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); stdout.read(ss.p.outR, end, l.MaxStdoutBytes) }()
	go func() { defer wg.Done(); stderr.read(ss.p.errR, end, l.MaxStderrBytes) }()

	ch := ss.next()
	var got received
	var why protocol.Reason // why the cell was interrupted, if it was
	heard := true           // got is the worker's first frame of the cell
	ackWait := time.NewTimer(openTimeout)
	defer ackWait.Stop()
	select {
	case got = <-ch:
	case <-ackWait.C:
		ss.p.kill()
		got = <-ch
		got.err = errors.New("the worker did not start the cell")
	case why = <-lim.why:
		heard = false
		if ss.forks != nil {
			// Stopped before its ack: the checkpoint's fork (and the guest's at-fork
			// hooks) may be under way. Its ack comes within interruptGrace, or the
			// cell has no checkpoint to roll back to.
			grace := time.NewTimer(interruptGrace)
			select {
			case got = <-ch:
				heard, ch = true, ss.next()
			case <-grace.C:
			}
			grace.Stop()
		}
	}
	if ss.native && heard && got.err == nil && !got.ack {
		// A report where the cell's ack was due: a frame the guest wrote in an
		// earlier cell. Its frames cannot be told from the runner's any more.
		ss.p.kill()
		got = received{err: errors.New("the interpreter sent a frame out of turn")}
	}
	checkpointed := false // the cell's checkpoint was forked, and is kept
	ended := false        // the interpreter ended during the cell by itself
	unwatch := func() {}  // ends the checkpoint's watch, if one runs
	if ss.forks != nil && (why != "" || got.err == nil && got.ack) {
		checkpointed = ss.forks.window(false) && ss.forks.keep()
	}
	if why == "" && got.err == nil && got.ack {
		ch = ss.next()
		got = received{}
		if !ss.native {
			lim.start(ctx, nil)
			defer lim.stop()
		}
		var exit <-chan struct{} // nil: not watched (the interpreter is the worker)
		if checkpointed {
			exit, unwatch = ss.forks.watch()
			defer unwatch()
		}
		select {
		case got = <-ch:
		case <-exit:
			ended = true
		case why = <-lim.why:
		}
	}
	unwatch() // before a rollback continues the checkpoint
	rolledBack := false
	switch {
	case why == protocol.CPULimit && lim.sessionOver:
		// The session's CPU time in all, not the cell's: no rollback gives it back.
		ss.p.kill()
		got = <-ch
		got.err = fmt.Errorf("the session used its CPU time in all (%s, a backstop beside each cell's limits)", sessionCPU)
		ss.lose(got.err.Error())
	case (why != "" || ended) && checkpointed:
		got = ss.rollback(ch)
		rolledBack = got.err == nil
	case why != "" && ss.native:
		// No checkpoint to roll back to: the cell ends its session.
		ss.p.kill()
		got = <-ch
		got.err = errors.New("the native session keeps no checkpoint to roll back to")
		if ss.forks != nil {
			got.err = errors.New("the cell had no checkpoint (its fork failed, or the process forked was not the runner's stopped checkpoint: see os.register_at_fork)")
		}
	case why != "":
		grace := time.NewTimer(interruptGrace)
		defer grace.Stop()
		// A call the cell waits in returns into the interrupt (the worker stops
		// waiting for its answer once the engine is interrupted); the call itself
		// ends with the cell.
		if protocol.Send(ss.p.ctl, protocol.Frame{Step: protocol.StepInterrupt, Interrupt: why}) != nil {
			ss.p.kill()
		}
		select {
		case got = <-ch:
		case <-grace.C:
			ss.p.kill()
			got = <-ch
			got.err = fmt.Errorf("the interrupted cell did not end within %s", interruptGrace)
		}
	case checkpointed && got.err == nil && ss.forks.gone():
		// The interpreter ended as its cell ended (a thread's os._exit after the
		// report): what the cell did is gone with it, and its checkpoint carries
		// on, as for a cell that ended the interpreter in its middle.
		got = ss.rollback(ss.next())
		rolledBack, ended = got.err == nil, got.err == nil
	}
	res := protocol.Result{ExitCode: -1, Reason: why}
	switch {
	case ended && rolledBack:
		// The interpreter ended in the middle of the cell (os._exit, a signal, a
		// crash); its checkpoint is the interpreter now.
		res.Reason = protocol.Exited
		res.Diagnostics = []string{"the interpreter ended during the cell (os._exit, a signal, a crash, or the runner's descriptors closed under it); its checkpoint from before the cell carries on"}
	case rolledBack:
		// The interpreter was ended; its checkpoint is the interpreter now.
	case got.err == nil && ss.native:
		// The interpreter's report (untrusted): its status alone, within a shell's.
		res.ExitCode, res.Reason = got.rep.ExitCode&0xFF, protocol.Exited
	case got.err == nil:
		res.ExitCode, res.Reason, res.Diagnostics = got.rep.ExitCode, got.rep.Reason, got.rep.Diagnostics
		res.PeakMemoryBytes, res.FuelConsumed, res.WorkerMaxRSSBytes = got.rep.PeakMemoryBytes, got.rep.FuelConsumed, got.rep.PeakRSSBytes
		rolledBack = got.rep.RolledBack
		var stop *Stop
		if why != "" && got.rep.Reason == why && errors.As(context.Cause(ctx), &stop) {
			res.Diagnostics = append(res.Diagnostics, stop.Detail)
		}
	case why == "" && ss.exitedByCPU():
		res.Reason = protocol.CPULimit
		res.Diagnostics = []string{fmt.Sprintf("the session's worker reached its CPU-time backstop (%s in all)", SessionCPU)}
	case why == "":
		res.Reason = protocol.InternalError
		res.Diagnostics = []string{"the session's worker ended without a report: " + got.err.Error()}
	default:
		res.Diagnostics = []string{got.err.Error()}
	}
	if ss.closing.Load() {
		// Closed during the cell: what ended it is the close, not what the dying
		// worker's pieces said about it.
		res.ExitCode, res.Reason, rolledBack = -1, protocol.Cancelled, false
		res.Diagnostics = []string{"the session was closed during the cell"}
		ss.lose("the session was closed")
	}
	if got.err != nil || res.Reason != protocol.Exited && !rolledBack {
		ss.lose(fmt.Sprintf("a cell ended %s and the state could not be restored", res.Reason))
		ss.p.kill() // its streams end, so the reads do
	}
	if ss.native {
		// The end markers follow the report at once; a guest that forged the
		// report (its markers never come) loses the session, not the daemon a slot.
		streams := make(chan struct{})
		go func() { wg.Wait(); close(streams) }()
		select {
		case <-streams:
		case <-time.After(interruptGrace):
			ss.lose("the interpreter's output did not end with its report")
			ss.p.kill()
		}
	}
	wg.Wait()
	if rolledBack && ss.lost == "" {
		// A stream whose cell's end marker came (the interpreter was ended as the
		// cell ended) holds its checkpoint's marker still: read past it.
		if !ss.pastRollback(&stdout, ss.p.outR) || !ss.pastRollback(&stderr, ss.p.errR) {
			ss.lose("the checkpoint's output did not end with its marker")
			ss.p.kill()
		}
	}
	if ss.native && ss.lost == "" {
		ss.idle()
	}
	enf := ss.opened
	res.Enforcement = &enf
	res.StdoutPieces, res.StdoutTruncated = stdout.out, stdout.truncated
	res.StderrPieces, res.StderrTruncated = stderr.out, stderr.truncated
	res.ElapsedMS = float64(time.Since(began).Microseconds()) / 1000
	if got.err == nil {
		var diags []string
		res.Displays, diags = checkDisplays(ss.ws, got.rep.Displays)
		res.Diagnostics = append(res.Diagnostics, diags...)
	}
	c := Cell{Result: res, RolledBack: rolledBack}
	if stdout.value != nil && stdout.value.closed && res.Reason == protocol.Exited && !rolledBack {
		c.Value, c.ValueTruncated = string(stdout.value.buf), stdout.value.truncated
	}
	return c, nil
}

// cellLimits are a cell's wall clock, CPU time (a native cell's: a wasm worker keeps
// its own) and cancel: why gives the reason the first of them ends the cell, once;
// nil until they are started (a native cell's from its frame, startLimits; a wasm
// cell's from its ack).
type cellLimits struct {
	// clock is the cell's wall clock, held until start calls startClock.
	clock      *deadline
	startClock func()
	why        <-chan protocol.Reason
	// sessionOver says the CPU limit is the session's CPU time in all
	// (sessionCPU), not the cell's cpu_ms.
	sessionOver bool
	stopped     chan struct{}
}

// start starts the cell's limits: its wall clock, ctx, and a CPU watch that cpu
// starts (nil: none), ended with them.
func (lim *cellLimits) start(ctx context.Context, cpu func(stop <-chan struct{}) <-chan struct{}) {
	why, stopped := make(chan protocol.Reason, 1), make(chan struct{})
	lim.why, lim.stopped = why, stopped
	var over <-chan struct{}
	if cpu != nil {
		over = cpu(stopped)
	}
	lim.startClock()
	go func() {
		select {
		case <-lim.clock.C:
			why <- protocol.Timeout
		case <-over:
			why <- protocol.CPULimit
		case <-ctx.Done():
			r, _ := stopCause(ctx)
			why <- r
		case <-stopped:
		}
	}()
}

// stop ends what start started (the CPU watch with it).
func (lim *cellLimits) stop() {
	if lim.stopped != nil {
		close(lim.stopped)
		lim.stopped = nil
	}
}

// startLimits starts a native cell's limits (l's wall clock and cpu_ms). With
// checkpoints it keeps the session's CPU backstop too: RLIMIT_CPU counts one
// process, and an interpreter a checkpoint replaced starts at zero, so the daemon
// counts the session's processes under pid 1 (those ended included) against
// sessionCPU. A session past it, or whose interpreter ended between cells, is lost
// (an error wrapping ErrSessionLost); ss.mu is held.
func (ss *Session) startLimits(lim *cellLimits, ctx context.Context, l protocol.Limits) error {
	budget := time.Duration(l.CPUMS) * time.Millisecond
	read := processCPU // the interpreter is the worker
	if ss.forks != nil {
		read = treeCPU
		used, err := treeCPU(ss.p.cmd.Process.Pid)
		switch {
		case ss.closing.Load():
			ss.lose("the session was closed")
		case ss.forks.gone():
			ss.lose("the interpreter ended between cells (a thread an earlier cell left ended it)")
		case err != nil:
			ss.lose("the session's processes cannot be read (its worker has ended)")
		case used >= sessionCPU:
			ss.lose(fmt.Sprintf("the session used its CPU time in all (%s, a backstop beside each cell's limits)", sessionCPU))
		}
		if ss.lost != "" {
			ss.p.kill()
			return fmt.Errorf("%w: %s", ErrSessionLost, ss.lost)
		}
		if left := sessionCPU - used; budget <= 0 || left < budget {
			budget, lim.sessionOver = left, true
		}
	}
	var cpu func(stop <-chan struct{}) <-chan struct{}
	if budget > 0 {
		cpu = func(stop <-chan struct{}) <-chan struct{} { return watchCPU(ss.p, budget, stop, read) }
	}
	lim.start(ctx, cpu)
	return nil
}

// rollback ends the interpreter of a cell that did not end by itself (or finds it
// ended) and continues the cell's checkpoint, which carries on from the state
// before the cell, and says so (a report with RolledBack). ch brings the
// interpreter's frames: any it sent before it ended (its report, if the cell ended
// as it was stopped) are passed over. Within interruptGrace, or the session's
// worker is killed and the result is an error.
func (ss *Session) rollback(ch <-chan received) received {
	// The tools channel is brought back in step before the checkpoint carries
	// on: the ended interpreter may have left a call or an answer half sent.
	old, err := ss.forks.resume(func() {
		if ss.endCalls != nil {
			ss.endCalls() // a call the ended interpreter waited in
		}
		if ss.toolServer != nil {
			ss.toolServer.Reset()
		}
	})
	if err != nil {
		ss.p.kill()
		<-ch
		return received{err: fmt.Errorf("cannot roll back: %w", err)}
	}
	grace := time.NewTimer(interruptGrace)
	defer grace.Stop()
	for {
		select {
		case g := <-ch:
			if g.err != nil {
				return g
			}
			if !g.rep.RolledBack {
				ch = ss.next() // the ended interpreter's
				continue
			}
			if err := ss.forks.adopt(old); err != nil {
				ss.p.kill()
				return received{err: err}
			}
			return g
		case <-grace.C:
			ss.p.kill()
			<-ch
			return received{err: fmt.Errorf("the cell's checkpoint did not carry on within %s", interruptGrace)}
		}
	}
}

// rollbackMarker is what a checkpoint writes on both streams when it carries on (the
// cell's end marker with its last byte inverted: see the runner's
// _sandcell_session), after everything the ended interpreter wrote.
func rollbackMarker(end []byte) []byte {
	m := slices.Clone(end)
	m[len(m)-1] ^= 0xFF
	return m
}

// pastRollback reads r (c's stream) past c's rollback marker when c stopped at the
// cell's end marker instead, so that the next cell's output begins after it; false
// when it does not come within interruptGrace.
func (ss *Session) pastRollback(c *cellStream, r *os.File) bool {
	if c.sawAlt {
		return true
	}
	done := make(chan bool, 1)
	go func() {
		seen := c.after
		buf := make([]byte, 4096)
		for !bytes.Contains(seen, c.alt) {
			n, err := r.Read(buf)
			if err != nil {
				done <- false
				return
			}
			// Only what may still hold the marker is kept.
			seen = append(seen[max(0, len(seen)-len(c.alt)):], buf[:n]...)
		}
		done <- true
	}()
	select {
	case ok := <-done:
		return ok
	case <-time.After(interruptGrace):
		return false
	}
}

// lose records why the session's state is gone; ss.mu is held.
func (ss *Session) lose(why string) {
	if ss.lost == "" {
		ss.lost = why
	}
}

// exitedByCPU reports whether the worker has ended by its RLIMIT_CPU backstop.
func (ss *Session) exitedByCPU() bool {
	select {
	case <-ss.p.exited:
	case <-time.After(time.Second):
		return false
	}
	return cpuBackstop(ss.p.cmd.ProcessState, uint64(SessionCPU/time.Second))
}

// Close ends the session: its worker is killed at once (a running cell with it: its
// Run reports the session lost) and its state is gone.
func (ss *Session) Close() error {
	ss.closing.Store(true) // (before the kill: a running cell says why it ended)
	ss.p.kill()
	ss.mu.Lock()
	ss.lose("the session was closed")
	ss.mu.Unlock()
	ss.p.ctl.Close()
	<-ss.p.exited
	ss.p.outR.Close()
	ss.p.errR.Close()
	ss.p.tools.Close()
	if ss.ws != nil {
		ss.ws.Close()
	}
	if ss.listener != nil {
		ss.listener.Close()
	}
	if ss.forks != nil {
		ss.forks.close()
	}
	return nil
}

// cellStream reads one cell's output from a stream that outlives it, up to the
// cell's end marker, into pieces (protocol.Output: held once, never moved); on
// stdout, it takes the cell's value out (see valueMarks).
type cellStream struct {
	out       *protocol.Output
	truncated bool
	value     *cellValue // nil: no value is looked for
	name      string     // the stream's, for observe
	observe   Observer   // given what is kept, as it is; nil: nothing
	// alt is a second end marker (a native checkpoint's: rollbackMarker), or nil;
	// sawAlt says the stream has had it; after holds what followed the marker the
	// read stopped at, in its last read.
	alt    []byte
	sawAlt bool
	after  []byte
}

// cellValue is a cell's value as it comes on stdout, between its marks.
type cellValue struct {
	begin, end []byte
	buf        []byte
	truncated  bool
	in, closed bool // between the marks; past the end mark
}

// valueMarks are the marks the bootstrap frames a cell's value with on stdout, for
// the cell's mark (see bundle/bootstrap.py).
func valueMarks(mark string) *cellValue {
	return &cellValue{begin: []byte("\x00\x1bsandcell-value " + mark + "\x00"), end: []byte("\x00\x1bsandcell-end " + mark + "\x00")}
}

// read copies r into c.out until end has been read (not kept) or r ends, keeping
// at most limit bytes (then marking the stream truncated and discarding the rest of
// the cell's output); a value between c.value's marks goes to c.value, within limit
// bytes of its own. Markers may arrive split across reads.
func (c *cellStream) read(r *os.File, end []byte, limit int64) {
	longest := len(end)
	if c.value != nil {
		longest = max(longest, len(c.value.begin), len(c.value.end))
	}
	var tail []byte // the last bytes seen, which may begin a marker
	chunk := make([]byte, 32<<10)
	buf := make([]byte, 0, len(chunk)+longest) // tail and a chunk, reused: each byte is kept by copying it into c.out
	for {
		n, err := r.Read(chunk)
		if n > 0 {
			data := append(append(buf[:0], tail...), chunk[:n]...)
			for {
				sink := c.keep
				next := -1 // where the next marker of this state begins
				var marker []byte
				if c.value != nil && c.value.in {
					sink = c.value.keep
					next, marker = bytes.Index(data, c.value.end), c.value.end
				} else if c.value != nil && !c.value.closed {
					next, marker = bytes.Index(data, c.value.begin), c.value.begin
				}
				stop, mark := bytes.Index(data, end), end
				if c.alt != nil {
					if i := bytes.Index(data, c.alt); i >= 0 && (stop < 0 || i < stop) {
						stop, mark = i, c.alt
					}
				}
				if stop >= 0 && (next < 0 || stop < next) {
					sink(data[:stop], limit)
					c.after = slices.Clone(data[stop+len(mark):])
					c.sawAlt = c.alt != nil && (bytes.Equal(mark, c.alt) || bytes.Contains(c.after, c.alt))
					return
				}
				if next < 0 {
					// Held back: only what may begin a marker (so output streams as it
					// comes, a line at a time included).
					cut := len(data) - heldBack(data, longest-1, end, c.value)
					sink(data[:cut], limit)
					tail = append(tail[:0], data[cut:]...) // tail's own array, never buf's
					break
				}
				sink(data[:next], limit)
				data = data[next+len(marker):]
				if c.value.in {
					c.value.in, c.value.closed = false, true
				} else {
					c.value.in = true
				}
			}
		}
		if err != nil {
			if err != io.EOF || len(tail) > 0 {
				c.keep(tail, limit)
			}
			return
		}
	}
}

// heldBack is how many of data's last bytes (at most n) may begin end or one of
// v's marks: the longest such suffix.
func heldBack(data []byte, n int, end []byte, v *cellValue) int {
	for k := min(n, len(data)); k > 0; k-- {
		suffix := data[len(data)-k:]
		if bytes.HasPrefix(end, suffix) || v != nil && (bytes.HasPrefix(v.begin, suffix) || bytes.HasPrefix(v.end, suffix)) {
			return k
		}
	}
	return 0
}

// keep appends b within limit bytes in all, giving observe each part as it is
// held (a slice of the piece it went into).
func (c *cellStream) keep(b []byte, limit int64) {
	if room := limit - int64(c.out.Len()); int64(len(b)) > room {
		b = b[:max(room, 0)]
		c.truncated = true
	}
	for len(b) > 0 {
		i, off, n := c.out.Extend(b)
		if c.observe != nil {
			c.observe(c.name, c.out.Piece(i)[off:off+n:off+n])
		}
		b = b[n:]
	}
}

// keep appends b to the value within limit bytes in all.
func (v *cellValue) keep(b []byte, limit int64) {
	v.buf, v.truncated = capped(v.buf, b, limit, v.truncated)
}

// capped appends b to buf, at most limit bytes in all; truncated is set once
// something was left out.
func capped(buf, b []byte, limit int64, truncated bool) ([]byte, bool) {
	if room := limit - int64(len(buf)); int64(len(b)) > room {
		b = b[:max(room, 0)]
		truncated = true
	}
	return append(buf, b...), truncated
}
