package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
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
	return os.NewFile(uintptr(fds[0]), "tools"), os.NewFile(uintptr(fds[1]), "tools-child"), nil
}

// toolScope is who answers a channel's calls now: a run's Tools for the run, a
// session's current cell's for the cell (nil between cells).
type toolScope struct {
	ctx   context.Context // ends when the run or cell does
	tools Tools           // nil: noTools
	clock Clock
}

// serveTools answers the calls on conn, one at a time, with scope()'s Tools, until
// conn ends. A frame past protocol.MaxToolFrame is read past and answered
// ToolLimit; one that is not a call, ToolError; an answer too large to send is
// replaced by a ToolLimit. The guest's frames are not trusted: on the native backend
// its own process writes them. Each answer carries its call's ID, so that a guest
// whose earlier call was ended with its cell (a session's rolled back cell) can tell
// that call's late answer from its own.
func serveTools(conn *os.File, scope func() *toolScope) {
	for {
		f, err := protocol.ReadToolFrame(conn, protocol.MaxToolFrame, protocol.StepToolCall)
		var answer protocol.ToolAnswer
		switch {
		case errors.Is(err, protocol.ErrFrameTooLarge):
			answer = toolFailure(protocol.ToolErrorLimit, "the call is larger than a call may be: "+err.Error())
		case errors.Is(err, protocol.ErrStep), errors.Is(err, protocol.ErrVersion):
			answer = toolFailure(protocol.ToolErrorFailed, "not a tool call: "+err.Error())
		case err != nil:
			return // the channel ended (the worker did)
		default:
			sc := scope()
			switch {
			case sc == nil:
				answer = toolFailure(protocol.ToolErrorFailed, "no cell is running: tools are called from a run or a cell")
			case sc.tools == nil:
				answer = noTools{}.Call(sc.ctx, *f.Call, sc.clock)
			case sc.ctx.Err() != nil:
				answer = toolFailure(protocol.ToolErrorFailed, "the run or cell has ended")
			default:
				answer = sc.tools.Call(sc.ctx, *f.Call, sc.clock)
			}
			answer.ID = f.Call.ID
		}
		err = protocol.WriteToolFrame(conn, protocol.ToolFrame{Step: protocol.StepToolAnswer, Answer: &answer})
		if errors.Is(err, protocol.ErrFrameTooLarge) {
			answer = toolFailure(protocol.ToolErrorLimit, fmt.Sprintf("the answer is larger than a call may carry (%d bytes)", protocol.MaxToolFrame))
			if f.Call != nil {
				answer.ID = f.Call.ID
			}
			err = protocol.WriteToolFrame(conn, protocol.ToolFrame{Step: protocol.StepToolAnswer, Answer: &answer})
		}
		if err != nil {
			return
		}
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
			if dl.holds == 0 && !dl.expired {
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
	go serveTools(p.tools, func() *toolScope { return sc })
}

// serveTools answers the session's tool calls for its whole life, each with the
// Tools of the cell it comes in (see WithTools: the cell's context), until the
// worker ends.
func (ss *Session) serveTools() {
	if ss.p.tools == nil {
		return
	}
	go serveTools(ss.p.tools, ss.calls.Load)
}
