package worker

import (
	"fmt"
	"os"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/sandcell/sandcell/sandbox/engine"
	"github.com/sandcell/sandcell/sandbox/protocol"
)

// session serves a session (StepSession): hardened exactly as a cold run, it
// instantiates the snapshot once, checkpoints it (see engine.Checkpoint), reports
// (Reason Exited, with the contract), then runs each StepCell on that instance and
// reports it, after writing the cell's CellEnd to the guest's stdout and stderr. A
// cell that ends by itself (an exception included) is checkpointed after its
// report; one that does
// not (a trap, its CPU limit, an uncaught MemoryError, or a StepInterrupt from the
// parent: its wall clock, a cancel, the quota) is undone: the instance is restored
// to the last checkpoint and the report says RolledBack. It ends when the control
// fd ends, or when a restore fails (that report does not say RolledBack). A panic or
// a failure before the session opens becomes an internal_error report, as for a run.
func session(r *reply, req *protocol.Request) {
	var rep protocol.Report
	defer func() {
		recoverReport(&rep)
		if rep.Reason != "" {
			r.send(rep)
		}
	}()
	if msg := check(req); msg != "" {
		rep = failed(msg)
		return
	}
	st := prepare(req, false)
	eng, mod, failure := load(req)
	if failure != "" {
		rep = failed(failure)
		return
	}
	defer mod.Close()
	// fd 0 is a pipe this process writes each cell's program into.
	pr, pw, err := os.Pipe()
	if err == nil {
		err = unix.Dup3(int(pr.Fd()), 0, 0)
		pr.Close()
	}
	if err != nil {
		rep = failed("cannot prepare stdin")
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
	inst, out := eng.Instantiate(mod, guestSpec(req, env))
	if inst == nil {
		rep = report(out)
		return
	}
	defer inst.Close()
	var cp engine.Checkpoint
	if err := inst.Checkpoint(&cp); err != nil {
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
	cells := make(chan *protocol.Request)
	go func() {
		defer close(cells)
		for {
			f, err := protocol.Receive(r.ctl, protocol.StepCell, protocol.StepInterrupt)
			if err != nil {
				return
			}
			if f.Step == protocol.StepInterrupt {
				reason := f.Interrupt
				interrupted.Store(&reason)
				eng.Interrupt()
				continue
			}
			cells <- f.Request
		}
	}()
	for c := range cells {
		prog, err := CellProgram(c)
		if err != nil {
			rep = failed(err.Error())
			return
		}
		interrupted.Store(nil)
		go pw.Write(prog) // the guest reads it as the cell starts (a pipe holds 64 KiB)
		out := inst.Call(msDuration(c.Limits.CPUMS))
		if out.Reason == protocol.Exited && !out.ProcExit && out.ExitCode == channelBroken {
			// The bootstrap cannot read its programs (the guest closed its stdin):
			// no later cell can run in this instance, and a checkpoint does not hold
			// WASI's descriptors.
			rep = failed("the session's interpreter can no longer read its cells (its standard input was closed)")
			return
		}
		crep := report(out)
		if why := interrupted.Load(); why != nil && crep.Reason == protocol.CPULimit {
			crep.Reason, crep.Diagnostics = *why, nil
		}
		crep.Enforcement = &enf
		if crep.Reason != protocol.Exited || out.ProcExit {
			// It did not end by itself, or ended the interpreter (os._exit) in the
			// middle of its call: back to the state before the cell.
			if err = inst.Restore(&cp); err == nil {
				crep.RolledBack = true
			}
		}
		if err != nil {
			// The session ends with this report: it must not say the state was kept.
			crep.Reason, crep.ExitCode, crep.RolledBack = protocol.InternalError, -1, false
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

// channelBroken is the status the bootstrap returns when it cannot read a cell's
// program (see bundle/bootstrap.py): 0x1FF, which no program's status (0-255, plus
// 0x100 only for an uncaught MemoryError with status 1) can be.
const channelBroken = 0x1FF

// CellProgram is what the bootstrap reads for a session's cell (see
// bundle/bootstrap.py, MODE "cell"): the header, then ten digits and the cell's
// stdin.
func CellProgram(c *protocol.Request) ([]byte, error) {
	name := c.Filename
	if name == "" {
		name = "<cell>"
	}
	prog, err := header(append([]string{"cell", c.Code, name, "0"}, envFields(c.Env)...))
	if err != nil {
		return nil, err
	}
	prog = fmt.Appendf(prog, "%010d", len(c.Stdin))
	return append(prog, c.Stdin...), nil
}

// guestSpec is the engine's Spec for req's guest in env: the workspace (or the
// worker's root holding it) and the library preopened, req's limits.
func guestSpec(req *protocol.Request, env *Env) engine.Spec {
	preopens := []engine.Preopen{{Host: env.Workspace, Guest: GuestWorkdir}}
	if env.GuestRoot != "" {
		preopens = []engine.Preopen{{Host: env.GuestRoot, Guest: "/"}}
	}
	return engine.Spec{
		Preopens:     append(preopens, engine.Preopen{Host: env.Library, Guest: protocol.GuestLibDir, ReadOnly: true}),
		MemoryBytes:  req.Limits.MemoryBytes,
		CPU:          msDuration(req.Limits.CPUMS),
		Fuel:         req.Limits.Fuel,
		InheritStdin: true,
	}
}
