package protocol

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
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

// FuzzReadToolFrame feeds fuzzed bytes to the tools channel's reader, which reads
// what a native guest writes: never a panic, never a frame over the bound held, and
// after a frame refused as too large the next frame is read in step.
func FuzzReadToolFrame(f *testing.F) {
	var buf bytes.Buffer
	if err := WriteToolFrame(&buf, ToolFrame{Step: StepToolCall, Call: &ToolCall{Tool: "a.b", Arguments: []byte(`{"x":1}`), ID: 7}}); err != nil {
		f.Fatal(err)
	}
	f.Add(buf.Bytes())
	f.Add([]byte{0, 0, 0, 2, '{', '}'})
	f.Add([]byte{0, 0, 1, 0, 'x'})
	f.Fuzz(func(t *testing.T, data []byte) {
		const max = 64
		fr, err := ReadToolFrame(bytes.NewReader(data), max, StepToolCall)
		if len(data) >= 4 && binary.BigEndian.Uint32(data) > max && !errors.Is(err, ErrFrameTooLarge) && err != io.EOF {
			t.Fatalf("a frame over the bound: %v", err)
		}
		if err == nil && fr.Call == nil {
			t.Fatal("a call without its member accepted")
		}
	})
}

// A frame over the bound is read past, and the one after it is read.
func TestReadToolFrameSkipsTooLarge(t *testing.T) {
	var buf bytes.Buffer
	buf.Write(binary.BigEndian.AppendUint32(nil, 100))
	buf.Write(make([]byte, 100))
	if err := WriteToolFrame(&buf, ToolFrame{Step: StepToolCall, Call: &ToolCall{List: true}}); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadToolFrame(&buf, 64, StepToolCall); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("a frame of 100 bytes with a bound of 64: %v", err)
	}
	if f, err := ReadToolFrame(&buf, 64, StepToolCall); err != nil || !f.Call.List {
		t.Fatalf("the next frame: %+v %v", f, err)
	}
}
