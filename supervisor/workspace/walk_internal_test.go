package workspace

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// A directory removed while it is measured, listed or copied holds nothing: the walk
// goes on (it had failed with ENOENT, and a run whose workspace held SQLite's lock
// directory for a moment was stopped as over its quota).
func TestWalkOfARemovedDirectory(t *testing.T) {
	removed := func() int {
		sub := filepath.Join(t.TempDir(), "gone")
		if err := os.Mkdir(sub, 0o700); err != nil {
			t.Fatal(err)
		}
		fd, err := unix.Open(sub, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(sub); err != nil {
			t.Fatal(err)
		}
		return fd
	}
	var u Usage
	if err := countDir(removed(), "gone/", &u, 100); err != nil || u.Files != 0 {
		t.Errorf("count: %+v %v", u, err)
	}
	if err := listDir(removed(), "gone/", nil, func(f File) error { t.Errorf("listed %+v", f); return nil }); err != nil {
		t.Errorf("list: %v", err)
	}
	dst, err := unix.Open(t.TempDir(), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := copyDir(removed(), dst, "gone/", &Usage{}, Quota{}); err != nil {
		t.Errorf("copy: %v", err)
	}
}
