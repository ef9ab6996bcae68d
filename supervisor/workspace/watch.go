package workspace

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/sandcell/sandcell/sandbox/protocol"
	"golang.org/x/sys/unix"
)

// Bounds of Watch's measuring: it measures again after quotaCheckMin, or
// after ten times its last walk took when that is longer (so the walks cost at most
// a tenth of a core per run, whatever a workspace holds), at most quotaCheckMax.
const (
	quotaCheckMin = 100 * time.Millisecond
	quotaCheckMax = 2 * time.Second
)

// Watch measures w (at dir) while a guest runs in it, until ctx ends, and calls
// exceeded once, with what it found, when w holds more than q (the caller ends the
// run or cell: quota_exceeded): its files by name, the
// files on its file system that the worker (pid, once known) holds open after
// deleting them, which no walk sees but which hold the disk all the same (a guest
// held 2 GB against a quota of 10 MiB that way), and what the guest's /tmp holds
// (guestTmp), which shares the quota's bytes. A workspace grows past its
// quota by at most what the guest writes between two measures (with RLIMIT_FSIZE
// no file is larger than the whole quota): the bound that holds on any file
// system, where a project quota or a size-limited mount would need root and a
// particular file system.
func (w *Workspace) Watch(ctx context.Context, dir string, pid *atomic.Int64, q Quota, exceeded func(detail string)) {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		exceeded("the workspace could not be measured: " + err.Error())
		return
	}
	t := time.NewTimer(quotaCheckMin)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		began := time.Now()
		over, u, err := w.OverQuota()
		if err == nil && !over {
			var held int64
			if held, err = heldDeleted(int(pid.Load()), st.Dev); err == nil {
				u.Bytes += held + guestTmp(int(pid.Load()))
				over = u.Bytes > q.Bytes
			}
		}
		if over {
			exceeded(fmt.Sprintf("the workspace grew past its quota while the run went: %s in %s names, the quota is %d bytes and %d names",
				atLeast(u, u.Bytes), atLeast(u, int64(u.Files)), q.Bytes, q.Files))
			return
		}
		if err != nil && ctx.Err() == nil {
			// The workspace cannot be measured (the run removed it, say): its
			// bound cannot be kept, so the run ends.
			exceeded("the workspace could not be measured while the run went: " + err.Error())
			return
		}
		t.Reset(min(max(quotaCheckMin, 10*time.Since(began)), quotaCheckMax))
	}
}

// heldDeleted is the sum of the apparent sizes of the regular files on device dev
// that process pid (0: none yet) holds open with no name left (st_nlink 0), read
// through /proc/PID/fd (proc(5)). A process that has ended holds nothing.
func heldDeleted(pid int, dev uint64) (int64, error) {
	if pid <= 0 {
		return 0, nil
	}
	fdDir := fmt.Sprintf("/proc/%d/fd", pid)
	d, err := os.Open(fdDir)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return 0, nil // the process ended while its descriptors were read
	}
	var sum int64
	for _, n := range names {
		var st unix.Stat_t
		if unix.Stat(fdDir+"/"+n, &st) != nil {
			continue // closed meanwhile
		}
		if st.Mode&unix.S_IFMT == unix.S_IFREG && st.Nlink == 0 && st.Dev == dev {
			sum += st.Size
		}
	}
	return sum, nil
}

// guestTmp is what the /tmp of worker pid's guest holds, in bytes: the blocks its
// tmpfs has in use (files deleted while open included), read through the worker's
// root (/proc/PID/root, proc(5); as /proc/PID/fd, the daemon may read it for its
// own workers), 0 when there is none: a worker without a mount namespace of its
// own, a native one (its root has no protocol.GuestTmpDir: its /tmp is a tmpfs of
// native.tmp_mib, bounded on its own), or one gone. The tmpfs is no bigger than the
// quota (sandbox/worker), so /tmp alone never passes it between two measures.
func guestTmp(pid int) int64 {
	if pid <= 0 {
		return 0
	}
	var st unix.Statfs_t
	if unix.Statfs(fmt.Sprintf("/proc/%d/root%s", pid, protocol.GuestTmpDir), &st) != nil || st.Type != unix.TMPFS_MAGIC {
		return 0
	}
	return int64(st.Blocks-st.Bfree) * st.Bsize
}

// atLeast formats n, a count of u's, as "at least n" when u stopped counting early.
func atLeast(u Usage, n int64) string {
	if u.AtLeast {
		return fmt.Sprintf("at least %d", n)
	}
	return strconv.FormatInt(n, 10)
}
