package protocol

import (
	"errors"
	"fmt"
)

// Checkpoint describes a session's state as it travels (StepCheckpoint) and as the
// daemon keeps it on disk: the interpreter's linear memory, of which only the
// Extents that are not all zero are carried, and its mutable globals. The body that
// follows it is the Extents' bytes, in order, raw; CRC32C is their checksum, which
// the parent checks as it sends them to a worker, before any cell runs.
type Checkpoint struct {
	// MemoryBytes is the size of the linear memory, a multiple of PageBytes.
	MemoryBytes int64 `json:"memory_bytes"`
	// Extents are the runs of memory the body carries, in increasing order, not
	// touching, each a whole number of pages within MemoryBytes; the rest is zero.
	Extents []Extent `json:"extents"`
	// Globals are the mutable exported globals by name (__stack_pointer, ...).
	Globals []Global `json:"globals"`
	// CRC32C is the body's CRC-32C (Castagnoli): it finds a checkpoint damaged on
	// disk, at 20 GB/s where SHA-256 ran at 1.2 (the file is the daemon's own, in
	// its state directory: damage, not forgery, is what it guards against).
	CRC32C uint32 `json:"crc32c"`
}

// Extent is one run of a Checkpoint's memory: Length bytes at Offset.
type Extent struct {
	Offset int64 `json:"offset"`
	Length int64 `json:"length"`
}

// Global is one WebAssembly global's value: Type "i32", "i64", "f32" or "f64", and
// its bits (a float's IEEE 754 bits; an i32's as an unsigned 32-bit number).
type Global struct {
	Name string `json:"name"`
	Type string `json:"type"`
	Bits uint64 `json:"bits"`
}

// PageBytes is WebAssembly's page, the unit of a Checkpoint's memory and extents.
const PageBytes = 64 << 10

// ErrCheckpoint is wrapped by Checkpoint.Check.
var ErrCheckpoint = errors.New("protocol: malformed checkpoint")

// Check verifies c's shape: memory at most maxMemory bytes (and whole pages),
// extents whole pages within it in increasing order, known global types.
func (c *Checkpoint) Check(maxMemory int64) error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", ErrCheckpoint, fmt.Sprintf(format, a...))
	}
	if c.MemoryBytes <= 0 || c.MemoryBytes%PageBytes != 0 || c.MemoryBytes > maxMemory {
		return bad("memory of %d bytes (whole pages, at most %d)", c.MemoryBytes, maxMemory)
	}
	end := int64(-1)
	for _, e := range c.Extents {
		if e.Offset <= end || e.Length <= 0 || e.Offset%PageBytes != 0 || e.Length%PageBytes != 0 ||
			e.Length > c.MemoryBytes-e.Offset {
			return bad("extent [%d, +%d) out of order or out of the memory", e.Offset, e.Length)
		}
		end = e.Offset + e.Length
	}
	if len(c.Globals) > 1024 {
		return bad("%d globals", len(c.Globals))
	}
	for _, g := range c.Globals {
		switch g.Type {
		case "i32", "f32":
			if g.Bits > 0xFFFFFFFF {
				return bad("global %s: %d bits for a %s", g.Name, g.Bits, g.Type)
			}
		case "i64", "f64":
		default:
			return bad("global %s of type %q", g.Name, g.Type)
		}
	}
	return nil
}

// BodyBytes is the length of the body that follows c: its extents' bytes.
func (c *Checkpoint) BodyBytes() int64 {
	var n int64
	for _, e := range c.Extents {
		n += e.Length
	}
	return n
}
