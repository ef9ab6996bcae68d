package sandbox

import (
	"os/exec"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sandcell/sandcell/sandbox/seccomp/unotify"
)

// TestForkWindowAnswers checks a window's answers: its fork passes once, only from
// the interpreter's main thread and with glibc's fork's flags; a second ask (a
// second fork, or the first restarted by a signal: the daemon cannot tell them
// apart) is refused; one whose approval was not delivered asks again and passes.
func TestForkWindowAnswers(t *testing.T) {
	arch := map[string]uint32{"amd64": unix.AUDIT_ARCH_X86_64, "arm64": unix.AUDIT_ARCH_AARCH64}[runtime.GOARCH]
	if arch == 0 {
		t.Skipf("no checkpoint forks on %s", runtime.GOARCH)
	}
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	interp := cmd.Process.Pid
	fork := func(tid int) unotify.Call {
		c := unotify.Call{TID: tid, Nr: unix.SYS_CLONE, Arch: arch}
		c.Args[0] = unix.CLONE_CHILD_SETTID | unix.CLONE_CHILD_CLEARTID | uint64(unix.SIGCHLD)
		return c
	}
	f := &forks{reaper: interp, interp: interp, pidfd: -1, kept: -1}
	if f.allow(fork(interp)) {
		t.Fatal("a fork passed with no window open")
	}
	f.window(true)
	other := fork(interp)
	other.Args[0] |= unix.CLONE_PARENT
	if f.allow(fork(interp+1)) || f.allow(other) {
		t.Fatal("another thread's fork, or one with other flags, passed in the window")
	}
	if !f.allow(fork(interp)) {
		t.Fatal("the window's fork was refused")
	}
	if f.allow(fork(interp)) {
		t.Fatal("a second fork passed in one window")
	}
	f.undelivered(fork(interp))
	if !f.allow(fork(interp)) {
		t.Fatal("the fork whose approval was not delivered was refused when it asked again")
	}
	if !f.window(false) {
		t.Fatal("the window does not report its fork")
	}
	if f.allow(fork(interp)) {
		t.Fatal("a fork passed after the window closed")
	}
}
