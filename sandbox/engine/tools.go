package engine

import (
	"github.com/bytecodealliance/wasmtime-go/v44"
)

// ToolCaller carries one tool call of the guest's (the request's bytes, as the
// guest's _sandcell.tool_call gave them) to whoever answers it, and returns the
// answer's bytes; ok false means this run has no tools channel. It runs on the
// guest's thread while the guest waits: the guest's CPU clock does not run.
type ToolCaller func(request []byte) (answer []byte, ok bool)

// maxToolRequest bounds a request the host functions copy out of linear memory (the
// tools channel's own bound, protocol.MaxToolFrame, less its envelope).
const maxToolRequest = 8<<20 - 4<<10

// defineTools defines the interpreter's imports sandcell.tool_call(ptr, len) -> i64
// and sandcell.tool_answer(ptr, len) -> i32 (bundle/interpreter/sandcell.c) in l:
// tool_call copies the request out of linear memory, calls caller, keeps the answer
// and returns its length (-1: no channel, or a request out of bounds); tool_answer
// copies the kept answer into the guest's buffer of that length and returns the
// bytes copied (-1 when there is none or it does not fit). caller may be nil (a
// snapshot's initialisation, a run without tools): every call answers -1.
func defineTools(l *wasmtime.Linker, caller ToolCaller) error {
	i32, i64 := wasmtime.NewValType(wasmtime.KindI32), wasmtime.NewValType(wasmtime.KindI64)
	var kept []byte
	memory := func(c *wasmtime.Caller) []byte {
		ex := c.GetExport("memory")
		if ex == nil || ex.Memory() == nil {
			return nil
		}
		return ex.Memory().UnsafeData(c)
	}
	span := func(data []byte, p, n int32) ([]byte, bool) {
		start, end := uint64(uint32(p)), uint64(uint32(p))+uint64(uint32(n))
		if end > uint64(len(data)) {
			return nil, false
		}
		return data[start:end], true
	}
	call := wasmtime.NewFuncType([]*wasmtime.ValType{i32, i32}, []*wasmtime.ValType{i64})
	err := l.FuncNew("sandcell", "tool_call", call, func(c *wasmtime.Caller, args []wasmtime.Val) ([]wasmtime.Val, *wasmtime.Trap) {
		kept = nil
		fail := []wasmtime.Val{wasmtime.ValI64(-1)}
		if caller == nil || uint32(args[1].I32()) > maxToolRequest {
			return fail, nil
		}
		req, ok := span(memory(c), args[0].I32(), args[1].I32())
		if !ok {
			return fail, nil
		}
		// A copy: the guest's memory may move (grow) before the answer comes back.
		answer, ok := caller(append([]byte(nil), req...))
		if !ok {
			return fail, nil
		}
		kept = answer
		return []wasmtime.Val{wasmtime.ValI64(int64(len(answer)))}, nil
	})
	if err != nil {
		return err
	}
	answer := wasmtime.NewFuncType([]*wasmtime.ValType{i32, i32}, []*wasmtime.ValType{i32})
	return l.FuncNew("sandcell", "tool_answer", answer, func(c *wasmtime.Caller, args []wasmtime.Val) ([]wasmtime.Val, *wasmtime.Trap) {
		out, ok := span(memory(c), args[0].I32(), args[1].I32())
		if kept == nil || !ok || len(out) != len(kept) {
			return []wasmtime.Val{wasmtime.ValI32(-1)}, nil
		}
		n := copy(out, kept)
		kept = nil
		return []wasmtime.Val{wasmtime.ValI32(int32(n))}, nil
	})
}
