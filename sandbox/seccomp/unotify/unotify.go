// Package unotify answers the calls a seccomp filter notifies of (SCMP_ACT_NOTIFY,
// seccomp_unotify(2)) from the filter's listener, in pure Go: the daemon's side of
// the sandbox links no cgo library (libseccomp is the worker's, which compiles and
// installs the filter: package seccomp). It imports nothing of this module.
package unotify

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Call is a notifying call that waits for its answer.
type Call struct {
	// TID is the calling thread's id in the supervisor's pid namespace (a process's
	// main thread has its process's id).
	TID int
	// Nr is the call's number, Arch its AUDIT_ARCH_* value (struct seccomp_data).
	Nr   int32
	Arch uint32
	// Args are its six arguments as registers hold them (a pointer's target is not
	// read: it could change after the answer).
	Args [6]uint64
}

// notif is struct seccomp_notif (linux/seccomp.h): 80 bytes.
type notif struct {
	id    uint64
	pid   uint32
	flags uint32
	nr    int32
	arch  uint32
	ip    uint64
	args  [6]uint64
}

// resp is struct seccomp_notif_resp: 24 bytes.
type resp struct {
	id    uint64
	val   int64
	error int32
	flags uint32
}

// The ioctl numbers encode the structures' sizes: a mismatch is a build error.
var (
	_ [unix.SECCOMP_IOCTL_NOTIF_RECV>>16&0x3fff - unsafe.Sizeof(notif{})]byte
	_ [unsafe.Sizeof(notif{}) - unix.SECCOMP_IOCTL_NOTIF_RECV>>16&0x3fff]byte
	_ [unix.SECCOMP_IOCTL_NOTIF_SEND>>16&0x3fff - unsafe.Sizeof(resp{})]byte
	_ [unsafe.Sizeof(resp{}) - unix.SECCOMP_IOCTL_NOTIF_SEND>>16&0x3fff]byte
)

// Supervise answers the notifying calls of the filter whose listener is l, one at a
// time in their order, until every process under the filter has ended (it then
// returns nil) or l fails: a call allow approves continues as the kernel would have
// run it (SECCOMP_USER_NOTIF_FLAG_CONTINUE), every other one fails with EPERM, as
// the calls a filter refuses do. allow must decide from the call's registers and
// the caller's identity alone: with CONTINUE the kernel reads the call's memory
// afresh after the answer (seccomp_unotify(2)), so an answer about a pointer's
// target would be a race the caller wins. An approval that does not reach its
// caller (a signal interrupted the call, which will ask again; or the caller died)
// is handed to undelivered, which may take it back. l is closed when Supervise
// returns.
func Supervise(l *os.File, allow func(Call) bool, undelivered func(Call)) error {
	defer l.Close()
	fd := int(l.Fd()) // blocking: this goroutine keeps its thread while it waits
	for {
		// Wait for a call, or for the filter's last process to end (POLLHUP): the
		// receive itself would wait forever then.
		p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		if _, err := unix.Poll(p, -1); err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return err
		}
		switch {
		case p[0].Revents&(unix.POLLERR|unix.POLLNVAL) != 0:
			return fmt.Errorf("unotify: the listener fails (poll events %#x)", p[0].Revents)
		case p[0].Revents&unix.POLLIN == 0:
			return nil // POLLHUP: nobody is left to call
		}
		var n notif // zeroed, as the kernel requires
		if err := ioctl(fd, unix.SECCOMP_IOCTL_NOTIF_RECV, unsafe.Pointer(&n)); err != nil {
			if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EINTR) {
				continue // the caller was interrupted (a signal) or ended meanwhile
			}
			return err
		}
		c := Call{TID: int(n.pid), Nr: n.nr, Arch: n.arch, Args: n.args}
		r := resp{id: n.id, error: -int32(unix.EPERM), val: -1}
		ok := allow(c)
		if ok {
			r = resp{id: n.id, flags: unix.SECCOMP_USER_NOTIF_FLAG_CONTINUE}
		}
		// ENOENT: the caller was interrupted, or died, before the answer.
		err := ioctl(fd, unix.SECCOMP_IOCTL_NOTIF_SEND, unsafe.Pointer(&r))
		if ok && err != nil {
			undelivered(c)
		}
		if err != nil && !errors.Is(err, unix.ENOENT) {
			return err
		}
	}
}

func ioctl(fd int, req uint, arg unsafe.Pointer) error {
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), uintptr(req), uintptr(arg))
	runtime.KeepAlive(arg)
	if e != 0 {
		return e
	}
	return nil
}

// auditArch is this architecture's AUDIT_ARCH_* (struct seccomp_data's arch).
var auditArch = map[string]uint32{"amd64": unix.AUDIT_ARCH_X86_64, "arm64": unix.AUDIT_ARCH_AARCH64}[runtime.GOARCH]

// CheckpointFork reports whether c is the clone(2) glibc's fork makes on this
// architecture (no CLONE_THREAD, no namespace flag, no CLONE_VM: a process with its
// own copy of the caller's memory, SIGCHLD at its end), as a native session's
// interpreter calls it for a checkpoint.
func CheckpointFork(c Call) bool {
	const want = unix.CLONE_CHILD_SETTID | unix.CLONE_CHILD_CLEARTID | uint64(unix.SIGCHLD)
	return auditArch != 0 && c.Arch == auditArch && c.Nr == unix.SYS_CLONE && c.Args[0] == want
}
