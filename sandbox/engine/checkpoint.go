package engine

import (
	"errors"

	"github.com/bytecodealliance/wasmtime-go/v44"
)

// Checkpoint is an instance's state at one moment: the bytes of its linear memory
// and the values of its mutable globals (which, in a module made by Snapshot, are
// all exported: wasmimage refuses others). That is all of a WebAssembly instance's
// own state; what the host keeps for it (WASI's open descriptors, the files it
// wrote) is not in it. A Checkpoint's buffer is reused by the next Checkpoint call.
type Checkpoint struct {
	memory  []byte
	globals []*wasmtime.Global
	values  []wasmtime.Val
}

// Size is the bytes of linear memory the checkpoint holds.
func (cp *Checkpoint) Size() int { return len(cp.memory) }

// ErrNoMemory is returned by Checkpoint for an instance without an exported memory.
var ErrNoMemory = errors.New("engine: the instance exports no memory")

// Checkpoint records in's linear memory and mutable exported globals in cp. It
// copies the whole memory (about 3 ms per 25 MB here): only between calls.
func (in *Instance) Checkpoint(cp *Checkpoint) error {
	if in.memory == nil {
		return ErrNoMemory
	}
	data := in.memory.UnsafeData(in.store)
	if cap(cp.memory) < len(data) {
		cp.memory = make([]byte, len(data))
	}
	cp.memory = cp.memory[:len(data)]
	copy(cp.memory, data)
	if cp.globals == nil {
		for _, ex := range in.m.m.Exports() {
			gt := ex.Type().GlobalType()
			if gt == nil || !gt.Mutable() {
				continue
			}
			if x := in.inst.GetExport(in.store, ex.Name()); x != nil && x.Global() != nil {
				cp.globals = append(cp.globals, x.Global())
			}
		}
		cp.values = make([]wasmtime.Val, len(cp.globals))
	}
	for i, g := range cp.globals {
		cp.values[i] = g.Get(in.store)
	}
	return nil
}

// Restore puts in back to cp, taken of this instance: the memory's first Size bytes
// are cp's and the rest (a memory cannot shrink) zero, and the globals are cp's. The
// instance may be called again, as if the calls since cp had not happened.
func (in *Instance) Restore(cp *Checkpoint) error {
	if in.memory == nil || cp.memory == nil {
		return ErrNoMemory
	}
	data := in.memory.UnsafeData(in.store)
	if len(data) < len(cp.memory) {
		return errors.New("engine: the memory is smaller than the checkpoint's")
	}
	copy(data, cp.memory)
	clear(data[len(cp.memory):])
	for i, g := range cp.globals {
		if err := g.Set(in.store, cp.values[i]); err != nil {
			return err
		}
	}
	return nil
}

// Interrupt makes the guest of every instance of e that is running trap at its
// next epoch check (a call of Instance.Call then ends as if its CPU limit were
// reached); instances not running are not affected. Safe from any goroutine.
func (e *Engine) Interrupt() { e.we.IncrementEpoch() }
