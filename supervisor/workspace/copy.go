package workspace

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// CopyTo copies the workspace's regular files and directories into dir, an
// existing empty directory, within the workspace's quota (past it: ErrQuota, what
// was copied stays for the caller to remove). Any other name (a symbolic link, a
// FIFO, a device, a file with other hard links) is ErrUnsafe, and nothing is ever
// followed: each name is opened beneath its directory without following links (as
// Open does) and checked by what was opened, and each copy is created anew
// (O_EXCL, O_NOFOLLOW) beneath the copy's directory, so a workspace that changes
// while it is copied (a run in it) can make the copy fail, never reach outside
// either tree. File permission bits are kept, within 0o777.
func (w *Workspace) CopyTo(dir string) error {
	src, err := w.root()
	if err != nil {
		return err
	}
	dst, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		unix.Close(src)
		return fmt.Errorf("workspace: copy to %s: %w", dir, err)
	}
	var u Usage
	return copyDir(src, dst, "", &u, w.s.quota)
}

// copyDir copies the directory src into dst (closing both), adding what it copies
// to u within q.
func copyDir(src, dst int, prefix string, u *Usage, q Quota) error {
	d := os.NewFile(uintptr(src), prefix)
	defer d.Close()
	defer unix.Close(dst)
	if strings.Count(prefix, "/") >= maxDepth {
		return fmt.Errorf("%w: directories nested deeper than %d", ErrUnsafe, maxDepth)
	}
	for {
		names, err := readNames(d)
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("workspace: list %s: %w", prefix, err)
		}
		for _, name := range names {
			path := prefix + name
			fd, err := openat2(src, name, unix.O_RDONLY|unix.O_NONBLOCK)
			if errors.Is(err, unix.ENOENT) {
				continue // removed meanwhile
			}
			if err == nil {
				if u.Files++; q.Files > 0 && u.Files > q.Files {
					unix.Close(fd)
					return fmt.Errorf("%w: more than %d names to copy", ErrQuota, q.Files)
				}
			}
			if err != nil {
				return fmt.Errorf("%w: %s cannot be opened without following it: %v", ErrUnsafe, path, err)
			}
			var st unix.Stat_t
			if err := unix.Fstat(fd, &st); err != nil {
				unix.Close(fd)
				return err
			}
			switch st.Mode & unix.S_IFMT {
			case unix.S_IFDIR:
				if err := unix.Mkdirat(dst, name, 0o700); err != nil {
					unix.Close(fd)
					return fmt.Errorf("workspace: copy %s: %w", path, err)
				}
				sub, err := unix.Openat(dst, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
				if err != nil {
					unix.Close(fd)
					return fmt.Errorf("workspace: copy %s: %w", path, err)
				}
				if err := copyDir(fd, sub, path+"/", u, q); err != nil {
					return err
				}
			case unix.S_IFREG:
				err := plainFile(path, &st)
				if err == nil {
					if u.Bytes += st.Size; q.Bytes > 0 && u.Bytes > q.Bytes {
						err = fmt.Errorf("%w: more than %d bytes to copy", ErrQuota, q.Bytes)
					}
				}
				if err == nil {
					room := int64(-1) // no quota: no bound
					if q.Bytes > 0 {
						room = q.Bytes - (u.Bytes - st.Size)
					}
					err = copyFile(fd, dst, name, st, room)
				} else {
					unix.Close(fd)
				}
				if err != nil {
					return fmt.Errorf("workspace: copy %s: %w", path, err)
				}
			default:
				unix.Close(fd)
				return fmt.Errorf("%w: %s is a %s, which is not copied", ErrUnsafe, path, typeName(st.Mode))
			}
		}
	}
}

// copyFile copies the open regular file fd (closing it) into a new file name
// beneath dst, at most room bytes (the file may grow while it is copied; room < 0:
// no bound).
func copyFile(fd, dst int, name string, st unix.Stat_t, room int64) error {
	in := os.NewFile(uintptr(fd), name)
	defer in.Close()
	out, err := unix.Openat(dst, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, st.Mode&0o777)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(out), name)
	defer f.Close()
	var r io.Reader = in
	if room >= 0 {
		r = io.LimitReader(in, room)
	}
	_, err = io.Copy(f, r)
	return err
}
