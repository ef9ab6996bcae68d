package engine

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"

	"github.com/bytecodealliance/wasmtime-go/v44"

	"github.com/sandcell/sandcell/sandbox/engine/wasmimage"
)

// A snapshot is a reactor module started once and written back with the state its
// initialisation left: its linear memory as data segments, its mutable globals'
// values as their initial values (see wasmimage). Every run instantiates it fresh
// (copy-on-write from the compiled module's memory image) and calls RunExport once.
const (
	// InitExport is the reactor's initialisation, called once by Snapshot after
	// wasi-libc's _initialize; it returns 0, or the step that failed.
	InitExport = "sandcell_init"
	// RunExport runs one program in an instance of a snapshot and returns its exit
	// status.
	RunExport = "sandcell_run"
)

// snapshotMemory bounds the linear memory of the initialisation (bytes).
const snapshotMemory = 1 << 30

// Snapshot instantiates wasm, a WASI reactor exporting InitExport and RunExport,
// with argv and an empty environment, the host directory lib preopened read-only at
// guestLib (the only directory it can name) and empty stdio, calls _initialize and
// InitExport, and returns the module rewritten to start where they ended. The
// snapshot no longer exports _initialize or InitExport. The result depends only on
// wasm, argv and what lib holds (the initialisation must itself be deterministic;
// callers pin that by hashing a snapshot made with fixed inputs). It compiles wasm
// (seconds) and takes about 100 ms more. Errors say which step failed, with what the
// initialisation wrote to stderr.
func (e *Engine) Snapshot(wasm []byte, lib, guestLib string, argv []string) ([]byte, error) {
	m, err := wasmimage.Parse(wasm)
	if err != nil {
		return nil, fmt.Errorf("engine: snapshot: %w", err)
	}
	mod, err := wasmtime.NewModule(e.we, wasm)
	if err != nil {
		return nil, fmt.Errorf("engine: snapshot: compile: %w", err)
	}
	defer mod.Close()
	tmp, err := os.MkdirTemp("", "sandcell-snapshot-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	wasi := wasmtime.NewWasiConfig()
	wasi.SetArgv(argv)
	wasi.SetEnv(nil, nil)
	stdio := map[string]func(string) error{"stdin": wasi.SetStdinFile, "stdout": wasi.SetStdoutFile, "stderr": wasi.SetStderrFile}
	for name, set := range stdio {
		p := filepath.Join(tmp, name)
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			return nil, err
		}
		if err := set(p); err != nil {
			return nil, fmt.Errorf("engine: snapshot: %s: %w", name, err)
		}
	}
	if err := wasi.PreopenDir(lib, guestLib, wasmtime.DIR_READ, wasmtime.FILE_READ); err != nil {
		return nil, fmt.Errorf("engine: snapshot: preopen %s: %w", lib, err)
	}
	store := wasmtime.NewStore(e.we)
	defer store.Close()
	store.SetWasi(wasi)
	store.Limiter(snapshotMemory, -1, 1, -1, 1)
	if e.opts.Fuel {
		if err := store.SetFuel(math.MaxUint64); err != nil {
			return nil, err
		}
	}
	if !e.opts.Epochless {
		store.SetEpochDeadline(math.MaxUint32)
	}
	linker := wasmtime.NewLinker(e.we)
	defer linker.Close()
	if err := linker.DefineWasi(); err != nil {
		return nil, err
	}
	var memory *wasmtime.Memory
	if err := defineFrozenClock(linker, &memory); err != nil {
		return nil, err
	}
	if err := defineTools(linker, nil); err != nil {
		return nil, err
	}
	inst, err := linker.Instantiate(store, mod)
	if err != nil {
		return nil, fmt.Errorf("engine: snapshot: instantiate: %w", err)
	}
	ex := inst.GetExport(store, "memory")
	if ex == nil || ex.Memory() == nil {
		return nil, fmt.Errorf("engine: snapshot: the module exports no memory")
	}
	memory = ex.Memory()
	stderr := func() string {
		b, _ := os.ReadFile(filepath.Join(tmp, "stderr"))
		if len(b) > 4096 {
			b = b[len(b)-4096:]
		}
		return strings.TrimSpace(string(b))
	}
	if f := inst.GetFunc(store, "_initialize"); f != nil {
		if _, err := f.Call(store); err != nil {
			return nil, fmt.Errorf("engine: snapshot: _initialize: %w", err)
		}
	}
	if inst.GetFunc(store, RunExport) == nil {
		return nil, fmt.Errorf("engine: snapshot: the module has no %s export", RunExport)
	}
	init := inst.GetFunc(store, InitExport)
	if init == nil {
		return nil, fmt.Errorf("engine: snapshot: the module has no %s export", InitExport)
	}
	res, err := init.Call(store)
	if err != nil {
		return nil, fmt.Errorf("engine: snapshot: %s: %w (stderr: %s)", InitExport, err, stderr())
	}
	if step, _ := res.(int32); step != 0 {
		return nil, fmt.Errorf("engine: snapshot: %s failed at step %d (stderr: %q)", InitExport, step, stderr())
	}
	if out, _ := os.ReadFile(filepath.Join(tmp, "stdout")); len(out) > 0 {
		return nil, fmt.Errorf("engine: snapshot: the initialisation wrote %d bytes to stdout", len(out))
	}
	img := wasmimage.Image{Globals: map[uint32]uint64{}, DropExports: []string{"_initialize", InitExport}}
	img.Memory = append([]byte(nil), memory.UnsafeData(store)...)
	for _, g := range m.Globals() {
		if !g.Mutable {
			continue
		}
		gx := inst.GetExport(store, g.Export)
		if gx == nil || gx.Global() == nil {
			return nil, fmt.Errorf("engine: snapshot: global %s is not exported as a global", g.Export)
		}
		v := gx.Global().Get(store)
		switch g.Type {
		case wasmimage.I32:
			img.Globals[g.Index] = uint64(uint32(v.I32()))
		case wasmimage.I64:
			img.Globals[g.Index] = uint64(v.I64())
		case wasmimage.F32:
			img.Globals[g.Index] = uint64(math.Float32bits(v.F32()))
		case wasmimage.F64:
			img.Globals[g.Index] = math.Float64bits(v.F64())
		}
	}
	out, err := m.Write(img)
	if err != nil {
		return nil, fmt.Errorf("engine: snapshot: %w", err)
	}
	return out, nil
}
