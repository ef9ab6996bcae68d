package protocol

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
)

func TestFrameRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	in := Request{Code: "print('é')", Stdin: []byte{0, 1, 255}, Args: []string{"a"},
		Limits: Limits{TimeoutMS: 5, MemoryBytes: 6, MaxStdoutBytes: 7, MaxStderrBytes: 8, Fuel: 9}}
	if err := Send(&buf, Frame{Step: StepClaim, Request: &in}); err != nil {
		t.Fatal(err)
	}
	f, err := Receive(&buf, StepRun, StepClaim)
	if err != nil {
		t.Fatal(err)
	}
	out := f.Request
	if f.Version != Version || out.Code != in.Code || !bytes.Equal(out.Stdin, in.Stdin) || out.Limits != in.Limits || out.Args[0] != "a" {
		t.Fatalf("got %+v", f)
	}
	if _, err := Receive(&buf, StepReport); !errors.Is(err, io.EOF) {
		t.Fatalf("empty reader: %v", err)
	}
}

// A frame out of turn, of another version, or without its member is refused by name.
func TestReceiveChecksTheStep(t *testing.T) {
	v := Version
	for _, c := range []struct {
		frame string
		want  error
	}{
		{fmt.Sprintf(`{"version":%d,"step":"ack"}`, v), ErrStep},        // not expected
		{fmt.Sprintf(`{"version":%d,"step":"report"}`, v), ErrStep},     // no report
		{fmt.Sprintf(`{"version":%d,"step":"ready"}`, v-1), ErrVersion}, // an older worker
		{fmt.Sprintf(`{"version":%d,"step":"ready","x":1}`, v), nil},    // unknown members are ignored
		{`{"code":"print(1)","version":3}`, ErrVersion},                 // a version-3 request
		{fmt.Sprintf(`{"version":%d,"step":"run","request":{}}`, v), ErrStep},
		{fmt.Sprintf(`{"version":%d,"step":"exec"}`, v), ErrStep}, // no contract
		{fmt.Sprintf(`{"version":%d,"step":"exec","report":{"reason":""}}`, v), nil},
	} {
		var buf bytes.Buffer
		binary.Write(&buf, binary.BigEndian, uint32(len(c.frame)))
		buf.WriteString(c.frame)
		_, err := Receive(&buf, StepReady, StepReport, StepExec)
		if c.want == nil && err != nil || c.want != nil && !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.frame, err, c.want)
		}
	}
}

func TestFrameLimits(t *testing.T) {
	var hdr [4]byte
	binary.BigEndian.PutUint32(hdr[:], MaxFrame+1)
	if _, err := Receive(bytes.NewReader(hdr[:]), StepReport); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("oversized: %v", err)
	}
	binary.BigEndian.PutUint32(hdr[:], 10)
	if _, err := Receive(bytes.NewReader(append(hdr[:], "{}"...)), StepReport); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("short: %v", err)
	}
	if err := Send(io.Discard, Frame{Step: StepRun, Request: &Request{Code: string(make([]byte, MaxFrame))}}); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("write oversized: %v", err)
	}
}

// Output that is not UTF-8 is carried as base64, so no byte is lost.
func TestResultOutputEncoding(t *testing.T) {
	for _, out := range [][]byte{[]byte("plain ✓\n"), {0, 0xff, 0xfe, 'x'}, nil} {
		in := Result{Reason: Exited, Stdout: out, Stderr: []byte("e")}
		b, err := json.Marshal(in)
		if err != nil {
			t.Fatal(err)
		}
		var back Result
		if err := json.Unmarshal(b, &back); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(back.Stdout, out) || string(back.Stderr) != "e" || back.Reason != Exited {
			t.Fatalf("%s -> %+v", b, back)
		}
	}
	b, _ := json.Marshal(Result{Stdout: []byte{0xff}})
	if !bytes.Contains(b, []byte(`"stdout":"/w==","stdout_encoding":"base64"`)) {
		t.Fatalf("%s", b)
	}
}

// WriteJSON streams what MarshalJSON builds: the same members and values, for text
// cut between pieces inside a multi-byte rune, escapes, binary and empty output.
func TestResultWriteJSON(t *testing.T) {
	long := bytes.Repeat([]byte("é\x01\"<\n✓"), 20000) // pieces end inside runes
	for _, out := range [][]byte{long, {0, 0xff, 0xfe, 'x'}, nil, []byte("\u2028")} {
		in := Result{Reason: Exited, ExitCode: 3, Stdout: out, Stderr: []byte{0xff}, Diagnostics: []string{"d"}}
		var streamed bytes.Buffer
		if err := in.WriteJSON(&streamed); err != nil {
			t.Fatal(err)
		}
		whole, _ := json.Marshal(in)
		var a, b map[string]any
		if err := json.Unmarshal(streamed.Bytes(), &a); err != nil {
			t.Fatalf("%v: %.200s", err, streamed.Bytes())
		}
		json.Unmarshal(whole, &b)
		if ja, jb := must(json.Marshal(a)), must(json.Marshal(b)); !bytes.Equal(ja, jb) {
			t.Fatalf("streamed %.200s\nwhole %.200s", ja, jb)
		}
	}
}

