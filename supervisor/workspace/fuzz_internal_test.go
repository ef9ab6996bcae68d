package workspace

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// FuzzLookup resolves fuzzed paths beneath a workspace holding files, directories
// and symbolic links that point inside, outside (to a directory and, absolutely, to
// /etc/passwd) and at themselves, by both ways the package has (openat2 with
// RESOLVE_BENEATH, and the component walk used where openat2 is refused). Each must
// find exactly what the other finds for a path CleanPath accepts, and neither may
// ever open a file that is not one of the workspace's own.
func FuzzLookup(f *testing.F) {
	for _, p := range []string{"a", "d/f", "d/../a", "up/x", "loop", "d/link/f", "./a", "a/", "/etc/passwd",
		"d//f", "..", "d/self/self/f", strings.Repeat("d/", 50) + "f", "abs", "d/\x00"} {
		f.Add(p)
	}
	root := f.TempDir()
	outside := f.TempDir()
	must := func(err error) {
		if err != nil {
			f.Fatal(err)
		}
	}
	must(os.WriteFile(filepath.Join(root, "a"), []byte("a"), 0o644))
	must(os.MkdirAll(filepath.Join(root, "d"), 0o755))
	must(os.WriteFile(filepath.Join(root, "d", "f"), []byte("f"), 0o644))
	must(os.WriteFile(filepath.Join(outside, "x"), []byte("outside"), 0o644))
	must(os.Symlink(outside, filepath.Join(root, "up")))
	must(os.Symlink("loop", filepath.Join(root, "loop")))
	must(os.Symlink("../d", filepath.Join(root, "d", "link")))
	must(os.Symlink(".", filepath.Join(root, "d", "self")))
	must(os.Symlink("/etc/passwd", filepath.Join(root, "abs")))
	dir, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	must(err)
	// What a lookup may find: the workspace's own files and directories, by inode.
	inside := map[uint64]bool{}
	must(filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode()&os.ModeSymlink == 0 {
			inside[fi.Sys().(*syscall.Stat_t).Ino] = true
		}
		return err
	}))

	f.Fuzz(func(t *testing.T, p string) {
		if strings.IndexByte(p, 0) >= 0 {
			return // no system call takes it; CleanPath's test covers it
		}
		clean := CleanPath(p) == nil
		var got [2]string
		for i, open := range []func(int, string, uint64) (int, error){openat2, walk} {
			fd, err := open(dir, p, unix.O_RDONLY)
			if err != nil {
				got[i] = "error " + errClass(err)
				continue
			}
			var st unix.Stat_t
			if err := unix.Fstat(fd, &st); err != nil {
				t.Fatal(err)
			}
			b := make([]byte, 16)
			n, err := unix.Pread(fd, b, 0)
			if err != nil {
				n = 0 // a directory
			}
			unix.Close(fd)
			if !inside[st.Ino] || string(b[:n]) == "outside" {
				t.Fatalf("%q opened a file outside the workspace (inode %d)", p, st.Ino)
			}
			got[i] = fmt.Sprintf("ino %d", st.Ino)
		}
		if clean && got[0] != got[1] {
			t.Fatalf("%q: openat2 %s, walk %s", p, got[0], got[1])
		}
	})
}

// errClass names what a lookup's error means to callers (see lookupErr).
func errClass(err error) string {
	switch {
	case errors.Is(err, unix.ENOENT):
		return "not found"
	case errors.Is(err, unix.ELOOP), errors.Is(err, unix.EXDEV), errors.Is(err, unix.ENOTDIR):
		return "unsafe"
	default:
		return err.Error()
	}
}
