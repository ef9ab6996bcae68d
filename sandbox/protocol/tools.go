package protocol

import (
	"bytes"
	_ "embed"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// The tools channel: how a guest calls the tools the daemon offers it ("code mode").
// It is a channel of its own, apart from the control fd, so that a call never mixes
// with a run's or a cell's own frames:
//
//	guest                  worker                         parent (its Tools)
//	  | tools.NAME(...)      |                               |
//	  |--------------------->| (wasm: the host function       |
//	  |  _sandcell.tool_call |  sandcell.tool_call)           |
//	  |                      |  tool_call {ToolCall}          |
//	  |                      |------------------------------->| policy, limits,
//	  |                      |                                | approval, audit,
//	  |                      |  tool_answer {ToolAnswer}      | the tool
//	  |                      |<-------------------------------|
//	  |<---------------------|                                |
//
// On the wasm backend the guest reaches fd ToolsFD only through the worker's host
// function (the interpreter's built-in _sandcell.tool_call): the guest has no
// descriptors of the host's. On the native backend the worker has become the guest
// (StepExec), so the guest's runner writes the frames on ToolsFD itself, and the
// parent trusts nothing in them but the request: who calls, from which run or cell,
// is the parent's to say. Either way one call is answered before the next is read.

// ToolsFD is the worker's end of the tools channel (a Unix socket; the parent holds
// the other end). A wasm worker keeps it for its host function; a native worker
// passes it to the guest's interpreter.
const ToolsFD = 6

// The tools channel's steps.
const (
	// StepToolCall (guest to parent, with a ToolCall): list the tools, or call one.
	StepToolCall Step = "tool_call"
	// StepToolAnswer (parent to guest, with a ToolAnswer): the call's answer.
	StepToolAnswer Step = "tool_answer"
)

// MaxToolFrame bounds a frame on the tools channel, either way (8 MiB): a call's
// arguments and an answer's result are bounded by the operator's limits well below
// it; past it a frame is refused unread (see ReadToolFrame).
const MaxToolFrame = 8 << 20

// ToolCall is what a guest asks of its tools.
type ToolCall struct {
	// List asks for the tools offered (ToolAnswer.Tools); Tool and Arguments are
	// then empty.
	List bool `json:"list,omitempty"`
	// Tool is the name of the tool called, as ToolSpec.Name.
	Tool string `json:"tool,omitempty"`
	// Arguments is the call's arguments: a JSON object, as the tool's input schema
	// describes.
	Arguments json.RawMessage `json:"arguments,omitempty"`
	// ID is the guest's number for the call, which its answer carries back.
	ID int64 `json:"id,omitempty"`
}

// ToolSpec describes a tool the guest may call, as its module shows it.
type ToolSpec struct {
	// Name is a Python identifier, unique among the tools offered.
	Name string `json:"name"`
	// Description is the tool's own description (its docstring in the guest).
	Description string `json:"description,omitempty"`
	// InputSchema is the JSON Schema of the arguments object.
	InputSchema json.RawMessage `json:"input_schema,omitempty"`
	// Writes says the tool changes something outside the run (its calls may wait
	// for an approval).
	Writes bool `json:"writes,omitempty"`
}

// ToolError is a call's failure, by class (the guest raises the exception of that
// name) and message.
type ToolError struct {
	// Class is one of the ToolError* classes.
	Class string `json:"class"`
	// Message says why, for the program's author.
	Message string `json:"message"`
}

// The classes of a failed call, which are the guest's exception classes
// (sandcell.tools.ToolDenied, ...).
const (
	// ToolErrorDenied: the caller may not call this tool, or no such tool is offered.
	ToolErrorDenied = "ToolDenied"
	// ToolErrorDeclined: the call needed an approval and a person declined it (or
	// none decided in time).
	ToolErrorDeclined = "ApprovalDeclined"
	// ToolErrorLimit: a limit of the run's calls was reached (calls, bytes, time).
	ToolErrorLimit = "ToolLimit"
	// ToolErrorFailed: the tool ran and failed, or could not be reached.
	ToolErrorFailed = "ToolError"
)

// ToolAnswer is the parent's answer to a ToolCall: exactly one of Tools (for List),
// Result or Error.
type ToolAnswer struct {
	// Tools are the tools offered, for a List call.
	Tools []ToolSpec `json:"tools,omitempty"`
	// Result is the tool's result, a JSON value.
	Result json.RawMessage `json:"result,omitempty"`
	// Error is why the call failed.
	Error *ToolError `json:"error,omitempty"`
	// ID is the call's ID.
	ID int64 `json:"id,omitempty"`
}

// ToolFrame is one message on the tools channel.
type ToolFrame struct {
	Version int         `json:"version"`
	Step    Step        `json:"step"`
	Call    *ToolCall   `json:"call,omitempty"`
	Answer  *ToolAnswer `json:"answer,omitempty"`
}

// ErrEncode is returned by WriteToolFrame for a frame that is not JSON (a result
// that is not a JSON value).
var ErrEncode = errors.New("protocol: the frame cannot be encoded")

// WriteToolFrame writes f (with this build's Version) as one frame: a 4-byte
// big-endian length, then the JSON (without HTML escapes: "<" stays one byte, as
// the guest sent it).
func WriteToolFrame(w io.Writer, f ToolFrame) error {
	f.Version = Version
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(f); err != nil {
		return fmt.Errorf("%w: %v", ErrEncode, err)
	}
	body := bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
	if len(body) > MaxToolFrame {
		return fmt.Errorf("%w: %d bytes", ErrFrameTooLarge, len(body))
	}
	frame := binary.BigEndian.AppendUint32(make([]byte, 0, 4+len(body)), uint32(len(body)))
	if _, err := w.Write(append(frame, body...)); err != nil {
		return fmt.Errorf("protocol: write tool frame: %w", err)
	}
	return nil
}

// ReadToolFrame reads one frame of step want from r. A frame longer than max bytes
// is read past (discarded, never held) and refused with ErrFrameTooLarge, so the
// channel stays in step; one of another version or step, or not JSON, is refused
// with ErrVersion or ErrStep. It returns io.EOF when r ends before a frame starts.
func ReadToolFrame(r io.Reader, max int, want Step) (ToolFrame, error) {
	return ReadToolFrameBound(r, func() int { return max }, want)
}

// ReadToolFrameBound is ReadToolFrame with the bound asked for once the frame's
// length is read (a session's channel waits between cells, and the cell that comes
// sets the bound).
func ReadToolFrameBound(r io.Reader, bound func() int, want Step) (ToolFrame, error) {
	var f ToolFrame
	var head [4]byte
	if _, err := io.ReadFull(r, head[:]); err != nil {
		if err == io.ErrUnexpectedEOF {
			err = io.EOF
		}
		return f, err
	}
	max := bound()
	n := int64(binary.BigEndian.Uint32(head[:]))
	if n > int64(max) {
		if _, err := io.CopyN(io.Discard, r, n); err != nil {
			return f, err
		}
		return f, fmt.Errorf("%w: %d bytes, at most %d", ErrFrameTooLarge, n, max)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return f, io.ErrUnexpectedEOF
	}
	if err := json.Unmarshal(body, &f); err != nil {
		return f, fmt.Errorf("%w: not a tool frame: %v", ErrStep, err)
	}
	switch {
	case f.Version != Version:
		return f, fmt.Errorf("%w: this side speaks %d, the frame is %d", ErrVersion, Version, f.Version)
	case f.Step != want:
		return f, fmt.Errorf("%w: %q where %q was expected", ErrStep, f.Step, want)
	case want == StepToolCall && f.Call == nil, want == StepToolAnswer && f.Answer == nil:
		return f, fmt.Errorf("%w: %q without its member", ErrStep, f.Step)
	}
	return f, nil
}

//go:embed tools.py
var toolsModule string

// ToolsSource returns the Python source both guests build their tools module from
// (tools.py: the function _sandcell_tools(call, json, types), which returns the
// modules sandcell and sandcell.tools), for a bootstrap or runner to begin with.
func ToolsSource() string { return toolsModule }
