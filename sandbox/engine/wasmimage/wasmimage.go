// Package wasmimage reads and rewrites the parts of a WebAssembly module's binary form
// that a snapshot changes: its memory's initial size, its globals' initial values, its
// data segments and its exports. It is the format half of a snapshot (what Wizer
// does for wasmtime's command-line tool); sandbox/engine runs the module's
// initialisation and reads the values this package writes back.
//
// Only what a snapshot can faithfully reproduce is accepted: one defined memory (none
// imported, 32-bit, not shared), no start function, and only active data segments
// with constant offsets (no passive segments, no data count section, so no
// memory.init can re-apply a segment over the snapshot). Mutable globals must be
// exported so that their values can be read (CPython's __stack_pointer is exported
// by its link). Everything else (types, code, tables, custom sections) is copied
// byte for byte. The specification: https://webassembly.github.io/spec/core/binary/.
package wasmimage

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
)

// Section ids (binary/modules.html).
const (
	secCustom    = 0
	secImport    = 2
	secMemory    = 5
	secGlobal    = 6
	secExport    = 7
	secStart     = 8
	secData      = 11
	secDataCount = 12
)

// Value types of globals that a snapshot can set.
const (
	I32 byte = 0x7F
	I64 byte = 0x7E
	F32 byte = 0x7D
	F64 byte = 0x7C
)

// PageSize is the size of a WebAssembly memory page in bytes.
const PageSize = 65536

// ErrUnsupported is wrapped by Parse for a module this package cannot snapshot.
var ErrUnsupported = errors.New("wasmimage: module cannot be snapshotted")

// Global is a global the module defines.
type Global struct {
	// Index is the global's index (imported globals first).
	Index uint32
	// Type is I32, I64, F32 or F64.
	Type byte
	// Mutable is true for a mutable global.
	Mutable bool
	// Export is the first name the global is exported under, or "".
	Export string
}

// Module is a parsed module: its sections, in order, and what a snapshot needs.
type Module struct {
	sections []section
	globals  []Global
	// MinPages and MaxPages are the memory's limits in pages (MaxPages < 0: none).
	MinPages, MaxPages int64
}

type section struct {
	id   byte
	body []byte
	// For the global section: where each init expression is in body.
	inits [][2]int
}

// Parse reads wasm. Errors wrap ErrUnsupported for a module outside what a snapshot
// can reproduce, and describe malformed input otherwise.
func Parse(wasm []byte) (*Module, error) {
	if len(wasm) < 8 || !bytes.Equal(wasm[:8], []byte{0, 'a', 's', 'm', 1, 0, 0, 0}) {
		return nil, errors.New("wasmimage: not a WebAssembly module (version 1)")
	}
	m := &Module{MaxPages: -1}
	r := &reader{b: wasm, off: 8}
	var importedGlobals uint32
	memories := 0
	exports := map[uint32]string{}
	seen := map[byte]bool{}
	for r.off < len(r.b) {
		id := r.byte()
		size := r.u32()
		if r.err != nil || int(size) > len(r.b)-r.off {
			return nil, fmt.Errorf("wasmimage: section %d: %w", id, errTruncated)
		}
		if id != secCustom && seen[id] {
			return nil, fmt.Errorf("wasmimage: section %d appears twice", id)
		}
		seen[id] = true
		s := section{id: id, body: r.b[r.off : r.off+int(size)]}
		r.off += int(size)
		sr := &reader{b: s.body}
		switch id {
		case secImport:
			for n := sr.u32(); n > 0 && sr.err == nil; n-- {
				sr.name()
				sr.name()
				switch kind := sr.byte(); kind {
				case 0: // function
					sr.u32()
				case 1: // table
					sr.byte()
					sr.limits()
				case 2:
					return nil, fmt.Errorf("%w: it imports its memory", ErrUnsupported)
				case 3:
					sr.byte()
					sr.byte()
					importedGlobals++
				case 4: // tag
					sr.byte()
					sr.u32()
				default:
					return nil, fmt.Errorf("wasmimage: import kind %d", kind)
				}
			}
		case secMemory:
			for n := sr.u32(); n > 0 && sr.err == nil; n-- {
				memories++
				flags := sr.byte()
				if flags > 1 {
					return nil, fmt.Errorf("%w: its memory is shared or 64-bit (limits flags %d)", ErrUnsupported, flags)
				}
				m.MinPages = int64(sr.u32())
				if flags == 1 {
					m.MaxPages = int64(sr.u32())
				}
				// A 32-bit memory has at most 65536 pages (4 GiB); a maximum below
				// the minimum is invalid (found by FuzzParse).
				if m.MinPages > 65536 || m.MaxPages > 65536 || (m.MaxPages >= 0 && m.MaxPages < m.MinPages) {
					return nil, fmt.Errorf("wasmimage: memory limits of %d to %d pages", m.MinPages, m.MaxPages)
				}
			}
		case secGlobal:
			for i, n := uint32(0), sr.u32(); i < n && sr.err == nil; i++ {
				g := Global{Index: importedGlobals + i, Type: sr.byte(), Mutable: sr.byte() == 1}
				start := sr.off
				if err := sr.constExpr(); err != nil {
					return nil, err
				}
				s.inits = append(s.inits, [2]int{start, sr.off})
				m.globals = append(m.globals, g)
			}
		case secExport:
			for n := sr.u32(); n > 0 && sr.err == nil; n-- {
				name := sr.name()
				kind, idx := sr.byte(), sr.u32()
				if _, seen := exports[idx]; kind == 3 && !seen {
					exports[idx] = name
				}
			}
		case secStart:
			return nil, fmt.Errorf("%w: it has a start function", ErrUnsupported)
		case secDataCount:
			return nil, fmt.Errorf("%w: it has a data count section (passive segments, memory.init)", ErrUnsupported)
		case secData:
			for n := sr.u32(); n > 0 && sr.err == nil; n-- {
				if flags := sr.u32(); flags != 0 {
					return nil, fmt.Errorf("%w: a data segment is passive or names a memory (flags %d)", ErrUnsupported, flags)
				}
				if op := sr.byte(); op != 0x41 {
					return nil, fmt.Errorf("%w: a data segment's offset is not an i32.const", ErrUnsupported)
				}
				sr.s32()
				if sr.byte() != 0x0B {
					return nil, fmt.Errorf("%w: a data segment's offset is not a constant", ErrUnsupported)
				}
				sr.bytes()
			}
		}
		if sr.err != nil {
			return nil, fmt.Errorf("wasmimage: section %d: %w", id, sr.err)
		}
		m.sections = append(m.sections, s)
	}
	if memories != 1 {
		return nil, fmt.Errorf("%w: it defines %d memories, not one", ErrUnsupported, memories)
	}
	for i := range m.globals {
		m.globals[i].Export = exports[m.globals[i].Index]
		if g := m.globals[i]; g.Mutable && g.Export == "" {
			return nil, fmt.Errorf("%w: its mutable global %d is not exported, so its value cannot be read", ErrUnsupported, g.Index)
		}
		if t := m.globals[i].Type; m.globals[i].Mutable && t != I32 && t != I64 && t != F32 && t != F64 {
			return nil, fmt.Errorf("%w: its mutable global %d has type 0x%x", ErrUnsupported, m.globals[i].Index, t)
		}
	}
	return m, nil
}

