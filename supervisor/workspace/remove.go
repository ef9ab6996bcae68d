package workspace

import (
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// hoistDepth is how deep hoist descends before it moves a directory up: the
// descriptors it and os.RemoveAll then hold stay well below RLIMIT_NOFILE.
const hoistDepth = 128

// maxHoists bounds the passes of RemoveTree (each takes hoistDepth levels off the
// deepest branch): 128k levels, far beyond what a run can create in its time.
const maxHoists = 1000

// RemoveTree removes path and everything beneath it, as os.RemoveAll does (with
// unlinkat, opening directories with O_NOFOLLOW relative to their parent: a link
// inside is removed, never followed), however deep the tree. os.RemoveAll holds one
// descriptor per level, so a tree deeper than RLIMIT_NOFILE allows (a run can nest
// directories thousands deep; a container's limit is often 1024) fails with EMFILE;
// then every directory hoistDepth levels down is moved up to path's top level and
// the removal is tried again.
func RemoveTree(path string) error {
	for pass := 0; ; pass++ {
		err := os.RemoveAll(path)
		if !errors.Is(err, syscall.EMFILE) && !errors.Is(err, syscall.ENFILE) {
			return err
		}
		if pass == maxHoists {
			return fmt.Errorf("workspace: %s is nested too deep to remove: %w", path, err)
		}
		top, oerr := os.OpenFile(path, os.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW, 0)
		if oerr != nil {
			return errors.Join(err, oerr)
		}
		moved, herr := hoist(top, pass)
		top.Close()
		if herr != nil || !moved {
			return errors.Join(err, herr)
		}
	}
}

// hoist walks the tree beneath top depth first, never deeper than hoistDepth, and
// renames each directory it finds at that depth into top (".hoist-PASS-N"), so that
// the deepest branch loses hoistDepth-1 levels. It reports whether it moved any.
func hoist(top *os.File, pass int) (bool, error) {
	stack := []*os.File{top}
	defer func() {
		for _, f := range stack {
			if f != top {
				f.Close()
			}
		}
	}()
	moved := 0
	for len(stack) > 0 {
		f := stack[len(stack)-1]
		ents, err := f.ReadDir(1)
		if err == io.EOF || len(ents) == 0 {
			if len(stack) > 1 {
				f.Close()
			}
			stack = stack[:len(stack)-1]
			continue
		}
		if err != nil {
			return moved > 0, err
		}
		if !ents[0].IsDir() { // the directory entry's type: a link is not followed
			continue
		}
		name := ents[0].Name()
		if len(stack) == hoistDepth {
			if err := unix.Renameat(int(f.Fd()), name, int(top.Fd()), fmt.Sprintf(".hoist-%d-%d", pass, moved)); err != nil {
				return moved > 0, err
			}
			moved++
			continue
		}
		fd, err := unix.Openat(int(f.Fd()), name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return moved > 0, err
		}
		stack = append(stack, os.NewFile(uintptr(fd), name))
	}
	return moved > 0, nil
}
