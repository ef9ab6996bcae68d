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
	if err := protocol.WriteToolFrame(ch, protocol.ToolFrame{Step: protocol.StepToolCall, Call: &call}); err != nil {
		return failedCall("the call could not be sent: " + err.Error()), true
	}
	f, err := protocol.ReadToolFrame(ch, protocol.MaxToolFrame, protocol.StepToolAnswer)
	if err != nil {
		return nil, false
	}
	answer, err := json.Marshal(f.Answer)
	if err != nil {
		return failedCall("the answer could not be read: " + err.Error()), true
	}
	return answer, true
}

// failedCall is a ToolAnswer of class ToolError saying msg.
func failedCall(msg string) []byte {
	b, _ := json.Marshal(protocol.ToolAnswer{Error: &protocol.ToolError{Class: protocol.ToolErrorFailed, Message: msg}})
	return b
}
