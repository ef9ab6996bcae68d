package protocol

import (
	"bufio"
	"unicode/utf8"
)

// Output is one stream of output held in pieces, in the order it was written. It
// grows without moving what it holds: a slice grown by appending copies its bytes
// about five times over (each growth adds a quarter) and holds the old copy beside
// the new one while it grows, so a daemon that kept a run's output that way used up
// to three times its size. The first piece grows by doubling up to 64 KiB (small
// output is held in one piece, moved as it grows); each later piece is an eighth of
// what the Output holds, from 64 KiB to 4 MiB, and never reaches past max. What it
// holds beyond its bytes is at most an eighth of them, or 64 KiB, and the few bytes
// a piece leaves unused rather than cut a rune.
//
// An Output is not safe for concurrent use while it is written (a reader may read
// the bytes it was given while later ones are written); once written, any number of
// readers may read it.
type Output struct {
	pieces [][]byte
	n      int // bytes written
	held   int // bytes allocated (the pieces' capacities)
	max    int // the most bytes it will be given (its stream's cap); 0: unknown
}

// Bounds of an Output's pieces.
const (
	firstPiece = 64 << 10 // the first piece grows by doubling up to this
	minPiece   = 64 << 10
	maxPiece   = 4 << 20
)

// NewOutput returns an empty Output for a stream that will be given at most limit
// bytes (its cap; 0 or less: unknown), so that its last piece ends there.
func NewOutput(limit int64) *Output {
	return &Output{max: int(max(min(limit, 1<<62), 0))}
}

// OutputOf returns an Output holding b as its one piece (not a copy; what is written
// to it later goes into pieces of its own, never into b's spare capacity).
func OutputOf(b []byte) *Output {
	if len(b) == 0 {
		return &Output{}
	}
	return &Output{pieces: [][]byte{b[:len(b):len(b)]}, n: len(b), held: cap(b)}
}

// Write appends a copy of b. It never fails (io.Writer).
func (o *Output) Write(b []byte) (int, error) {
	for rest := b; len(rest) > 0; {
		_, _, n := o.Extend(rest)
		rest = rest[n:]
	}
	return len(b), nil
}

// Extend appends as much of b as goes into one piece (at least a byte, when b is not
// empty) and says where it went: the piece's index, the offset in it where the
// bytes begin, and how many bytes of b were taken. A caller that keeps the pieces
// of what it writes calls it until b is taken. A piece ends where a rune begins
// whenever the rune's bytes come in one call, so text is cut between pieces only
// where a write cut it.
func (o *Output) Extend(b []byte) (piece, off, n int) {
	last := len(o.pieces) - 1
	if len(b) == 0 {
		return max(last, 0), 0, 0
	}
	if last == 0 {
		if p := o.pieces[0]; len(p)+len(b) > cap(p) && cap(p) < firstPiece {
			// The first piece, still small, grows by doubling (it moves).
			size := min(max(2*cap(p), len(p)+len(b)), firstPiece)
			if o.max > o.n {
				size = min(size, o.max)
			}
			if size > cap(p) {
				o.pieces[0] = append(make([]byte, 0, size), p...)
				o.held += size - cap(p)
			}
		}
	}
	if last >= 0 {
		p := o.pieces[last]
		if room := cap(p) - len(p); room > 0 {
			if n = runeCut(b, room); n > 0 {
				o.pieces[last] = append(p, b[:n]...)
				o.n += n
				return last, len(p), n
			}
			// Only the beginning of a rune would fit: the piece ends before it.
			o.pieces[last] = p[:len(p):len(p)]
		}
	}
	size := min(max(o.n/8, minPiece), maxPiece)
	if last < 0 {
		size = min(len(b), firstPiece)
	}
	if o.max > o.n {
		size = min(size, o.max-o.n)
	}
	if n = runeCut(b, size); n == 0 {
		n = min(len(b), size) // a piece too short for the rune: at the limit
	}
	o.pieces = append(o.pieces, append(make([]byte, 0, size), b[:n]...))
	o.held += size
	o.n += n
	return last + 1, 0, n
}

// runeCut is how many bytes of b go into room bytes: all of b when they fit, else
// room, moved back to where a rune begins when one begins within the last bytes
// that would be taken and would be cut (0 when it is b's first), so that it goes
// whole into the next piece.
func runeCut(b []byte, room int) int {
	if len(b) <= room {
		return len(b)
	}
	for n := room; n >= 0 && n > room-utf8.UTFMax; n-- {
		if utf8.RuneStart(b[n]) {
			return n
		}
	}
	return room
}

