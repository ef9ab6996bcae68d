package worker

import (
	"encoding/json"
	"os"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/sandcell/sandcell/sandbox/protocol"
)

// toolsChannel is this worker's end of the tools channel (protocol.ToolsFD), opened
// once; nil when the parent passed none.
var toolsChannel = sync.OnceValue(func() *os.File {
	var st unix.Stat_t
	if unix.Fstat(protocol.ToolsFD, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return nil // not the parent's socket (a worker started without one)
	}
	return os.NewFile(protocol.ToolsFD, "tools")
})

// The channel's answers, read by one goroutine (started with the first call), so
// that a call can stop waiting for its answer (interruptCall) and the next call
// still reads in step: each call has a number, and an answer of another (the late
// answer of a call that stopped waiting) is passed over.
var (
	answers     = make(chan protocol.ToolFrame, 1)
	startReader sync.Once
	// interrupts is signalled when the session's cell is interrupted (its engine
	// epoch already set): a call under way returns at once.
	interrupts = make(chan struct{}, 1)
	lastID     int64
)

// interruptCall makes a call under way (or the next one of this cell) return at
// once, as failed: the guest then meets the engine's interrupt. Only a session's
// interrupt calls it.
func interruptCall() {
	select {
	case interrupts <- struct{}{}:
	default:
	}
}

// callTool is the wasm guest's engine.ToolCaller: it carries the guest's request (a
// ToolCall's JSON) to the parent as a StepToolCall and returns the StepToolAnswer's
// answer as JSON. A request that is not a ToolCall is answered here, as a ToolError;
// a channel that fails (the parent went away) answers ok false, which the guest
// raises as an error. Calls come one at a time (the guest's only thread waits).
func callTool(request []byte) ([]byte, bool) {
	ch := toolsChannel()
	if ch == nil {
		return nil, false
	}
	var call protocol.ToolCall
	if err := json.Unmarshal(request, &call); err != nil {
		return failedCall("the call is not a tool call: " + err.Error()), true
	}
	startReader.Do(func() {
		go func() {
			defer close(answers)
			for {
				f, err := protocol.ReadToolFrame(ch, protocol.MaxToolFrame, protocol.StepToolAnswer)
				if err != nil {
					return
				}
				answers <- f
			}
		}()
	})
	select { // an interrupt of an earlier cell's, already met
	case <-interrupts:
	default:
	}
	lastID++
	call.ID = lastID
	if err := protocol.WriteToolFrame(ch, protocol.ToolFrame{Step: protocol.StepToolCall, Call: &call}); err != nil {
		return failedCall("the call could not be sent: " + err.Error()), true
	}
	for {
		select {
		case f, ok := <-answers:
			if !ok {
				return nil, false
			}
			if f.Answer.ID != call.ID && f.Answer.ID != 0 {
				continue // an answer to a call that stopped waiting
			}
			answer, err := json.Marshal(f.Answer)
			if err != nil {
				return failedCall("the answer could not be read: " + err.Error()), true
			}
			return answer, true
		case <-interrupts:
			return failedCall("the cell was stopped during the call"), true
		}
	}
}

// failedCall is a ToolAnswer of class ToolError saying msg.
func failedCall(msg string) []byte {
	b, _ := json.Marshal(protocol.ToolAnswer{Error: &protocol.ToolError{Class: protocol.ToolErrorFailed, Message: msg}})
	return b
}
