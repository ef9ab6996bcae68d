package engine

import (
	"errors"
	"fmt"
	"math"

	"github.com/bytecodealliance/wasmtime-go/v44"
)

// Checkpoint is an instance's state at one moment: the bytes of its linear memory
// and the values of its mutable globals (which, in a module made by Snapshot, are
// all exported: wasmimage refuses others). That is all of a WebAssembly instance's
// own state; what the host keeps for it (WASI's open descriptors, the files it
// wrote) is not in it. A Checkpoint's buffer is reused by the next Checkpoint call.
type Checkpoint struct {
	memory  []byte
	names   []string // the mutable exported globals, by name
	globals []*wasmtime.Global
	values  []wasmtime.Val
	of      *Instance // the instance globals belong to
}

// Size is the bytes of linear memory the checkpoint holds.
func (cp *Checkpoint) Size() int { return len(cp.memory) }

// Memory is the checkpoint's linear memory (its buffer, not a copy).
func (cp *Checkpoint) Memory() []byte { return cp.memory }

// Global is one of a Checkpoint's mutable globals: its export name, its type
// ("i32", "i64", "f32" or "f64", as WebAssembly's text format names them) and its
// bits (a float's IEEE 754 bits, an i32's as uint32).
type Global struct {
	Name string
	Type string
	Bits uint64
}

// Globals is the checkpoint's mutable globals.
func (cp *Checkpoint) Globals() []Global {
	out := make([]Global, len(cp.names))
	for i, v := range cp.values {
		out[i] = Global{Name: cp.names[i]}
		switch v.Kind() {
		case wasmtime.KindI32:
			out[i].Type, out[i].Bits = "i32", uint64(uint32(v.I32()))
		case wasmtime.KindI64:
			out[i].Type, out[i].Bits = "i64", uint64(v.I64())
		case wasmtime.KindF32:
			out[i].Type, out[i].Bits = "f32", uint64(math.Float32bits(v.F32()))
		case wasmtime.KindF64:
			out[i].Type, out[i].Bits = "f64", math.Float64bits(v.F64())
		}
	}
	return out
}

// Load makes cp the checkpoint of memory (taken, not copied) and globals, one
// taken of another instance of the same module (in another process, from what
// Memory and Globals gave there), to Restore into a fresh instance.
func (cp *Checkpoint) Load(memory []byte, globals []Global) error {
	cp.memory, cp.of = memory, nil
	cp.names = make([]string, len(globals))
	cp.globals = make([]*wasmtime.Global, len(globals))
	cp.values = make([]wasmtime.Val, len(globals))
	for i, g := range globals {
		cp.names[i] = g.Name
		switch g.Type {
		case "i32":
			cp.values[i] = wasmtime.ValI32(int32(uint32(g.Bits)))
		case "i64":
			cp.values[i] = wasmtime.ValI64(int64(g.Bits))
		case "f32":
			cp.values[i] = wasmtime.ValF32(math.Float32frombits(uint32(g.Bits)))
		case "f64":
			cp.values[i] = wasmtime.ValF64(math.Float64frombits(g.Bits))
		default:
			return fmt.Errorf("engine: global %s of type %q", g.Name, g.Type)
		}
	}
	return nil
}

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
	if cp.of != in {
		cp.names, cp.globals = nil, nil
		for _, ex := range in.m.m.Exports() {
			gt := ex.Type().GlobalType()
			if gt == nil || !gt.Mutable() {
				continue
			}
			if x := in.inst.GetExport(in.store, ex.Name()); x != nil && x.Global() != nil {
				cp.names = append(cp.names, ex.Name())
				cp.globals = append(cp.globals, x.Global())
			}
		}
		cp.values = make([]wasmtime.Val, len(cp.globals))
		cp.of = in
	}
	for i, g := range cp.globals {
		cp.values[i] = g.Get(in.store)
	}
	return nil
}

// Restore puts cp into in, a fresh instance of the same module (see Instantiate)
// or the one cp was taken of: the memory grown to cp's size if it is smaller, its
// first Size bytes cp's and the rest zero, and the globals cp's. The instance may
// then be called as if the calls since cp had not happened. A fresh instance is
// the way to undo everything: its memory is exactly cp's (one that grew since is
// given back), and its WASI state (descriptors) is new.
func (in *Instance) Restore(cp *Checkpoint) error {
	if in.memory == nil || cp.memory == nil {
		return ErrNoMemory
	}
	const page = 64 << 10
	if size := in.memory.DataSize(in.store); size < uintptr(len(cp.memory)) {
		if _, err := in.memory.Grow(in.store, uint64((uintptr(len(cp.memory))-size+page-1)/page)); err != nil {
			return err
		}
	}
	data := in.memory.UnsafeData(in.store)
	if len(data) < len(cp.memory) {
		return errors.New("engine: the memory is smaller than the checkpoint's")
	}
	copy(data, cp.memory)
	clear(data[len(cp.memory):])
	for i, name := range cp.names {
		g := cp.globals[i]
		if cp.of != in {
			x := in.inst.GetExport(in.store, name)
			if x == nil || x.Global() == nil {
				return errors.New("engine: the instance lacks the checkpoint's global " + name)
			}
			g = x.Global()
			if cp.of == nil { // a loaded checkpoint: this instance's from now on
				cp.globals[i] = g
			}
		}
		if err := g.Set(in.store, cp.values[i]); err != nil {
			return err
		}
	}
	if cp.of == nil {
		cp.of = in
	}
	return nil
}

// Interrupt makes the guest of every instance of e that is running trap at its
// next epoch check (a call of Instance.Call then ends as if its CPU limit were
// reached); instances not running are not affected, nor any instance of an
// epochless engine. Safe from any goroutine.
func (e *Engine) Interrupt() { e.we.IncrementEpoch() }
