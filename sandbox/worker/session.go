package worker

import (
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandcell/sandcell/sandbox/engine"
	"github.com/sandcell/sandcell/sandbox/protocol"
)

// session serves a session (StepSession): hardened exactly as a cold run, it
// instantiates the snapshot once, checkpoints it (see engine.Checkpoint) or, for a
// Request that says Resume, restores the StepCheckpoint that follows, reports
// (Reason Exited, with the contract), then runs each StepCell on that instance and
// reports it, after writing the cell's CellEnd to the guest's stdout and stderr.
// Each cell's program is written whole into the interpreter's stdin before the cell
// starts, and the cell starts (StepAck) armed, so an interrupt is never lost. A cell
// that ends by itself (an exception included) is checkpointed after its report; one
// that does not (a trap, its CPU limit, an uncaught MemoryError, os._exit, or a
// StepInterrupt from the parent: its wall clock, a cancel, the quota) is undone: the
// instance is restored to the last checkpoint, the channel is proven in step
// (resync), and the report says RolledBack. Between cells a StepSave is answered
// with the last checkpoint (sendCheckpoint). It ends when the control fd ends, or
// when a restore or its proof fails (that report does not say RolledBack). A panic or
// a failure before the session opens becomes an internal_error report, as for a run.
func session(r *reply, req *protocol.Request) {
	var rep protocol.Report
	defer func() {
		recoverReport(&rep)
		if rep.Reason != "" {
			r.send(rep)
		}
	}()
	st, eng, mod, failure := setUp(req, true)
	if failure != "" {
		rep = failed(failure)
		return
	}
	defer mod.Close()
	// fd 0 is a pipe this process writes each cell's program into, whole, before
	// the cell starts: it holds MaxCellProgram bytes.
	pr, pw, err := os.Pipe()
	if err == nil {
		err = unix.Dup3(int(pr.Fd()), 0, 0)
		pr.Close()
	}
	if err == nil {
		_, err = unix.FcntlInt(pw.Fd(), unix.F_SETPIPE_SZ, protocol.MaxCellProgram)
	}
	if err != nil {
		rep = failed("cannot prepare stdin: " + err.Error())
		return
	}
	defer pw.Close()
	narrow(req, st)
	var ok bool
	if rep, ok = contract(req, st); !ok {
		return
	}
	r.st = st
	env := st.env(eng, mod, r)
	spec := guestSpec(req, env)
	inst, out := eng.Instantiate(mod, spec)
	if inst == nil {
		rep = report(out)
		return
	}
	defer func() { inst.Close() }()
	var cp engine.Checkpoint
	restored := false // the instance was restored since the last cell
	// The state is another session's, forked: its random sources are reseeded at
	// the next cell, until one keeps its state (see protocol.Request.Fork).
	forked := req.Resume && req.Fork
	if req.Resume {
		// The session's state, saved by another worker: restored over the snapshot's.
		err := receiveCheckpoint(r.ctl, req.Limits.MemoryBytes, &cp)
		if err == nil {
			err = inst.Restore(&cp)
		}
		if err != nil {
			rep = failed("cannot resume the session: " + err.Error())
			return
		}
		restored = true
	} else if err := inst.Checkpoint(&cp); err != nil {
		rep = failed("cannot checkpoint the interpreter: " + err.Error())
		return
	}
	enf := st.enf
	if protocol.Send(r.ctl, protocol.Frame{Step: protocol.StepReport,
		Report: &protocol.Report{Reason: protocol.Exited, Enforcement: &enf}}) != nil {
		r.ok = true // the parent is gone: nothing to report to
		return
	}
	// The control fd is read while a cell runs: an interrupt ends it at once.
	var interrupted atomic.Pointer[protocol.Reason]
	frames := make(chan protocol.Frame)
	go func() {
		defer close(frames)
		for {
			f, err := protocol.Receive(r.ctl, protocol.StepCell, protocol.StepInterrupt, protocol.StepSave)
			if err != nil {
				return
			}
			if f.Step == protocol.StepInterrupt {
				reason := f.Interrupt
				interrupted.Store(&reason)
				eng.Interrupt()
				interruptCall() // a call the cell waits in returns, into the interrupt
				continue
			}
			frames <- f
		}
	}()
	for f := range frames {
		if f.Step == protocol.StepSave {
			// Between cells: the state is cp, the last cell's (or the restore's).
			if sendCheckpoint(r.ctl, &cp) != nil {
				r.ok = true // the parent is gone, or stopped reading
				return
			}
			continue
		}
		c := f.Request
		prog, err := CellProgram(c, restored, forked)
		if err == nil && len(prog) > protocol.MaxCellProgram {
			err = fmt.Errorf("the cell's program and stdin are %d bytes, over %d", len(prog), protocol.MaxCellProgram)
		}
		if err == nil {
			err = writeAll(int(pw.Fd()), prog)
		}
		if err != nil {
			rep = failed(err.Error())
			return
		}
		// Armed before the parent hears the cell has started (and starts its
		// clock): an interrupt it sends from then on is never lost.
		interrupted.Store(nil)
		inst.Arm()
		if protocol.Send(r.ctl, protocol.Frame{Step: protocol.StepAck}) != nil {
			r.ok = true
			return
		}
		out := inst.CallArmed(msDuration(c.Limits.CPUMS))
		// Whatever the guest left unread of its program (an interrupt in the
		// middle of reading it) must not become the next cell's.
		drain(0)
		if out.Reason == protocol.Exited && !out.ProcExit && out.ExitCode == channelBroken {
			// The bootstrap cannot read its programs (the guest closed or replaced
			// its stdin): no later cell can run in this instance.
			rep = failed("the session's interpreter can no longer read its cells (its standard input was closed or replaced)")
			return
		}
		crep := report(out)
		env.withDisplays(&crep)
		if why := interrupted.Load(); why != nil && crep.Reason == protocol.CPULimit {
			crep.Reason, crep.Diagnostics = *why, nil
		}
		crep.Enforcement = &enf
		restored = false
		if crep.Reason != protocol.Exited || out.ProcExit {
			// It did not end by itself, or ended the interpreter (os._exit) in the
			// middle of its call: back to the state before the cell, and the
			// channel to the interpreter proven in step (see resync).
			if err = inst.Restore(&cp); err == nil {
				err = resync(inst, &cp, int(pw.Fd()))
			}
			if err == nil {
				restored, crep.RolledBack = true, true
			}
		}
		if !crep.RolledBack {
			forked = false // this cell reseeded them, and its state is kept
		}
		if err != nil {
			// The session ends with this report: it must not say the state was kept
			// (the cell's own reason stays, unless it says the cell simply ended).
			crep.RolledBack = false
			if crep.Reason == protocol.Exited {
				crep.Reason, crep.ExitCode = protocol.InternalError, -1
			}
			crep.Diagnostics = append(crep.Diagnostics, "the session's state cannot be kept: "+err.Error())
		}
		if r.status != nil {
			crep.PeakRSSBytes = peakRSS(r.status)
		}
		unix.Write(1, c.CellEnd)
		unix.Write(2, c.CellEnd)
		if protocol.Send(r.ctl, protocol.Frame{Step: protocol.StepReport, Report: &crep}) != nil || err != nil {
			r.ok = true
			return
		}
		// The checkpoint of a cell that ended by itself is taken after its report
		// (a copy of the whole memory: milliseconds per 10 MB), while the caller
		// reads the answer; the next cell waits for it. Only an instance without a
		// memory export fails here, and the first checkpoint would have.
		if !crep.RolledBack && inst.Checkpoint(&cp) != nil {
			r.ok = true
			return
		}
	}
	r.ok = true // the parent ended the session
}

