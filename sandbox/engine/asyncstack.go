package engine

// wasmtime checks that the maximum wasm stack fits in the stack of an async fiber
// whether or not async is used ("max_wasm_stack size cannot exceed the
// async_stack_size", 2 MiB by default), and wasmtime-go has no setter for the
// latter. The C API's does it (wasmtime/async.h), on the configuration's one pointer;
// wasmtime-go's static library, linked with every binary that uses it, defines it.

/*
#include <stdint.h>
typedef struct wasm_config_t wasm_config_t;
extern void wasmtime_config_async_stack_size_set(wasm_config_t *config, uint64_t size);
*/
import "C"

import (
	"unsafe"

	"github.com/bytecodealliance/wasmtime-go/v44"
)

// configPointerOnly reports whether wasmtime.Config is what setAsyncStackSize
// assumes: a struct of one pointer, the C configuration (wasmtime-go 44's
// config.go). A test checks it against the pinned version.
func configPointerOnly() bool {
	return unsafe.Sizeof(wasmtime.Config{}) == unsafe.Sizeof(uintptr(0))
}

// setAsyncStackSize sets cfg's async stack size in bytes. It panics if
// wasmtime.Config is not a single pointer: a wasmtime-go upgrade that changed it
// must change this too, and no engine is made meanwhile.
func setAsyncStackSize(cfg *wasmtime.Config, size int) {
	if !configPointerOnly() {
		panic("engine: wasmtime.Config is not one pointer: setAsyncStackSize needs updating for this wasmtime-go")
	}
	ptr := *(**C.wasm_config_t)(unsafe.Pointer(cfg))
	C.wasmtime_config_async_stack_size_set(ptr, C.uint64_t(size))
}
