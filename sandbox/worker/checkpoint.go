package worker

import (
	"bytes"
	"fmt"
	"hash/crc32"
	"io"

	"github.com/sandcell/sandcell/sandbox/engine"
	"github.com/sandcell/sandcell/sandbox/protocol"
)

// sendCheckpoint writes cp to w as a StepCheckpoint frame and its body: the pages
// of its memory that are not all zero (an interpreter's memory is mostly zero past
// what it has used), checksummed first.
func sendCheckpoint(w io.Writer, cp *engine.Checkpoint) error {
	mem := cp.Memory()
	var zero [protocol.PageBytes]byte
	c := protocol.Checkpoint{MemoryBytes: int64(len(mem))}
	h := crc32.New(crc32.MakeTable(crc32.Castagnoli))
	for off := 0; off+protocol.PageBytes <= len(mem); off += protocol.PageBytes {
		page := mem[off : off+protocol.PageBytes]
		if bytes.Equal(page, zero[:]) {
			continue
		}
		h.Write(page)
		if n := len(c.Extents); n > 0 && c.Extents[n-1].Offset+c.Extents[n-1].Length == int64(off) {
			c.Extents[n-1].Length += protocol.PageBytes
		} else {
			c.Extents = append(c.Extents, protocol.Extent{Offset: int64(off), Length: protocol.PageBytes})
		}
	}
	c.CRC32C = h.Sum32()
	for _, g := range cp.Globals() {
		c.Globals = append(c.Globals, protocol.Global(g))
	}
	if err := protocol.Send(w, protocol.Frame{Step: protocol.StepCheckpoint, Checkpoint: &c}); err != nil {
		return err
	}
	for _, e := range c.Extents {
		if _, err := w.Write(mem[e.Offset : e.Offset+e.Length]); err != nil {
			return fmt.Errorf("write the checkpoint: %w", err)
		}
	}
	return nil
}

// receiveCheckpoint reads a StepCheckpoint frame and its body from r into cp, a
// memory of at most maxMemory bytes. (The parent checks the body's checksum as it
// sends it, and ends the worker before any cell runs if it does not match.)
func receiveCheckpoint(r io.Reader, maxMemory int64, cp *engine.Checkpoint) error {
	f, err := protocol.Receive(r, protocol.StepCheckpoint)
	if err != nil {
		return err
	}
	c := f.Checkpoint
	if err := c.Check(maxMemory); err != nil {
		return err
	}
	mem := make([]byte, c.MemoryBytes)
	for _, e := range c.Extents {
		if _, err := io.ReadFull(r, mem[e.Offset:e.Offset+e.Length]); err != nil {
			return fmt.Errorf("read the checkpoint: %w", err)
		}
	}
	globals := make([]engine.Global, len(c.Globals))
	for i, g := range c.Globals {
		globals[i] = engine.Global(g)
	}
	return cp.Load(mem, globals)
}
