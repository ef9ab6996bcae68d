package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sandcell/sandcell/sandbox/protocol"
)

// Tools answers the tool calls of one run or one session cell (see protocol's tools
// channel): the daemon's tool broker gives each run its own, which knows who runs
// it. A run without one answers every call ToolDenied and lists no tools.
type Tools interface {
	// Call answers call (a list, or one call). It is called once per call, one at a
	// time, on the run's behalf; ctx ends when the run does. While the call waits
	// for a person, it holds clock (see Clock).
	Call(ctx context.Context, call protocol.ToolCall, clock Clock) protocol.ToolAnswer
}

// Clock is a run's (or a cell's) wall clock as a tool call sees it. Hold stops it
// while the call waits for a person: the time limit does not run then; the returned
// function starts it again (once). The caller bounds how long it holds it.
type Clock interface {
	Hold() (release func())
}

type toolsKey struct{}

// WithTools returns ctx carrying t: the runs and cells started with it have their
// tool calls answered by t.
func WithTools(ctx context.Context, t Tools) context.Context {
	return context.WithValue(ctx, toolsKey{}, t)
}

// toolsOf is the Tools ctx carries, or nil.
func toolsOf(ctx context.Context) Tools {
	t, _ := ctx.Value(toolsKey{}).(Tools)
	return t
}

// noTools answers for a run without Tools.
type noTools struct{}

func (noTools) Call(_ context.Context, c protocol.ToolCall, _ Clock) protocol.ToolAnswer {
	if c.List {
		return protocol.ToolAnswer{Tools: []protocol.ToolSpec{}}
	}
	return protocol.ToolAnswer{Error: &protocol.ToolError{Class: protocol.ToolErrorDenied,
		Message: "no tools are offered to this run"}}
}

// toolsPair is a worker's tools channel: the parent's end and the child's, which
// launch passes as protocol.ToolsFD.
func toolsPair() (parent, child *os.File, err error) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("socketpair: %w", err)
	}
	// The parent's end is non-blocking, so the runtime's poller serves it: a read
	// or write under way can be woken (toolServer.Reset), and none holds a thread.
	if err := syscall.SetNonblock(fds[0], true); err != nil {
		syscall.Close(fds[0])
		syscall.Close(fds[1])
		return nil, nil, fmt.Errorf("socketpair: %w", err)
	}
	return os.NewFile(uintptr(fds[0]), "tools"), os.NewFile(uintptr(fds[1]), "tools-child"), nil
}

// toolScope is who answers a channel's calls now: a run's Tools for the run, a
// session's current cell's for the cell (nil between cells).
type toolScope struct {
	ctx   context.Context // ends when the run or cell does
	tools Tools           // nil: noTools
	clock Clock
}

// CallBound is what a Tools may implement to bound the frames its guest sends: the
// most bytes a call it can answer needs (its largest allowed arguments, say). A
// frame past it is read past, never held, and answered ToolLimit. Without it the
// bound is protocol.MaxToolFrame; without Tools, noCallBytes.
type CallBound interface {
	MaxCallBytes() int
}

// noCallBytes bounds a call's frame where no tools are offered (a list, a refusal).
const noCallBytes = 64 << 10

// callEnvelope is what a call's frame holds besides its arguments.
const callEnvelope = 4 << 10

// bound is the most bytes a call's frame in scope sc may have.
func (sc *toolScope) bound() int {
	if sc == nil || sc.tools == nil {
		return noCallBytes
	}
	if b, ok := sc.tools.(CallBound); ok {
		return min(b.MaxCallBytes()+callEnvelope, protocol.MaxToolFrame)
	}
	return protocol.MaxToolFrame
}

// toolServer answers the calls on one worker's tools channel, one at a time, with
// scope()'s Tools, until the channel ends. A frame past the scope's bound is read
// past and answered ToolLimit; one that is not a call, ToolError; an answer that
// cannot be sent whole (too large, not JSON) is replaced by a failure, and a Tools
// that panics answers ToolError: the daemon goes on. The guest's frames are not
// trusted: on the native backend its own process writes them. Each answer carries
// its call's ID, so that a guest whose earlier call was ended with its cell (a
// session's rolled back cell) can tell that call's late answer from its own.
type toolServer struct {
	conn  *os.File
	scope func() *toolScope
	// resetting is set while reset runs: an error on the channel is then its
	// doing, not the channel's end.
	resetting atomic.Bool
	reset     chan chan struct{}
}

func newToolServer(conn *os.File, scope func() *toolScope) *toolServer {
	return &toolServer{conn: conn, scope: scope, reset: make(chan chan struct{}, 1)}
}

// serve runs the loop (see toolServer) until the channel ends.
func (ts *toolServer) serve() {
	for {
		f, err := protocol.ReadToolFrameBound(ts.conn, func() int { return ts.scope().bound() }, protocol.StepToolCall)
		var answer protocol.ToolAnswer
		switch {
		case err != nil && ts.resetting.Load():
			ts.settle()
			continue
		case errors.Is(err, protocol.ErrFrameTooLarge):
			answer = toolFailure(protocol.ToolErrorLimit, "the call is larger than this run's calls may be: "+err.Error())
		case errors.Is(err, protocol.ErrStep), errors.Is(err, protocol.ErrVersion):
			answer = toolFailure(protocol.ToolErrorFailed, "not a tool call: "+err.Error())
		case err != nil:
			return // the channel ended (the worker did)
		default:
			answer = ts.answer(ts.scope(), *f.Call)
			answer.ID = f.Call.ID
		}
		err = protocol.WriteToolFrame(ts.conn, protocol.ToolFrame{Step: protocol.StepToolAnswer, Answer: &answer})
		if errors.Is(err, protocol.ErrFrameTooLarge) || errors.Is(err, protocol.ErrEncode) {
			why := fmt.Sprintf("the answer is larger than a call may carry (%d bytes)", protocol.MaxToolFrame)
			class := protocol.ToolErrorLimit
			if errors.Is(err, protocol.ErrEncode) {
				why, class = "the tool's answer could not be sent (it is not JSON)", protocol.ToolErrorFailed
			}
			id := answer.ID
			answer = toolFailure(class, why)
			answer.ID = id
			err = protocol.WriteToolFrame(ts.conn, protocol.ToolFrame{Step: protocol.StepToolAnswer, Answer: &answer})
		}
		switch {
		case err != nil && ts.resetting.Load():
			ts.settle()
		case err != nil:
			return
		}
	}
}