func must(b []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return b
}

// An interrupt carries its reason; a session's steps carry their requests.
func TestSessionSteps(t *testing.T) {
	for _, c := range []struct {
		frame string
		want  error
	}{
		{`{"step":"interrupt"}`, ErrStep},
		{`{"step":"interrupt","interrupt":"timeout"}`, nil},
		{`{"step":"cell"}`, ErrStep},
		{`{"step":"cell","request":{"code":"1"}}`, nil},
		{`{"step":"session"}`, ErrStep},
		{`{"step":"checkpoint"}`, ErrStep},
		{`{"step":"checkpoint","checkpoint":{"memory_bytes":65536}}`, nil},
	} {
		frame := fmt.Sprintf(`{"version":%d,`, Version) + c.frame[1:] // this build's
		var buf bytes.Buffer
		binary.Write(&buf, binary.BigEndian, uint32(len(frame)))
		buf.WriteString(frame)
		_, err := Receive(&buf, StepCell, StepInterrupt, StepSession, StepCheckpoint)
		if c.want == nil && err != nil || c.want != nil && !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.frame, err, c.want)
		}
	}
}

// A checkpoint's header is checked before its body is read: its memory within the
// limit and whole pages, its extents in order inside it, its globals' types.
func TestCheckpointCheck(t *testing.T) {
	ok := Checkpoint{MemoryBytes: 4 * PageBytes, Extents: []Extent{{0, PageBytes}, {2 * PageBytes, 2 * PageBytes}},
		Globals: []Global{{Name: "__stack_pointer", Type: "i32", Bits: 1 << 20}}}
	if err := ok.Check(4 * PageBytes); err != nil || ok.BodyBytes() != 3*PageBytes {
		t.Fatalf("a good checkpoint: %v, %d body bytes", err, ok.BodyBytes())
	}
	for name, edit := range map[string]func(*Checkpoint){
		"over the limit":    func(c *Checkpoint) { c.MemoryBytes = 5 * PageBytes },
		"not whole pages":   func(c *Checkpoint) { c.MemoryBytes = 4*PageBytes - 1 },
		"no memory":         func(c *Checkpoint) { c.MemoryBytes = 0 },
		"out of order":      func(c *Checkpoint) { c.Extents = []Extent{{2 * PageBytes, PageBytes}, {0, PageBytes}} },
		"touching":          func(c *Checkpoint) { c.Extents = []Extent{{0, PageBytes}, {PageBytes, PageBytes}} },
		"past the memory":   func(c *Checkpoint) { c.Extents = []Extent{{3 * PageBytes, 2 * PageBytes}} },
		"negative":          func(c *Checkpoint) { c.Extents = []Extent{{0, -PageBytes}} },
		"a partial page":    func(c *Checkpoint) { c.Extents = []Extent{{0, 100}} },
		"an unknown type":   func(c *Checkpoint) { c.Globals[0].Type = "v128" },
		"an i32 too large":  func(c *Checkpoint) { c.Globals[0].Bits = 1 << 33 },
		"an overflowed end": func(c *Checkpoint) { c.Extents = []Extent{{PageBytes, 1<<63 - PageBytes}} },
	} {
		c := ok
		c.Extents = append([]Extent(nil), ok.Extents...)
		c.Globals = append([]Global(nil), ok.Globals...)
		edit(&c)
		if err := c.Check(4 * PageBytes); !errors.Is(err, ErrCheckpoint) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// The guests' display() keeps at most MaxDisplays items, which the parent keeps.
func TestDisplaysSourceBound(t *testing.T) {
	if want := fmt.Sprintf("MAX = %d ", MaxDisplays); !strings.Contains(DisplaysSource(), want) {
		t.Fatalf("displays.py does not say %q", want)
	}
	_, runner, _ := strings.Cut(NativeRunner(), "\n") // (after its version line)
	if !strings.HasPrefix(runner, DisplaysSource()+ToolsSource()) {
		t.Fatal("the native runner does not begin with displays.py and tools.py")
	}
}

// The guests' sandcell.tools refuses a call the channel would refuse.
func TestToolsSourceBound(t *testing.T) {
	if want := fmt.Sprintf("MAX = %d << 20 ", MaxToolFrame>>20); !strings.Contains(ToolsSource(), want) {
		t.Fatalf("tools.py does not say %q", want)
	}
}
