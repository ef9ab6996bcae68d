package engine

import "testing"

// setAsyncStackSize reads wasmtime.Config as the one pointer wasmtime-go 44 makes
// it; an upgrade that changes the struct fails here, not in a worker.
func TestConfigIsOnePointer(t *testing.T) {
	if !configPointerOnly() {
		t.Fatal("wasmtime.Config is no longer a single pointer: update setAsyncStackSize")
	}
	// The worker's 8 MiB wasm stack is above wasmtime's 2 MiB async stack default:
	// without setAsyncStackSize, creating this engine panics in the C API.
	New(Options{WasmStack: 8 << 20})
}
