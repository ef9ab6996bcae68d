package seccomp

import (
	"errors"
	"os"
	"syscall"

	libseccomp "github.com/seccomp/libseccomp-golang"
	"golang.org/x/sys/unix"
)

// Call is a notifying call (SCMP_ACT_NOTIFY) that waits for its answer.
type Call struct {
	// TID is the calling thread's id in the supervisor's pid namespace (a process's
	// main thread has its process's id).
	TID int
	// Syscall is the call's name on this architecture ("" if unknown).
	Syscall string
	// Args are its six arguments as registers hold them (a pointer's target is not
	// read: it could change after the answer).
	Args [6]uint64
}

// Supervise answers the notifying calls of the filter whose listener is l (see
// InstallListener), one at a time in their order, until every process under the
// filter has ended (it then returns nil) or l fails: a call allow approves
// continues as the kernel would have run it (SECCOMP_USER_NOTIF_FLAG_CONTINUE),
// every other one fails with EPERM, as the calls the filter refuses do. allow must
// decide from the call's registers and the caller's identity alone: with CONTINUE
// the kernel reads the call's memory afresh after the answer (seccomp_unotify(2)),
// so an answer about a pointer's target would be a race the caller wins. l is
// closed when Supervise returns.
func Supervise(l *os.File, allow func(Call) bool) error {
	defer l.Close()
	fd := int(l.Fd())
	arch, _ := libseccomp.GetNativeArch()
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
		if p[0].Revents&unix.POLLIN == 0 {
			return nil // POLLHUP: nobody is left to call
		}
		req, err := libseccomp.NotifReceive(libseccomp.ScmpFd(fd))
		if err != nil {
			if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.EINTR) {
				continue // the caller was interrupted (a signal) or ended meanwhile
			}
			return err
		}
		c := Call{TID: int(req.Pid)}
		if name, err := req.Data.Syscall.GetNameByArch(arch); err == nil {
			c.Syscall = name
		}
		copy(c.Args[:], req.Data.Args)
		resp := &libseccomp.ScmpNotifResp{ID: req.ID, Error: int32(unix.EPERM), Val: ^uint64(0)}
		if allow(c) {
			resp.Error, resp.Val, resp.Flags = 0, 0, libseccomp.NotifRespFlagContinue
		}
		// ENOENT: the caller was interrupted, or died, before the answer: nothing to do.
		if err := libseccomp.NotifRespond(libseccomp.ScmpFd(fd), resp); err != nil && !errors.Is(err, syscall.ENOENT) {
			return err
		}
	}
}
