package sandbox

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

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
func openWorkspace(path string, protected, private []string) (*os.File, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("%w: workspace: %v", ErrBadRequest, err)
	}
	ws := os.NewFile(uintptr(fd), "workspace")
	if err := checkWorkspace(fd, protected, private); err != nil {
		ws.Close()
		return nil, err
	}
	return ws, nil
}

// pseudoFilesystems are file systems whose files are kernel interfaces, not data
// (statfs(2) magic numbers from linux/magic.h). A workspace on one would hand the
// guest the kernel's knobs: /proc/sys is writable by any task whose uid is host root,
// with or without capabilities.
var pseudoFilesystems = map[int64]string{
	0x9fa0:     "proc",
	0x62656572: "sysfs",
	0x27e0eb:   "cgroup",
	0x63677270: "cgroup2",
	0x64626720: "debugfs",
	0x74726163: "tracefs",
	0x73636673: "securityfs",
	0xcafe4a11: "bpf",
	0x1cd1:     "devpts",
	0x62656570: "configfs",
	0xde5e81e4: "efivarfs",
	0x6165676c: "pstore",
	0x42494e4d: "binfmt_misc",
	0xf97cff8c: "selinuxfs",
	0x43415d53: "smackfs",
	0x65735543: "fusectl",
	0x6e736673: "nsfs",
}

// checkFilesystem refuses a workspace on a pseudo-file system, or on the file system
// of /dev (devtmpfs, which statfs reports as tmpfs).
func checkFilesystem(fd int) error {
	var fs unix.Statfs_t
	if err := unix.Fstatfs(fd, &fs); err != nil {
		return fmt.Errorf("sandbox: workspace: %w", err)
	}
	if name, ok := pseudoFilesystems[int64(fs.Type)]; ok {
		return fmt.Errorf("%w: the workspace is on %s, a kernel interface, not a file system for data", ErrBadRequest, name)
	}
	var ws, dev unix.Stat_t
	if unix.Fstat(fd, &ws) == nil && unix.Stat("/dev", &dev) == nil && ws.Dev == dev.Dev {
		var root unix.Stat_t
		if unix.Stat("/", &root) == nil && root.Dev != dev.Dev {
			return fmt.Errorf("%w: the workspace is on the device file system (/dev)", ErrBadRequest)
		}
	}
	return nil
}

// checkNoMountsBeneath refuses a workspace with mount points inside it: a worker with
// its own root sees only the workspace's own file system there, one without sees the
// mounted one, so what the guest could reach would depend on the layers. (The
// workspace may itself be a mount point.)
func checkNoMountsBeneath(ws string) error {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return fmt.Errorf("sandbox: workspace: %w", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		// proc(5): the mount point is field 5, with spaces and the like as \ooo.
		mp := unescapeMountinfo(f[4])
		if mp != ws && within(mp, ws) {
			return fmt.Errorf("%w: the workspace has a mount point inside it (%s)", ErrBadRequest, mp)
		}
	}
	return nil
}

// unescapeMountinfo undoes mountinfo's octal escapes (\040 for a space, and so on).
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, "\\") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func checkWorkspace(fd int, protected, private []string) error {
	if err := checkFilesystem(fd); err != nil {
		return err
	}
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
	for _, kernel := range []string{"/proc", "/sys", "/dev"} {
		if within(wsPath, kernel) {
			return fmt.Errorf("%w: the workspace is under %s, which holds kernel interfaces", ErrBadRequest, kernel)
		}
	}

	for _, p := range protected {
		if overlap, err := overlapsDir(wsPath, wsChain, p, true); err != nil || overlap {
			if err == nil {
				err = fmt.Errorf("%w: the workspace overlaps %s, which holds the interpreter or its compiled code", ErrBadRequest, p)
			}
			return err
		}
	}
	for _, p := range private {
		if holds, err := overlapsDir(wsPath, wsChain, p, false); err != nil || holds {
			if err == nil {
				err = fmt.Errorf("%w: the workspace holds %s, a daemon's state", ErrBadRequest, p)
			}
			return err
		}
	}
	return checkNoMountsBeneath(wsPath)
}

// overlapsDir reports whether directory p (or where it would be) lies in the
// workspace (wsPath, whose directory and ancestors are wsChain, itself first) or
// is it, by path and by inode, so that no link or rename hides it; with inside,
// also whether the workspace lies in p. "" overlaps nothing.
func overlapsDir(wsPath string, wsChain []inode, p string, inside bool) (bool, error) {
	if p == "" {
		return false, nil
	}
	dir, err := resolve(p)
	if err != nil {
		return false, fmt.Errorf("%w: %s: %v", ErrBadRequest, p, err)
	}
	overlap := within(dir, wsPath) || inside && within(wsPath, dir)
	// The directory, or where it would be, and its ancestors.
	for d := dir; !overlap; d = filepath.Dir(d) {
		var st unix.Stat_t
		if unix.Stat(d, &st) == nil {
			id := statInode(&st)
			if d == dir && inside {
				// Workspace inside (or equal to) the directory.
				for _, w := range wsChain {
					overlap = overlap || w == id
				}
			}
			// The directory inside (or equal to) the workspace.
			overlap = overlap || id == wsChain[0]
		}
		if filepath.Dir(d) == d {
			break
		}
	}
	return overlap, nil
}
