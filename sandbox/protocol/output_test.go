package protocol

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"math/rand/v2"
	"runtime"
	"testing"
	"unicode/utf8"
)

// pieces returns b written into an Output in writes of random sizes from 1 to most
// bytes, so pieces and writes end anywhere (inside runes too).
func pieces(b []byte, limit int64, most int, rng *rand.Rand) *Output {
	o := NewOutput(limit)
	for rest := b; len(rest) > 0; {
		n := min(len(rest), 1+rng.IntN(most))
		o.Write(rest[:n])
		rest = rest[n:]
	}
	return o
}

// An Output holds what was written, in pieces that are never moved once past the
// first 64 KiB, with at most an eighth (or 64 KiB) more room than bytes, none past
// its limit.
func TestOutputPieces(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, size := range []int{0, 1, 100, 64 << 10, 64<<10 + 1, 1 << 20, 8<<20 + 12345} {
		data := make([]byte, size)
		for i := range data {
			data[i] = byte(rng.IntN(256))
		}
		for _, limit := range []int64{0, int64(size), int64(size) + 1000} {
			o := pieces(data, limit, 40<<10, rng)
			if o.Len() != size || !bytes.Equal(o.Bytes(), data) && size > 0 {
				t.Fatalf("%d bytes: got %d back", size, o.Len())
			}
			held := 0
			for i := range o.NumPieces() {
				held += cap(o.Piece(i))
			}
			if held > o.Cap() || held < o.Cap()-3*o.NumPieces() { // a piece ended before a rune holds its room
				t.Fatalf("%d bytes: Cap %d, the pieces hold %d", size, o.Cap(), held)
			}
			if slack := o.Cap() - size; slack > max(size/8, 64<<10) {
				t.Errorf("%d bytes (limit %d): %d pieces hold %d bytes more", size, limit, o.NumPieces(), slack)
			}
			if limit == int64(size) && size > 64<<10 && o.Cap() > size+3*o.NumPieces() {
				t.Errorf("%d bytes at their limit: %d held in %d pieces", size, o.Cap(), o.NumPieces())
			}
			if size == 8<<20+12345 && o.NumPieces() > 64 {
				t.Errorf("%d bytes in %d pieces", size, o.NumPieces())
			}
		}
	}
	// Text written in whole runes is cut between pieces only between runes.
	text := bytes.Repeat([]byte("aé✓😀"), 1<<20/10*8)
	for _, limit := range []int64{0, int64(len(text))} {
		o := NewOutput(limit)
		for rest := text; len(rest) > 0; {
			n := min(len(rest), 10*(1+rng.IntN(4000)))
			o.Write(rest[:n])
			rest = rest[n:]
		}
		for i := range o.NumPieces() {
			if !utf8.Valid(o.Piece(i)) {
				t.Fatalf("piece %d of %d cuts a rune", i, o.NumPieces())
			}
		}
		if !bytes.Equal(o.Bytes(), text) || o.Cap() > len(text)*9/8 {
			t.Fatalf("%d bytes of text held in %d", len(text), o.Cap())
		}
	}
	// A piece, once handed out, keeps its bytes: later writes go after them.
	o := NewOutput(0)
	o.Write(bytes.Repeat([]byte("a"), 100<<10))
	p := o.Piece(o.NumPieces() - 1)
	o.Write(bytes.Repeat([]byte("b"), 1<<20))
	if !bytes.Equal(p, bytes.Repeat([]byte("a"), len(p))) {
		t.Fatal("a piece changed under its reader")
	}
}

// The parts an Output's text is walked in are cut between runes, and say whether it
// is UTF-8, however its pieces cut it.
func TestOutputText(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	alphabet := [][]byte{[]byte("a"), []byte("é"), []byte("✓"), []byte("😀"), {0xff}, {0xe2, 0x9c}, {0x80}, {0xf0, 0x9f, 0x98}}
	for trial := 0; trial < 5000; trial++ {
		var b []byte
		for n := rng.IntN(40); n > 0; n-- {
			b = append(b, alphabet[rng.IntN(4)]...) // text
		}
		if trial%2 == 1 {
			b = append(b, alphabet[rng.IntN(len(alphabet))]...) // perhaps not
			b = append(b, alphabet[rng.IntN(len(alphabet))]...)
		}
		o := &Output{}
		for rest := b; len(rest) > 0; { // pieces of 1 to 5 bytes, exactly
			n := min(len(rest), 1+rng.IntN(5))
			o.pieces = append(o.pieces, rest[:n:n])
			o.n += n
			rest = rest[n:]
		}
		var joined []byte
		o.eachText(func(part []byte) bool {
			if utf8.Valid(b) && !utf8.Valid(part) {
				t.Fatalf("%q: part %q cut inside a rune", b, part)
			}
			joined = append(joined, part...)
			return true
		})
		if !bytes.Equal(joined, b) || o.ValidUTF8() != utf8.Valid(b) {
			t.Fatalf("%q in %q: walked as %q, valid %v", b, o.pieces, joined, o.ValidUTF8())
		}
		if utf8.Valid(b) {
			var got bytes.Buffer
			w := bufio.NewWriter(&got)
			o.writeJSONText(w)
			w.Flush()
			want := must(json.Marshal(string(b)))
			if !bytes.Equal(got.Bytes(), want[1:len(want)-1]) {
				t.Fatalf("%q: %s, want %s", b, got.Bytes(), want)
			}
		}
	}
}

