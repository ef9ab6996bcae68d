package worker

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandcell/sandcell/sandbox/engine"
	"github.com/sandcell/sandcell/sandbox/protocol"
)

// The warm path: a worker prepared from a template before its run is known. Its
// phases are the steps of the exchange (see sandbox/protocol): prepare for the
// template, ready, the claim and its ack, narrow to the claim, run, report.

// warmWorker is a worker between its template and its report.
type warmWorker struct {
	r     *reply
	tmpl  *protocol.Request
	st    *hardened
	eng   *engine.Engine
	mod   *engine.Module
	stdin *os.File // the write end of fd 0, a pipe the claim fills
}

// warm serves a template. For the guest body the interpreter starts on this (the
// main) thread before the claim and blocks reading its program from stdin, while
// the exchange goes on on another thread; the claim narrows the whole process
// (every layer covers every thread) before the program is written. It returns false
// when there is nothing to report: the parent dropped the idle worker.
func warm(r *reply, tmpl *protocol.Request, body func(*protocol.Request, *Env) protocol.Report, guest bool) bool {
	defer func() {
		if p := recover(); p != nil {
			r.send(failed(fmt.Sprintf("worker panic: %v", p)))
		}
	}()
	w := &warmWorker{r: r, tmpl: tmpl}
	if msg := w.prepare(); msg != "" {
		r.send(failed(msg)) // instead of ready
		return r.ok
	}
	if !guest {
		c, ok := w.claim()
		if !ok {
			return r.ok
		}
		if err := feedStdin(c, w.stdin); err != nil {
			r.send(failed("cannot prepare stdin"))
			return true
		}
		r.send(body(c, w.st.env(w.eng, w.mod, r)))
		return true
	}

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
			r.send(failed(err.Error())) // instead of ready
			os.Exit(0)
		}
		c, ok := w.claim()
		if !ok {
			os.Exit(0) // dropped, or refused and reported: nothing ran
		}
		close(claimed)
		// The run starts now: its CPU limit and its monotonic clock count from here.
		clock.Restart()
		arm <- time.Duration(c.Limits.CPUMS) * time.Millisecond
		if err := feedStdin(c, w.stdin); err != nil {
			// The guest would wait for its program until the wall clock: end it now.
			r.send(failed("cannot prepare stdin: " + err.Error()))
			os.Exit(0)
		}
	}()
	spec := guestSpec(tmpl, w.st.env(w.eng, w.mod, r), arm)
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
	out := w.eng.Run(w.mod, spec)
	ended.Store(true)
	<-claimed
	r.send(report(out))
	return true
}

// prepare does what the template allows before the run is known: the checks,
// prepare (namespaces, a root of its own, the capabilities and seccomp filter
// compiled), the module loaded, fd 0 made a pipe. It returns why it cannot, or "".
func (w *warmWorker) prepare() string {
	if msg := check(w.tmpl); msg != "" {
		return msg
	}
	w.st = prepare(w.tmpl, true) // before the engine starts threads (see cold)
	if w.st.guestRoot == "" {
		return "a warm worker needs a root of its own: " + w.st.enf.Errors[protocol.LayerMountNS]
	}
	var failure string
	if w.eng, w.mod, failure = load(w.tmpl); failure != "" {
		return failure
	}
	pr, pw, err := os.Pipe()
	if err == nil {
		err = unix.Dup3(int(pr.Fd()), 0, 0)
		pr.Close()
	}
	if err != nil {
		return "cannot prepare stdin"
	}
	w.stdin = pw
	return ""
}

// claim says ready, waits for the claim and acknowledges it at once (until then, a
// parent that finds this worker gone runs the claim elsewhere), checks it against
// the template and narrows the process to it. It returns false with nothing to
// report when the parent drops the worker, and false after the report when the
// claim cannot run.
func (w *warmWorker) claim() (*protocol.Request, bool) {
	if protocol.Send(w.r.ctl, protocol.Frame{Step: protocol.StepReady}) != nil {
		return nil, false
	}
	f, err := protocol.Receive(w.r.ctl, protocol.StepClaim)
	if errors.Is(err, protocol.ErrVersion) || errors.Is(err, protocol.ErrStep) {
		w.r.send(failed(err.Error()))
		return nil, false
	}
	if err != nil {
		return nil, false // dropped unclaimed: the parent closed its end
	}
	if protocol.Send(w.r.ctl, protocol.Frame{Step: protocol.StepAck}) != nil {
		return nil, false
	}
	c := f.Request
	// The roots and the seccomp filter are the template's (the parent matched the
	// claim to it): the claim carries neither.
	c.Roots, c.Hardening.Seccomp = w.tmpl.Roots, w.tmpl.Hardening.Seccomp
	if msg := checkClaim(w.tmpl, c); msg != "" {
		w.r.send(failed(msg))
		return nil, false
	}
	narrow(c, w.st)
	if rep, ok := contract(c, w.st); !ok {
		w.r.send(rep) // the program never reaches the guest
		return nil, false
	}
	w.r.st = w.st
	return c, true
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
	case c.Limits.MemoryBytes != tmpl.Limits.MemoryBytes || c.Limits.Fuel != 0 || tmpl.Limits.Fuel != 0:
		return "the claim's memory or fuel differs from the warm worker's"
	case c.ModulePath != tmpl.ModulePath || c.LibDir != tmpl.LibDir:
		return "the claim's interpreter differs from the warm worker's"
	}
	return ""
}
