package sandbox_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandcell/sandcell/sandbox"
	"github.com/sandcell/sandcell/sandbox/protocol"
)

// onePixelPNG is Python that makes a 1x1 PNG with zlib and struct alone (the wasm
// guest has no imaging library), as a _repr_png_ would return it.
const onePixelPNG = `import struct, zlib
def _chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
PNG = (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)) +
       _chunk(b"IDAT", zlib.compress(b"\x00\xff\x00\x00")) + _chunk(b"IEND", b""))
`

// The wasm backend's display(): as the native backend's (the same source), each
// item a checked workspace file, in a run and in each cell of a session; what a
// program names in its own /tmp in place of its displays is checked as any.
func TestWasmDisplays(t *testing.T) {
	t.Parallel()
	res, ws := run(t, onePixelPNG+`
class Table:
    def _repr_html_(self): return "<table><tr><td>1</td></tr></table>"
    def __repr__(self): return "Table(1)"
class Dot:
    def _repr_png_(self): return PNG
display(Table(), 42, Dot())
`, nil)
	wantExit(t, res, 0)
	want := []struct{ typ, text string }{{"text/html", "<table><tr><td>1</td></tr></table>"}, {"text/plain", "Table(1)"},
		{"text/plain", "42"}, {"image/png", ""}}
	if len(res.Displays) != len(want) {
		t.Fatalf("displays %+v, diagnostics %v, stderr %s", res.Displays, res.Diagnostics, res.Stderr)
	}
	for i, d := range res.Displays {
		if d.Type != want[i].typ || d.Text != want[i].text || !strings.HasPrefix(d.Path, "displays/") {
			t.Fatalf("display %d: %+v", i, d)
		}
		if _, err := os.Stat(filepath.Join(ws, d.Path)); err != nil {
			t.Fatalf("display %d's file: %v", i, err)
		}
	}
	if png := res.Displays[3]; png.Width != 1 || png.Height != 1 {
		t.Fatalf("the PNG: %+v", png)
	}

	// Forged: what the program leaves where its displays would be is checked.
	res, _ = run(t, `import json, os
os.makedirs("/ws/displays", exist_ok=True)
open("/ws/displays/ok.txt", "w").write("fine")
items = [{"type": "text/plain", "path": "../etc/passwd"}, {"type": "image/png", "path": "displays/ok.txt"},
         {"type": "text/plain", "path": "displays/ok.txt"}]
json.dump(items, open("/tmp/.sandcell-displays", "w"))
`, nil)
	wantExit(t, res, 0)
	if len(res.Displays) != 1 || res.Displays[0].Text != "fine" || len(res.Diagnostics) != 2 {
		t.Fatalf("forged displays: %+v\n%v", res.Displays, res.Diagnostics)
	}

	// A session: each cell's own, none overwriting an earlier cell's file.
	ss, ws := openSession(t)
	c1 := cell(t, ss, `display("first")`, nil)
	c2 := cell(t, ss, `display("second")`, nil)
	c3 := cell(t, ss, `x = 1`, nil)
	if len(c1.Displays) != 1 || len(c2.Displays) != 1 || len(c3.Displays) != 0 || c1.Displays[0].Path == c2.Displays[0].Path {
		t.Fatalf("cells' displays: %+v %+v %+v (%v %v)", c1.Displays, c2.Displays, c3.Displays, c1.Diagnostics, c2.Diagnostics)
	}
	// A cell rolled back (its wall clock) reports none (it did not end), and the
	// file it wrote stays: the next cell's are named anew, never over it.
	c4 := ss4(t, ss, `display("fourth")
while True: pass`)
	c5 := cell(t, ss, `display("fifth")`, nil)
	fourth := ""
	ents, _ := os.ReadDir(filepath.Join(ws, "displays"))
	for _, e := range ents {
		if b, _ := os.ReadFile(filepath.Join(ws, "displays", e.Name())); string(b) == "'fourth'" {
			fourth = "displays/" + e.Name()
		}
	}
	if len(c4.Displays) != 0 || len(c5.Displays) != 1 || fourth == "" || fourth == c5.Displays[0].Path {
		t.Fatalf("rolled back, then a cell: %+v %+v, the rolled-back cell's file %q", c4.Displays, c5.Displays, fourth)
	}
	// What a cell leaves where the list goes is gone at the next: a link the
	// guest planted does not take the next cell's list anywhere.
	cell(t, ss, `import os; os.symlink("../ws/data.txt", "/tmp/.sandcell-displays")`, nil)
	c7 := cell(t, ss, `display("seventh")`, nil)
	if len(c7.Displays) != 1 {
		t.Fatalf("after a planted link: %+v %v", c7.Displays, c7.Diagnostics)
	}
	if _, err := os.Stat(filepath.Join(ws, "data.txt")); err == nil {
		t.Fatal("the list was written through the planted link")
	}
	for _, c := range []struct{ path, want string }{{c1.Displays[0].Path, "'first'"}, {c2.Displays[0].Path, "'second'"},
		{fourth, "'fourth'"}, {c5.Displays[0].Path, "'fifth'"}} {
		if b, err := os.ReadFile(filepath.Join(ws, c.path)); err != nil || string(b) != c.want {
			t.Fatalf("%s: %q %v", c.path, b, err)
		}
	}
}

// ss4 runs code as a cell under a 2 s wall clock, which it is to outlast.
func ss4(t *testing.T, ss *sandbox.Session, code string) sandbox.Cell {
	t.Helper()
	c := cell(t, ss, code, timeout(2*time.Second))
	if c.Reason != protocol.Timeout || !c.RolledBack {
		t.Fatalf("%q: %s, rolled back %v", code, c.Reason, c.RolledBack)
	}
	return c
}

// A program's own doing does not cost it its output or its first displays: items it
// put in the list itself, more displays than are kept.
func TestWasmDisplaysBounded(t *testing.T) {
	t.Parallel()
	res, _ := run(t, `import sys
display(1)
display.__self__.items.append(object())
sys.stdout.write("out")`, nil)
	wantExit(t, res, 0)
	if string(res.Stdout) != "out" || len(res.Displays) != 1 {
		t.Fatalf("a foreign item: %q %q %+v", res.Stdout, res.Stderr, res.Displays)
	}
	// A traceback through display() shows display's own lines, not the program's.
	res, _ = run(t, `class X:
    def _repr_html_(self): raise ValueError("bad")
display(X())`, nil)
	if res.ExitCode != 1 || !strings.Contains(string(res.Stderr), `File "<sandcell display>"`) ||
		!strings.Contains(string(res.Stderr), "ValueError: bad") || strings.Count(string(res.Stderr), "display(X())") != 1 {
		t.Fatalf("a failing _repr_html_: %d %q", res.ExitCode, res.Stderr)
	}
	res, _ = run(t, `for i in range(100): display(i)`, nil)
	wantExit(t, res, 0)
	if len(res.Displays) != protocol.MaxDisplays || len(res.Diagnostics) != 0 || !strings.Contains(string(res.Stderr), "more than 64 displays") {
		t.Fatalf("100 displays: %d kept, %v, %q", len(res.Displays), res.Diagnostics, res.Stderr)
	}
}