// answer is sc's answer to call; a panic in its Tools is a ToolError.
func (ts *toolServer) answer(sc *toolScope, call protocol.ToolCall) (answer protocol.ToolAnswer) {
	defer func() {
		if r := recover(); r != nil {
			answer = toolFailure(protocol.ToolErrorFailed, "the call failed in the daemon")
		}
	}()
	switch {
	case sc == nil:
		return toolFailure(protocol.ToolErrorFailed, "no cell is running: tools are called from a run or a cell")
	case sc.tools == nil:
		return noTools{}.Call(sc.ctx, call, sc.clock)
	case sc.ctx.Err() != nil:
		return toolFailure(protocol.ToolErrorFailed, "the run or cell has ended")
	}
	return sc.tools.Call(sc.ctx, call, sc.clock)
}

// resetWait bounds Reset: how long the loop may take to come to rest (an answer
// being written, a call being ended).
const resetWait = 2 * time.Second

// Reset brings the channel back to a frame's start on the parent's side: what the
// guest sent and the loop has not read (a frame cut short when its process was
// killed) is read and discarded, and an answer being written is given up. A native
// session calls it before it continues a cell's checkpoint, whose runner then
// discards what it finds unread on its side (an answer cut short); the channel is
// then in step again. It returns false when the loop did not come to rest in time.
func (ts *toolServer) Reset() bool {
	done := make(chan struct{})
	ts.resetting.Store(true)
	ts.reset <- done
	ts.conn.SetDeadline(time.Now()) // wakes a read or a write under way
	select {
	case <-done:
		return true
	case <-time.After(resetWait):
		return false
	}
}

// settle is the loop's side of Reset: it reads and discards what is there, then
// clears the deadline and says so.
func (ts *toolServer) settle() {
	buf := make([]byte, 64<<10)
	for {
		ts.conn.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
		if _, err := ts.conn.Read(buf); err != nil {
			break
		}
	}
	ts.conn.SetDeadline(time.Time{})
	ts.resetting.Store(false)
	select {
	case done := <-ts.reset:
		close(done)
	default:
	}
}

func toolFailure(class, msg string) protocol.ToolAnswer {
	return protocol.ToolAnswer{Error: &protocol.ToolError{Class: class, Message: msg}}
}

// deadline is a run's wall-clock limit that tool calls may hold (Clock): it fires
// (closes C) once it has run for its whole length, not counting the time held.
type deadline struct {
	C chan struct{}

	mu      sync.Mutex
	left    time.Duration // what remains, as of since
	since   time.Time     // when it last started running
	holds   int
	timer   *time.Timer
	expired bool
	stopped bool // for good (Stop)
}

// newDeadline starts a deadline of d.
func newDeadline(d time.Duration) *deadline {
	dl := &deadline{C: make(chan struct{}), left: d, since: time.Now()}
	dl.timer = time.AfterFunc(d, dl.fire)
	return dl
}

func (dl *deadline) fire() {
	dl.mu.Lock()
	defer dl.mu.Unlock()
	if dl.holds == 0 && !dl.expired {
		dl.expired = true
		close(dl.C)
	}
}

// Hold stops the deadline until the returned function is called.
func (dl *deadline) Hold() func() {
	dl.mu.Lock()
	defer dl.mu.Unlock()
	if dl.holds == 0 && !dl.expired {
		dl.timer.Stop()
		dl.left -= time.Since(dl.since)
	}
	dl.holds++
	var once sync.Once
	return func() {
		once.Do(func() {
			dl.mu.Lock()
			defer dl.mu.Unlock()
			dl.holds--
			if dl.holds == 0 && !dl.expired && !dl.stopped {
				dl.since = time.Now()
				dl.timer = time.AfterFunc(max(dl.left, 0), dl.fire)
			}
		})
	}
}

// heldDeadline is a deadline of d that does not run until start is called.
func heldDeadline(d time.Duration) (dl *deadline, start func()) {
	dl = newDeadline(d)
	return dl, dl.Hold()
}

// Stop stops the deadline for good.
func (dl *deadline) Stop() {
	dl.mu.Lock()
	defer dl.mu.Unlock()
	dl.stopped = true
	dl.timer.Stop()
}

// serveTools answers p's tool calls, for a run, with the Tools ctx carries (see
// WithTools) until p's channel ends, which it does when the worker exits (or the
// run's end closes it).
func (p *proc) serveTools(ctx context.Context, clock Clock) {
	if p.tools == nil {
		return
	}
	sc := &toolScope{ctx: ctx, tools: toolsOf(ctx), clock: clock}
	go newToolServer(p.tools, func() *toolScope { return sc }).serve()
}

// serveTools answers the session's tool calls for its whole life, each with the
// Tools of the cell it comes in (see WithTools: the cell's context), until the
// worker ends.
func (ss *Session) serveTools() {
	if ss.p.tools == nil {
		return
	}
	ss.toolServer = newToolServer(ss.p.tools, ss.calls.Load)
	go ss.toolServer.serve()
}