// resyncs is how many sync cells resync runs: each is passed by chance (a program
// the guest planted that ends with the right status) once in 255.
const resyncs = 3

// resync proves, after a restore, that the interpreter reads its next cell from the
// start of the next program written: an interrupt in the middle of its reading a
// cell's program leaves the rest in the channel (in wasmtime's own stdin buffer, out
// of drain's reach), which would be read as the next cell. It runs resyncs cells of
// its own, each `raise SystemExit(K)` for a K drawn now, restoring cp after each: an
// interpreter that ends with another status read something else first, and the
// session cannot go on (an error).
func resync(inst *engine.Instance, cp *engine.Checkpoint, pw int) error {
	for i := 0; i < resyncs; i++ {
		var b [1]byte
		rand.Read(b[:])
		k := 1 + int(b[0])%254
		prog, err := CellProgram(&protocol.Request{Code: fmt.Sprintf("raise SystemExit(%d)", k), Filename: "<sync>"}, false, false)
		if err != nil {
			return err
		}
		if err := writeAll(pw, prog); err != nil {
			return err
		}
		out := inst.Call(time.Second)
		drain(0)
		if err := inst.Restore(cp); err != nil {
			return err
		}
		if out.Reason != protocol.Exited || out.ProcExit || out.ExitCode != k {
			return errors.New("the interpreter did not read its next cell where it begins (the cell was interrupted while it read its program)")
		}
	}
	return nil
}