// Text is escaped exactly as encoding/json escapes a string: every byte alone, every
// rune that JSON or HTML treats apart, and random text.
func TestJSONStringAsEncodingJSON(t *testing.T) {
	var cases []string
	for c := 0; c < 256; c++ {
		cases = append(cases, string([]byte{byte(c)}), "x"+string([]byte{byte(c)})+"y")
	}
	cases = append(cases, "\u2028\u2029", "<a href=\"x\">&amp;</a>", "\x7f\u00a0\ufeff\U0010ffff", "\xed\xa0\x80")
	rng := rand.New(rand.NewPCG(5, 6))
	for i := 0; i < 2000; i++ {
		b := make([]byte, rng.IntN(64))
		for j := range b {
			b[j] = "a\"\\<>&\n\t\x00\x1f\xe2\x80\xa8\xc3\xa9"[rng.IntN(15)]
		}
		cases = append(cases, string(b))
	}
	for _, s := range cases {
		var got bytes.Buffer
		w := bufio.NewWriter(&got)
		WriteJSONText(w, []byte(s))
		w.Flush()
		want := must(json.Marshal(s))
		if !bytes.Equal(got.Bytes(), want[1:len(want)-1]) {
			t.Errorf("%q: %s, want %s", s, got.Bytes(), want)
		}
	}
}

// A result whose output is held in pieces is written as the same result in one
// piece: text cut inside runes, escapes, binary and empty output, both members.
func TestResultPiecesJSON(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	long := bytes.Repeat([]byte("é\x01\"<\n✓😀"), 30000)
	for _, out := range [][]byte{long, append(bytes.Clone(long), 0xff), {0, 0xff, 0xfe, 'x'}, nil, []byte("\u2028")} {
		one := Result{Reason: Exited, ExitCode: 3, Stdout: out, Stderr: []byte("e\xff"), Diagnostics: []string{"d"}}
		split := one
		split.Stdout, split.Stderr = nil, nil
		split.StdoutPieces, split.StderrPieces = pieces(out, 0, 70<<10, rng), pieces(one.Stderr, 0, 1, rng)
		var a, b bytes.Buffer
		if err := one.WriteJSON(&a); err != nil {
			t.Fatal(err)
		}
		if err := split.WriteJSON(&b); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(a.Bytes(), b.Bytes()) {
			t.Fatalf("in pieces %.300s\nin one %.300s", b.Bytes(), a.Bytes())
		}
		var back Result
		if err := json.Unmarshal(must(json.Marshal(split)), &back); err != nil || !bytes.Equal(back.Stdout, out) {
			t.Fatalf("MarshalJSON of pieces: %v", err)
		}
		if j := split.Joined(); !bytes.Equal(j.Stdout, out) || j.StdoutPieces != nil || string(j.Stderr) != "e\xff" {
			t.Fatalf("Joined: %d bytes", len(j.Stdout))
		}
	}
}

// Writing a result allocates a small buffer, not a copy (or an encoding) of its
// output: 8 MiB of text to escape, in pieces, cost 32 KiB and a few small values.
func TestResultWriteJSONAllocates(t *testing.T) {
	text := bytes.Repeat([]byte("line é \"<&>\" \t✓\n"), (8<<20)/20)
	res := Result{Reason: Exited, StdoutPieces: pieces(text, 0, 32<<10, rand.New(rand.NewPCG(9, 10))),
		StderrPieces: OutputOf([]byte{0xff, 0})}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	if err := res.WriteJSON(io.Discard); err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	allocated := after.TotalAlloc - before.TotalAlloc
	t.Logf("%d bytes of output written as JSON: %d bytes allocated", len(text), allocated)
	if allocated > 64<<10 {
		t.Fatalf("writing %d bytes of output allocated %d bytes", len(text), allocated)
	}
}
