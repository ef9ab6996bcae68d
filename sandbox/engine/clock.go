package engine

import (
	"encoding/binary"
	"sync/atomic"
	"time"

	"github.com/bytecodealliance/wasmtime-go/v44"
)

// Clock is the guest's monotonic clock: the nanoseconds since its zero, which is when
// it was made or last Restarted. wasmtime's own monotonic clock counts from the
// creation of the WASI context, so a guest that started before its run was known (a
// warm worker's) would read, at the start of its run, how long it had waited in the
// pool: that tells a run when someone else's run refilled the pool. A Clock restarted
// when the run's program arrives reads near 0 at the start of every run, warm or cold.
// Its methods are safe for concurrent use.
type Clock struct {
	zero atomic.Pointer[time.Time]
}

// NewClock returns a clock whose zero is now.
func NewClock() *Clock {
	c := &Clock{}
	c.Restart()
	return c
}

// Restart makes now the clock's zero.
func (c *Clock) Restart() {
	now := time.Now()
	c.zero.Store(&now)
}

// Monotonic is the time since the clock's zero (Go's monotonic reading: never
// backwards, whatever the wall clock does).
func (c *Clock) Monotonic() time.Duration { return time.Since(*c.zero.Load()) }

// WASI preview1 clock ids (clockid) and the errnos clock_time_get answers with.
const (
	clockRealtime  = 0
	clockMonotonic = 1
	errnoSuccess   = 0
	errnoFault     = 21 // the result pointer is outside linear memory
	errnoInval     = 28 // no such clock

	subscriptionSize    = 48
	eventClock          = 0
	subscriptionAbstime = 1
)

// defineClock replaces wasi_snapshot_preview1.clock_time_get in l (which already has
// WASI) with one that answers the monotonic clock from c and the realtime clock from
// the host; the CPU-time clocks, which wasmtime's preview1 does not offer either, are
// EINVAL; and poll_oneoff with one that reads timeouts on the same clocks
// (time.sleep's deadline is absolute on the monotonic clock: clock_nanosleep with
// TIMER_ABSTIME). (clock_res_get stays wasmtime's.)
// mem is the instance's memory, set once it is instantiated. (An untyped FuncNew
// costs about 1 us a call here, a reflecting FuncWrap 4 us; wasmtime's own 0.3 us.)
func defineClock(l *wasmtime.Linker, c *Clock, mem **wasmtime.Memory) error {
	l.AllowShadowing(true)
	defer l.AllowShadowing(false)
	i32, i64 := wasmtime.NewValType(wasmtime.KindI32), wasmtime.NewValType(wasmtime.KindI64)
	errno := func(n int32) ([]wasmtime.Val, *wasmtime.Trap) { return []wasmtime.Val{wasmtime.ValI32(n)}, nil }
	pollTy := wasmtime.NewFuncType([]*wasmtime.ValType{i32, i32, i32, i32}, []*wasmtime.ValType{i32})
	err := l.FuncNew("wasi_snapshot_preview1", "poll_oneoff", pollTy,
		func(caller *wasmtime.Caller, args []wasmtime.Val) ([]wasmtime.Val, *wasmtime.Trap) {
			if *mem == nil {
				return errno(errnoFault)
			}
			return errno(poll(c, (*mem).UnsafeData(caller), uint32(args[0].I32()), uint32(args[1].I32()),
				uint32(args[2].I32()), uint32(args[3].I32())))
		})
	if err != nil {
		return err
	}
	ty := wasmtime.NewFuncType([]*wasmtime.ValType{i32, i64, i32}, []*wasmtime.ValType{i32})
	return l.FuncNew("wasi_snapshot_preview1", "clock_time_get", ty,
		func(caller *wasmtime.Caller, args []wasmtime.Val) ([]wasmtime.Val, *wasmtime.Trap) {
			var ns int64
			switch args[0].I32() {
			case clockRealtime:
				ns = time.Now().UnixNano()
			case clockMonotonic:
				ns = int64(c.Monotonic())
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

// WASI preview1 layouts: a subscription is 48 bytes (userdata at 0, tag at 8; a
// clock's id at 16, timeout at 24, flags at 40; an fd's number at 16), an event 32
// (userdata at 0, error at 8, type at 10, an fd's nbytes at 16 and flags at 24).
const (
	eventSize    = 32
	eventFDRead  = 1
	eventFDWrite = 2
)

// poll is poll_oneoff (wasi_snapshot_preview1) for nsubs subscriptions at in, with
// the events written at out and their number at nevents; it returns the errno.
// Clock subscriptions wait on c (monotonic) or the host's realtime clock, relative or
// absolute; file descriptor subscriptions are ready at once, as they are in
// wasmtime's preview1 for files (a guest has no sockets, and its stdin is a pipe
// written in full before the run).
func poll(c *Clock, data []byte, in, out, nsubs, nevents uint32) int32 {
	size := uint64(len(data))
	if nsubs == 0 {
		return errnoInval
	}
	if uint64(in)+uint64(nsubs)*subscriptionSize > size || uint64(out)+uint64(nsubs)*eventSize > size ||
		uint64(nevents)+4 > size {
		return errnoFault
	}
	subs := make([]byte, nsubs*subscriptionSize) // the guest may not change them while we wait
	copy(subs, data[in:])
	var deadlines []time.Time // per subscription; zero for an fd
	ready := false
	earliest := time.Time{}
	now := time.Now()
	for i := uint32(0); i < nsubs; i++ {
		sub := subs[i*subscriptionSize:]
		var d time.Time
		if sub[8] == eventClock {
			timeout := time.Duration(binary.LittleEndian.Uint64(sub[24:]))
			abs := binary.LittleEndian.Uint16(sub[40:])&subscriptionAbstime != 0
			switch id := binary.LittleEndian.Uint32(sub[16:]); {
			case !abs:
				d = now.Add(timeout)
			case id == clockMonotonic:
				d = now.Add(timeout - c.Monotonic())
			case id == clockRealtime:
				d = time.Unix(0, int64(timeout))
			default:
				d = now // answered at once with EINVAL
			}
			if earliest.IsZero() || d.Before(earliest) {
				earliest = d
			}
		} else {
			ready = true
		}
		deadlines = append(deadlines, d)
	}
	if !ready {
		time.Sleep(time.Until(earliest))
	}
	now = time.Now()
	n := uint32(0)
	for i, d := range deadlines {
		sub := subs[uint32(i)*subscriptionSize:]
		if !d.IsZero() && d.After(now) {
			continue
		}
		ev := data[out+n*eventSize : out+(n+1)*eventSize]
		clear(ev)
		copy(ev[0:8], sub[0:8])
		ev[10] = sub[8]
		if sub[8] == eventClock {
			if id := binary.LittleEndian.Uint32(sub[16:]); id != clockMonotonic && id != clockRealtime {
				binary.LittleEndian.PutUint16(ev[8:], errnoInval)
			}
		} else if sub[8] != eventFDRead && sub[8] != eventFDWrite {
			binary.LittleEndian.PutUint16(ev[8:], errnoInval)
		}
		n++
	}
	binary.LittleEndian.PutUint32(data[nevents:], n)
	return errnoSuccess
}
