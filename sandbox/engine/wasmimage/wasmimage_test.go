package wasmimage

import (
	"bytes"
	"errors"
	"testing"
)

// module assembles a module from (id, body) sections.
func module(sections ...[]byte) []byte {
	out := []byte{0, 'a', 's', 'm', 1, 0, 0, 0}
	for _, s := range sections {
		out = append(out, s[0])
		out = appendU32(out, uint32(len(s)-1))
		out = append(out, s[1:]...)
	}
	return out
}

func sec(id byte, body ...byte) []byte { return append([]byte{id}, body...) }

var (
	memory1    = sec(secMemory, 1, 1, 1, 4)                                            // min 1, max 4 pages
	globals    = sec(secGlobal, 2, I32, 1, 0x41, 0x10, 0x0B, I64, 0, 0x42, 0x07, 0x0B) // mut i32 = 16; const i64 = 7
	exportSP   = sec(secExport, 2, 2, 's', 'p', 3, 0, 4, 'i', 'n', 'i', 't', 0, 0)
	dataHello  = sec(secData, 1, 0, 0x41, 0x08, 0x0B, 5, 'h', 'e', 'l', 'l', 'o')
	customName = sec(secCustom, 4, 'n', 'o', 't', 'e', 'x')
)

func TestParseAndWrite(t *testing.T) {
	wasm := module(memory1, globals, exportSP, dataHello, customName)
	m, err := Parse(wasm)
	if err != nil {
		t.Fatal(err)
	}
	g := m.Globals()
	if len(g) != 2 || !g[0].Mutable || g[0].Export != "sp" || g[0].Type != I32 || g[1].Mutable || m.MinPages != 1 || m.MaxPages != 4 {
		t.Fatalf("%+v min %d max %d", g, m.MinPages, m.MaxPages)
	}
	mem := make([]byte, 2*PageSize)
	copy(mem[100:], "snap")
	copy(mem[PageSize+7:], "shot")
	out, err := m.Write(Image{Memory: mem, Globals: map[uint32]uint64{0: 0xFFFFFFF0}, DropExports: []string{"init"}})
	if err != nil {
		t.Fatal(err)
	}
	again, err := Parse(out)
	if err != nil {
		t.Fatalf("the snapshot does not parse: %v", err)
	}
	if again.MinPages != 2 || again.MaxPages != 4 {
		t.Errorf("memory limits %d..%d", again.MinPages, again.MaxPages)
	}
	// The mutable global starts at its value (i32 -16), the constant one is unchanged,
	// the export is gone, the data are the image's, the custom section is kept.
	for _, want := range [][]byte{
		{I32, 1, 0x41, 0x70, 0x0B, I64, 0, 0x42, 0x07, 0x0B},
		{0, 0x41, 0xE4, 0x00, 0x0B, 4, 's', 'n', 'a', 'p'}, // 100 as a signed LEB128
		{0, 0x41, 0x87, 0x80, 0x04, 0x0B, 4, 's', 'h', 'o', 't'},
		{'n', 'o', 't', 'e', 'x'},
	} {
		if !bytes.Contains(out, want) {
			t.Errorf("snapshot lacks % x", want)
		}
	}
	if bytes.Contains(out, []byte("init")) || bytes.Contains(out, []byte("hello")) {
		t.Error("the dropped export or the old data segment is still there")
	}
	if _, err := m.Write(Image{Memory: make([]byte, 5*PageSize), Globals: map[uint32]uint64{0: 1}}); err == nil {
		t.Error("an image beyond the memory's maximum was written")
	}
	if _, err := m.Write(Image{Memory: mem}); err == nil {
		t.Error("an image without the mutable global's value was written")
	}
}

func TestParseRefuses(t *testing.T) {
	for name, wasm := range map[string][]byte{
		"imported memory":      module(sec(secImport, 1, 1, 'm', 1, 'm', 2, 0, 1), globals, exportSP),
		"start function":       module(memory1, sec(secStart, 0)),
		"data count":           module(memory1, sec(secDataCount, 1)),
		"passive segment":      module(memory1, sec(secData, 1, 1, 1, 'x')),
		"unexported mutable":   module(memory1, globals),
		"shared memory":        module(sec(secMemory, 1, 3, 1, 4)),
		"two memories":         module(sec(secMemory, 2, 0, 1, 0, 1)),
		"non-constant offset":  module(memory1, sec(secData, 1, 0, 0x23, 0, 0x0B, 0)),
		"extended initializer": module(memory1, sec(secGlobal, 1, I32, 0, 0x41, 1, 0x41, 1, 0x6A, 0x0B)),
	} {
		if _, err := Parse(wasm); !errors.Is(err, ErrUnsupported) {
			t.Errorf("%s: %v", name, err)
		}
	}
	for name, wasm := range map[string][]byte{
		"not wasm":          []byte("\x7fELF\x02\x01\x01\x00"),
		"truncated section": module(memory1)[:10],
		"section twice":     module(sec(secMemory, 0), memory1),
		"overlong size":     append([]byte{0, 'a', 's', 'm', 1, 0, 0, 0, secMemory}, 0xFF, 0xFF, 0xFF, 0xFF, 0x0F),
	} {
		if _, err := Parse(wasm); err == nil || errors.Is(err, ErrUnsupported) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// FuzzParse: malformed modules are refused with an error, never a panic, and
// whatever parses can be written back and parses again.
func FuzzParse(f *testing.F) {
	f.Add(module(memory1, globals, exportSP, dataHello, customName))
	f.Add(module(memory1))
	// Found by this fuzzer: two memory sections, the first empty.
	f.Add([]byte("\x00asm\x01\x00\x00\x00\x05\x01\x00\x05\x04\x01\x01\x0e0"))
	f.Fuzz(func(t *testing.T, wasm []byte) {
		m, err := Parse(wasm)
		if err != nil {
			return
		}
		if m.MinPages > 65536 || m.MaxPages > 65536 {
			t.Fatalf("accepted memory limits of %d to %d pages", m.MinPages, m.MaxPages)
		}
		if m.MinPages > 1024 {
			return // a valid module, but too large a memory to write back here
		}
		vals := map[uint32]uint64{}
		for _, g := range m.Globals() {
			vals[g.Index] = 1
		}
		out, err := m.Write(Image{Memory: make([]byte, max(m.MinPages, 1)*PageSize), Globals: vals})
		if err != nil {
			return
		}
		if _, err := Parse(out); err != nil {
			t.Fatalf("a written snapshot does not parse: %v", err)
		}
	})
}
