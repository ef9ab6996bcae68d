package worker

import (
	"errors"
	"fmt"
	"os"

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

// warm serves a template: it prepares, says ready, and once claimed narrows the whole
// process to the claim, writes the program to the guest's stdin and runs body. The
// interpreter is a snapshot instantiated for the run (about a millisecond), so
// nothing of the guest exists before its run is known: its clocks, descriptors and
// memory start with the run. It returns false when there is nothing to report: the
// parent dropped the idle worker.
func warm(r *reply, tmpl *protocol.Request, body func(*protocol.Request, *Env) protocol.Report) bool {
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
	c, ok := w.claim()
	if !ok {
		return r.ok
	}
	if err := feedStdin(c, w.stdin); err != nil {
		r.send(failed("cannot prepare stdin: " + err.Error()))
		return true
	}
	r.send(body(c, w.st.env(w.eng, w.mod, r)))
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
	if w.eng, w.mod, failure = load(w.tmpl, false); failure != "" {
		return failure
	}
	w.st.enf.Engine = string(w.eng.Variant())
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
	// The roots, the seccomp filter and the network namespace are the template's (the
	// parent matched the claim to it): the claim carries none of them.
	c.Roots, c.Hardening.Seccomp = w.tmpl.Roots, w.tmpl.Hardening.Seccomp
	c.Hardening.SharedNetwork = w.tmpl.Hardening.SharedNetwork // how it was started
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

// checkClaim returns why a claim cannot run in a worker prepared for tmpl, or "".
func checkClaim(tmpl, c *protocol.Request) string {
	switch {
	case c.Limits.MemoryBytes != tmpl.Limits.MemoryBytes || c.Limits.Fuel != 0 || tmpl.Limits.Fuel != 0:
		return "the claim's memory or fuel differs from the warm worker's"
	case c.ModulePath != tmpl.ModulePath || c.EpochlessModulePath != tmpl.EpochlessModulePath || c.LibDir != tmpl.LibDir:
		return "the claim's interpreter differs from the warm worker's"
	}
	return ""
}