// Len is the number of bytes written.
func (o *Output) Len() int {
	if o == nil {
		return 0
	}
	return o.n
}

// Cap is the number of bytes the Output holds in memory: its bytes, the room left in
// its last piece and what earlier pieces left unused.
func (o *Output) Cap() int {
	if o == nil {
		return 0
	}
	return o.held
}

// NumPieces is the number of pieces.
func (o *Output) NumPieces() int {
	if o == nil {
		return 0
	}
	return len(o.pieces)
}

// Piece returns piece i itself (not a copy).
func (o *Output) Piece(i int) []byte { return o.pieces[i] }

// Bytes returns the output in one slice: its one piece itself, or the pieces joined
// (a copy) when there are several.
func (o *Output) Bytes() []byte {
	switch o.NumPieces() {
	case 0:
		return nil
	case 1:
		return o.pieces[0]
	}
	b := make([]byte, 0, o.n)
	for _, p := range o.pieces {
		b = append(b, p...)
	}
	return b
}

// eachText calls f with o's bytes, in order, in parts that begin and end between
// runes wherever the bytes are UTF-8: the pieces, except that a rune cut between two
// pieces is given whole, on its own (from a small buffer). Each byte is given once,
// so the output is UTF-8 if and only if every part is. It returns false as soon as
// f does.
func (o *Output) eachText(f func([]byte) bool) bool {
	var carry [utf8.UTFMax]byte
	nc := 0 // bytes of carry: a rune begun at the end of the last piece
	for _, p := range o.pieces {
		if nc > 0 {
			for len(p) > 0 && nc < utf8.UTFMax && !utf8.FullRune(carry[:nc]) && !utf8.RuneStart(p[0]) {
				carry[nc] = p[0]
				nc++
				p = p[1:]
			}
			if len(p) == 0 && nc < utf8.UTFMax && !utf8.FullRune(carry[:nc]) {
				continue // the rune goes on in the next piece
			}
			if !f(carry[:nc]) {
				return false
			}
			nc = 0
		}
		// A rune begun in the last bytes of p and not ended there waits for the
		// next piece.
		cut := len(p)
		for i := len(p) - 1; i >= 0 && i >= len(p)-(utf8.UTFMax-1); i-- {
			if utf8.RuneStart(p[i]) {
				if !utf8.FullRune(p[i:]) {
					cut = i
				}
				break
			}
		}
		if cut > 0 && !f(p[:cut]) {
			return false
		}
		nc = copy(carry[:], p[cut:])
	}
	return nc == 0 || f(carry[:nc])
}

// ValidUTF8 reports whether the output is UTF-8 text.
func (o *Output) ValidUTF8() bool { return o.eachText(utf8.Valid) }

// writeJSONText writes the output, which is UTF-8, as the inside of a JSON string,
// escaped as encoding/json escapes it, without a copy of it.
func (o *Output) writeJSONText(w *bufio.Writer) {
	o.eachText(func(b []byte) bool {
		WriteJSONText(w, b)
		return true
	})
}

// WriteJSONText writes s as the inside of a JSON string, as encoding/json's Marshal
// writes a string (HTML characters, U+2028 and U+2029 escaped; a byte that is not
// UTF-8 as U+FFFD), from s itself: nothing is allocated, where Marshal needs a
// string copy of s and returns another copy, escaped.
func WriteJSONText(w *bufio.Writer, s []byte) {
	const hex = "0123456789abcdef"
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			w.Write(s[start:i])
			switch c {
			case '"', '\\':
				w.WriteByte('\\')
				w.WriteByte(c)
			case '\b':
				w.WriteString(`\b`)
			case '\f':
				w.WriteString(`\f`)
			case '\n':
				w.WriteString(`\n`)
			case '\r':
				w.WriteString(`\r`)
			case '\t':
				w.WriteString(`\t`)
			default:
				w.WriteString(`\u00`)
				w.WriteByte(hex[c>>4])
				w.WriteByte(hex[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRune(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			w.Write(s[start:i])
			w.WriteString("\ufffd")
		case r == '\u2028' || r == '\u2029':
			w.Write(s[start:i])
			w.WriteString(`\u202`)
			w.WriteByte(hex[r&0xf])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	w.Write(s[start:])
}
