package workspace

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// TestRemoveTreeDeep: a tree nested deeper than the descriptors allow (as a run can
// make it, with mkdirat one level at a time) is removed whole, its links not
// followed; os.RemoveAll alone fails with EMFILE.
func TestRemoveTreeDeep(t *testing.T) {
	var old syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &old); err != nil {
		t.Fatal(err)
	}
	// A container's limit of 1024, scaled down: 400 descriptors for a 3,000-level tree.
	lim := old
	lim.Cur = 400
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	defer syscall.Setrlimit(syscall.RLIMIT_NOFILE, &old)

	outside := t.TempDir()
	os.WriteFile(filepath.Join(outside, "keep"), []byte("x"), 0o644)
	build := func(root string) string {
		if root == "" {
			root = filepath.Join(t.TempDir(), "ws")
		}
		os.Mkdir(root, 0o755)
		fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 3000; i++ {
			if i%500 == 0 {
				// Side branches, files and links out of the tree on the way down.
				unix.Mkdirat(fd, "side", 0o755)
				unix.Symlinkat(outside, fd, "out")
				if f, err := unix.Openat(fd, "f", unix.O_CREAT|unix.O_WRONLY, 0o644); err == nil {
					unix.Close(f)
				}
			}
			if err := unix.Mkdirat(fd, "a", 0o755); err != nil {
				t.Fatal(err)
			}
			next, err := unix.Openat(fd, "a", unix.O_RDONLY|unix.O_DIRECTORY, 0)
			unix.Close(fd)
			if err != nil {
				t.Fatal(err)
			}
			fd = next
		}
		unix.Close(fd)
		return root
	}
	if err := os.RemoveAll(build("")); err == nil {
		t.Fatal("os.RemoveAll removed the tree: the test does not test the deep case")
	}
	root := build("")
	if err := RemoveTree(root); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(root); !os.IsNotExist(err) {
		t.Fatalf("%s still exists: %v", root, err)
	}
	if _, err := os.Stat(filepath.Join(outside, "keep")); err != nil {
		t.Fatalf("a link was followed: %v", err)
	}

	// Through the API's routes: a file path's removal, the workspace's deletion.
	s, w := newWorkspace(t, Quota{Bytes: 1 << 20, Files: 100})
	build(filepath.Join(w.Dir(), "d"))
	if err := w.Remove("d"); err != nil {
		t.Fatalf("remove a deep directory: %v", err)
	}
	build(filepath.Join(w.Dir(), "d"))
	if err := s.Delete(w.ID); err != nil {
		t.Fatalf("delete a workspace holding a deep tree: %v", err)
	}
	if _, err := os.Stat(filepath.Join(outside, "keep")); err != nil {
		t.Fatalf("a link was followed: %v", err)
	}
}
