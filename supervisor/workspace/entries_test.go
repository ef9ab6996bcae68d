package workspace

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"testing"
)

// Entries lists every name with each file's SHA-256, and refuses what no digest can
// stand for: a symbolic link, and a name that is not UTF-8 (JSON would show two such
// names as one, each byte that is not UTF-8 as U+FFFD).
func TestEntries(t *testing.T) {
	dir := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(dir, "pkg"), 0o755))
	must(os.WriteFile(filepath.Join(dir, "pkg", "m.py"), []byte("x = 1\n"), 0o644))
	w, err := Directory(dir, Quota{Bytes: math.MaxInt64, Files: math.MaxInt})
	must(err)
	got, err := w.Entries()
	if err != nil || len(got) != 2 || got[0] != (Entry{Path: "pkg", Type: "dir"}) || got[1].Path != "pkg/m.py" ||
		got[1].Size != 6 || got[1].SHA256 != "9e26bf369911c45c243c684147b23fc9e1dcfcf257d299a1c632016a6fcd33f4" {
		t.Fatalf("%v %+v", err, got)
	}
	for name, plant := range map[string]func(string) error{
		"link":           func(p string) error { return os.Symlink("/etc/passwd", p) },
		"bad\xffname.py": func(p string) error { return os.WriteFile(p, nil, 0o644) },
	} {
		p := filepath.Join(dir, name)
		must(plant(p))
		if _, err := w.Entries(); !errors.Is(err, ErrUnsafe) {
			t.Errorf("%q: %v, want ErrUnsafe", name, err)
		}
		must(os.Remove(p))
	}
}
