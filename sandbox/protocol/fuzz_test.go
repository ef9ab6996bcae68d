package protocol

import (
	"bytes"
	"encoding/binary"
	"testing"
)

// FuzzReceive feeds fuzzed bytes to the frame reader both ends of the worker
// protocol use: never a panic, at most MaxFrame bytes taken, and a frame accepted
// encodes again to one that is accepted alike (a checkpoint's description checked
// as a resume would check it).
func FuzzReceive(f *testing.F) {
	for _, fr := range []Frame{
		{Version: Version, Step: StepRun, Request: &Request{Code: "print(1)"}},
		{Version: Version, Step: StepReport, Report: &Report{Reason: Exited}},
		{Version: Version, Step: StepInterrupt, Interrupt: "cancel"},
		{Version: Version, Step: StepCheckpoint, Checkpoint: &Checkpoint{MemoryBytes: PageBytes,
			Extents: []Extent{{Offset: 0, Length: PageBytes}}}},
	} {
		b, err := Encode(fr)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{0, 0, 0, 2, '{', '}'})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	steps := []Step{StepRun, StepTemplate, StepClaim, StepSession, StepCell, StepReport, StepCheckpoint,
		StepInterrupt, StepSave}
	f.Fuzz(func(t *testing.T, data []byte) {
		fr, err := Receive(bytes.NewReader(data), steps...)
		if err != nil {
			return
		}
		if n := binary.BigEndian.Uint32(data); n > MaxFrame {
			t.Fatalf("accepted a frame of %d bytes", n)
		}
		if fr.Checkpoint != nil {
			_ = fr.Checkpoint.Check(1 << 32)
		}
		b, err := Encode(fr)
		if err != nil {
			return // a frame too large once re-encoded (escapes grow it)
		}
		again, err := Receive(bytes.NewReader(b), steps...)
		if err != nil || again.Step != fr.Step {
			t.Fatalf("%+v re-encoded is refused: %v", fr, err)
		}
	})
}
