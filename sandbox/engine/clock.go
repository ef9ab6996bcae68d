package engine

import (
	"encoding/binary"

	"github.com/bytecodealliance/wasmtime-go/v44"
)

// WASI preview1 clock ids (clockid) and the errnos clock_time_get answers with.
const (
	clockRealtime  = 0
	clockMonotonic = 1
	errnoSuccess   = 0
	errnoFault     = 21 // the result pointer is outside linear memory
	errnoInval     = 28 // no such clock
)

// snapshotEpoch is the realtime clock a snapshot's initialisation reads
// (2025-07-20T08:26:40Z, the interpreter build's SOURCE_DATE_EPOCH), in ns.
const snapshotEpoch = 1753000000 * 1_000_000_000

// defineFrozenClock replaces wasi_snapshot_preview1.clock_time_get in l (which
// already has WASI) with a clock that reads the same in every initialisation, so
// that what the initialisation stores of it (CPython keeps a monotonic reading) does
// not make two snapshots differ: realtime is snapshotEpoch plus the monotonic
// reading, and the monotonic clock advances by 1 us per reading from 0. Other clocks
// are EINVAL. mem is the instance's memory, set once it is instantiated.
func defineFrozenClock(l *wasmtime.Linker, mem **wasmtime.Memory) error {
	l.AllowShadowing(true)
	defer l.AllowShadowing(false)
	i32, i64 := wasmtime.NewValType(wasmtime.KindI32), wasmtime.NewValType(wasmtime.KindI64)
	errno := func(n int32) ([]wasmtime.Val, *wasmtime.Trap) { return []wasmtime.Val{wasmtime.ValI32(n)}, nil }
	var readings int64
	ty := wasmtime.NewFuncType([]*wasmtime.ValType{i32, i64, i32}, []*wasmtime.ValType{i32})
	return l.FuncNew("wasi_snapshot_preview1", "clock_time_get", ty,
		func(caller *wasmtime.Caller, args []wasmtime.Val) ([]wasmtime.Val, *wasmtime.Trap) {
			readings++
			ns := readings * 1000
			switch args[0].I32() {
			case clockRealtime:
				ns += snapshotEpoch
			case clockMonotonic:
			default:
				return errno(errnoInval)
			}
			if *mem == nil {
				return errno(errnoFault)
			}
			data := (*mem).UnsafeData(caller)
			p := uint64(uint32(args[2].I32()))
			if p+8 > uint64(len(data)) {
				return errno(errnoFault)
			}
			binary.LittleEndian.PutUint64(data[p:p+8], uint64(ns))
			return errno(errnoSuccess)
		})
}