// writeAll writes b to the pipe fd, whose buffer has room for it (the cell's
// program is written whole before the cell starts); a full pipe is an error, never
// a wait.
func writeAll(fd int, b []byte) error {
	for len(b) > 0 {
		n, err := unix.Write(fd, b)
		if err != nil {
			return fmt.Errorf("cannot give the cell its program: %w", err)
		}
		b = b[n:]
	}
	return nil
}

// drain discards what fd (a pipe) holds now, without waiting for more.
func drain(fd int) {
	flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
	if err != nil {
		return
	}
	if flags&unix.O_NONBLOCK == 0 {
		unix.FcntlInt(uintptr(fd), unix.F_SETFL, flags|unix.O_NONBLOCK)
		defer unix.FcntlInt(uintptr(fd), unix.F_SETFL, flags)
	}
	buf := make([]byte, 64<<10)
	for {
		if n, err := unix.Read(fd, buf); n <= 0 || err != nil {
			return
		}
	}
}

// channelBroken is the status the bootstrap returns when it cannot read a cell's
// program (see bundle/bootstrap.py): 0x1FF, which no program's status (0-255, plus
// 0x100 only for an uncaught MemoryError with status 1) can be.
const channelBroken = 0x1FF

// CellProgram is what the bootstrap reads for a session's cell (see
// bundle/bootstrap.py, MODE "cell"): the header, then ten digits and the cell's
// stdin. restored says the interpreter was restored since the last cell: the
// bootstrap first closes the file objects and connections it holds, whose
// descriptors the fresh instance does not have. forked says the state is another
// session's (protocol.Request.Fork): the bootstrap also reseeds its random sources.
func CellProgram(c *protocol.Request, restored, forked bool) ([]byte, error) {
	name := c.Filename
	if name == "" {
		name = "<cell>"
	}
	flag := ""
	switch {
	case forked:
		flag = "forked"
	case restored:
		flag = "restored"
	}
	prog, err := protocol.Header(append([]string{"cell", c.Code, name, diskField(), "2", flag, c.ValueMark}, protocol.EnvFields(c.Env)...))
	if err != nil {
		return nil, err
	}
	prog = fmt.Appendf(prog, "%010d", len(c.Stdin))
	return append(prog, c.Stdin...), nil
}

// guestSpec is the engine's Spec for req's guest in env: the workspace (or the
// worker's root holding it), the library and its time zone database preopened, req's
// limits.
func guestSpec(req *protocol.Request, env *Env) engine.Spec {
	preopens := []engine.Preopen{{Host: env.Workspace, Guest: GuestWorkdir}}
	if env.GuestRoot != "" {
		preopens = []engine.Preopen{{Host: env.GuestRoot, Guest: "/"}}
	}
	return engine.Spec{
		Preopens: append(preopens, engine.Preopen{Host: env.Library, Guest: protocol.GuestLibDir, ReadOnly: true},
			engine.Preopen{Host: filepath.Join(env.Library, protocol.LibZoneDir), Guest: protocol.GuestZoneDir, ReadOnly: true}),
		MemoryBytes:  req.Limits.MemoryBytes,
		CPU:          msDuration(req.Limits.CPUMS),
		Fuel:         req.Limits.Fuel,
		InheritStdin: true,
		Tools:        callTool,
	}
}