// Globals returns the globals the module defines, in index order.
func (m *Module) Globals() []Global { return append([]Global(nil), m.globals...) }

// Image is the state a snapshot writes back.
type Image struct {
	// Memory is the whole linear memory (a multiple of PageSize bytes).
	Memory []byte
	// Globals holds the bits of each mutable global by index (an f32 or f64 as its
	// IEEE 754 bits, an i32 zero-extended).
	Globals map[uint32]uint64
	// DropExports are export names the snapshot no longer offers (its
	// initialisation functions, which must not run twice).
	DropExports []string
}

// zeroGap is the run of zero bytes that ends a data segment: shorter runs are kept
// inside the segment (a segment's header costs a few bytes; a gap, its length).
const zeroGap = 64

// Write returns the module with img applied: the memory's minimum is the image's
// size, every mutable global starts with the image's value, the data segments are
// the image's non-zero bytes, and img.DropExports are gone.
func (m *Module) Write(img Image) ([]byte, error) {
	if len(img.Memory)%PageSize != 0 {
		return nil, errors.New("wasmimage: memory is not a whole number of pages")
	}
	pages := int64(len(img.Memory) / PageSize)
	if pages < m.MinPages || (m.MaxPages >= 0 && pages > m.MaxPages) || pages > 65536 {
		return nil, fmt.Errorf("wasmimage: memory of %d pages is outside the module's limits", pages)
	}
	for _, g := range m.globals {
		if _, ok := img.Globals[g.Index]; g.Mutable && !ok {
			return nil, fmt.Errorf("wasmimage: no value for mutable global %d (%s)", g.Index, g.Export)
		}
	}
	out := []byte{0, 'a', 's', 'm', 1, 0, 0, 0}
	for _, s := range m.sections {
		body := s.body
		switch s.id {
		case secMemory:
			body = appendU32(nil, 1)
			if m.MaxPages >= 0 {
				body = append(body, 1)
				body = appendU32(body, uint32(pages))
				body = appendU32(body, uint32(m.MaxPages))
			} else {
				body = append(body, 0)
				body = appendU32(body, uint32(pages))
			}
		case secGlobal:
			body = m.writeGlobals(s, img.Globals)
		case secExport:
			body = dropExports(s.body, img.DropExports)
		case secData:
			body = dataSegments(img.Memory)
		}
		out = append(out, s.id)
		out = appendU32(out, uint32(len(body)))
		out = append(out, body...)
	}
	return out, nil
}

