package sandbox

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// inode identifies a directory whatever path or bind mount it is reached by.
type inode struct{ dev, ino uint64 }

func statInode(st *unix.Stat_t) inode { return inode{uint64(st.Dev), st.Ino} }

// openWorkspace opens the workspace directory once and checks that handle against
// the protected directories: neither may contain the other, compared by device and
// inode (so bind mounts and symbolic links do not help) and by resolved path. The
// worker is given this open directory, not the path, so nothing swapped in after the
// check (a parent directory renamed, a symbolic link planted by another run) can
// change what it gets.
func openWorkspace(path string, protected []string) (*os.File, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("%w: workspace: %v", ErrBadRequest, err)
	}
	ws := os.NewFile(uintptr(fd), "workspace")
	if err := checkWorkspace(fd, protected); err != nil {
		ws.Close()
		return nil, err
	}
	return ws, nil
}

func checkWorkspace(fd int, protected []string) error {
	// The ancestors of the opened directory, itself first, walked with openat("..").
	var wsChain []inode
	cur, err := unix.Dup(fd)
	if err != nil {
		return fmt.Errorf("sandbox: workspace: %w", err)
	}
	for {
		var st unix.Stat_t
		if err := unix.Fstat(cur, &st); err != nil {
			unix.Close(cur)
			return fmt.Errorf("sandbox: workspace: %w", err)
		}
		id := statInode(&st)
		if len(wsChain) > 0 && wsChain[len(wsChain)-1] == id {
			break // ".." of the root is the root
		}
		wsChain = append(wsChain, id)
		up, err := unix.Openat(cur, "..", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		unix.Close(cur)
		if err != nil {
			return fmt.Errorf("sandbox: workspace: %w", err)
		}
		cur = up
	}
	unix.Close(cur)
	wsPath, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
	if err != nil {
		return fmt.Errorf("sandbox: workspace: %w", err)
	}

	for _, p := range protected {
		if p == "" {
			continue
		}
		dir, err := resolve(p)
		if err != nil {
			return fmt.Errorf("%w: %s: %v", ErrBadRequest, p, err)
		}
		overlap := within(wsPath, dir) || within(dir, wsPath)
		// The protected directory, or where it would be, and its ancestors.
		for d := dir; !overlap; d = filepath.Dir(d) {
			var st unix.Stat_t
			if unix.Stat(d, &st) == nil {
				id := statInode(&st)
				if d == dir {
					// Workspace inside (or equal to) the protected directory.
					for _, w := range wsChain {
						overlap = overlap || w == id
					}
				}
				// Protected directory inside (or equal to) the workspace.
				overlap = overlap || id == wsChain[0]
			}
			if filepath.Dir(d) == d {
				break
			}
		}
		if overlap {
			return fmt.Errorf("%w: the workspace overlaps %s, which holds the interpreter or its compiled code", ErrBadRequest, p)
		}
	}
	return nil
}
