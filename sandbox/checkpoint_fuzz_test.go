package sandbox_test

import (
	"bytes"
	"testing"

	"github.com/sandcell/sandcell/sandbox"
	"github.com/sandcell/sandcell/sandbox/protocol"
)

// FuzzReadCheckpointHeader reads fuzzed checkpoint files (a session's state on the
// daemon's disk): never a panic, and a header accepted describes extents within its
// memory, in order, none overlapping, within the session's memory limit.
func FuzzReadCheckpointHeader(f *testing.F) {
	f.Add([]byte("sandcell checkpoint 1\n\x00\x00\x00\x02{}"))
	f.Add([]byte("sandcell checkpoint 1\n\x00\x00\x00\x4a" + `{"memory_bytes":65536,"extents":[{"offset":0,"length":65536}],"crc32c":0}`))
	f.Add([]byte("sandcell checkpoint 1\n\xff\xff\xff\xff"))
	f.Add([]byte("not a checkpoint"))
	const limit = 1 << 30
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := sandbox.ReadCheckpointHeader(bytes.NewReader(data), limit)
		if err != nil {
			return
		}
		if c.MemoryBytes <= 0 || c.MemoryBytes > limit || c.MemoryBytes%protocol.PageBytes != 0 {
			t.Fatalf("accepted memory of %d bytes", c.MemoryBytes)
		}
		end := int64(0)
		for _, e := range c.Extents {
			if e.Offset < end || e.Length <= 0 || e.Offset+e.Length > c.MemoryBytes {
				t.Fatalf("accepted extents %+v of memory %d", c.Extents, c.MemoryBytes)
			}
			end = e.Offset + e.Length
		}
	})
}