func (m *Module) writeGlobals(s section, vals map[uint32]uint64) []byte {
	var body []byte
	last := 0
	for i, span := range s.inits {
		g := m.globals[i]
		if !g.Mutable {
			continue
		}
		body = append(body, s.body[last:span[0]]...)
		v := vals[g.Index]
		switch g.Type {
		case I32:
			body = append(body, 0x41)
			body = appendS64(body, int64(int32(uint32(v))))
		case I64:
			body = append(body, 0x42)
			body = appendS64(body, int64(v))
		case F32:
			body = append(body, 0x43)
			body = binary.LittleEndian.AppendUint32(body, uint32(v))
		case F64:
			body = append(body, 0x44)
			body = binary.LittleEndian.AppendUint64(body, v)
		}
		body = append(body, 0x0B)
		last = span[1]
	}
	return append(body, s.body[last:]...)
}

// dropExports is an export section without the exports named in drop.
func dropExports(body []byte, drop []string) []byte {
	r := &reader{b: body}
	var kept [][]byte
	for n := r.u32(); n > 0 && r.err == nil; n-- {
		start := r.off
		name := r.name()
		r.byte()
		r.u32()
		if !slices.Contains(drop, name) {
			kept = append(kept, body[start:r.off])
		}
	}
	out := appendU32(nil, uint32(len(kept)))
	for _, e := range kept {
		out = append(out, e...)
	}
	return out
}

// dataSegments is a data section holding mem's non-zero bytes as active segments.
func dataSegments(mem []byte) []byte {
	type seg struct{ start, end int }
	var segs []seg
	for i := 0; i < len(mem); {
		for i < len(mem) && mem[i] == 0 {
			i++
		}
		if i == len(mem) {
			break
		}
		start, zeros := i, 0
		for ; i < len(mem) && zeros < zeroGap; i++ {
			if mem[i] == 0 {
				zeros++
			} else {
				zeros = 0
			}
		}
		segs = append(segs, seg{start, i - zeros})
	}
	out := appendU32(nil, uint32(len(segs)))
	for _, s := range segs {
		out = append(out, 0, 0x41)
		out = appendS64(out, int64(int32(uint32(s.start))))
		out = append(out, 0x0B)
		out = appendU32(out, uint32(s.end-s.start))
		out = append(out, mem[s.start:s.end]...)
	}
	return out
}

var errTruncated = errors.New("truncated or malformed")

// reader decodes the binary format's primitives; the first error sticks.
type reader struct {
	b   []byte
	off int
	err error
}

func (r *reader) byte() byte {
	if r.err != nil || r.off >= len(r.b) {
		r.err = errTruncated
		return 0
	}
	c := r.b[r.off]
	r.off++
	return c
}

func (r *reader) u32() uint32 {
	v, n := binary.Uvarint(r.rest())
	if r.err != nil || n <= 0 || n > 5 || v > math.MaxUint32 {
		r.err = errTruncated
		return 0
	}
	r.off += n
	return uint32(v)
}

func (r *reader) s32() int32 {
	v := r.sleb(5)
	if v < math.MinInt32 || v > math.MaxInt32 {
		r.err = errTruncated
	}
	return int32(v)
}

func (r *reader) sleb(max int) int64 {
	var v int64
	var shift uint
	for i := 0; i < max; i++ {
		c := r.byte()
		if r.err != nil {
			return 0
		}
		v |= int64(c&0x7F) << shift
		shift += 7
		if c&0x80 == 0 {
			if shift < 64 && c&0x40 != 0 {
				v |= -1 << shift
			}
			return v
		}
	}
	r.err = errTruncated
	return 0
}

func (r *reader) rest() []byte {
	if r.off > len(r.b) {
		return nil
	}
	return r.b[r.off:]
}

func (r *reader) bytes() []byte {
	n := r.u32()
	if r.err != nil || int(n) > len(r.b)-r.off {
		r.err = errTruncated
		return nil
	}
	b := r.b[r.off : r.off+int(n)]
	r.off += int(n)
	return b
}

func (r *reader) name() string { return string(r.bytes()) }

func (r *reader) limits() {
	if flags := r.byte(); flags&1 != 0 {
		r.u32()
		r.u32()
	} else {
		r.u32()
	}
}

// constExpr skips a constant expression: one constant or global.get, then end.
func (r *reader) constExpr() error {
	switch op := r.byte(); op {
	case 0x41:
		r.s32()
	case 0x42:
		r.sleb(10)
	case 0x43:
		r.off += 4
	case 0x44:
		r.off += 8
	case 0x23, 0xD2: // global.get, ref.func
		r.u32()
	case 0xD0: // ref.null
		r.byte()
	default:
		if r.err == nil {
			return fmt.Errorf("%w: a global's initializer uses opcode 0x%x", ErrUnsupported, op)
		}
	}
	if r.byte() != 0x0B {
		if r.err == nil {
			return fmt.Errorf("%w: a global's initializer is not a single constant", ErrUnsupported)
		}
	}
	if r.off > len(r.b) {
		r.err = errTruncated
	}
	return r.err
}

func appendU32(b []byte, v uint32) []byte { return binary.AppendUvarint(b, uint64(v)) }

func appendS64(b []byte, v int64) []byte {
	for {
		c := byte(v & 0x7F)
		v >>= 7
		if (v == 0 && c&0x40 == 0) || (v == -1 && c&0x40 != 0) {
			return append(b, c)
		}
		b = append(b, c|0x80)
	}
}
