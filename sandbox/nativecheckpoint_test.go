package sandbox

import (
	"os/exec"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandcell/sandcell/sandbox/seccomp/unotify"
)

// TestForkRestartPasses checks a window's answers with real processes: the
// window's fork passes once; asked again by the same thread (a restart: a signal
// made the kernel give up before the child and run the call again) it passes
// while the caller has no child, and never once it has one; another thread's, a
// fork with other flags, or one outside the window never pass.
func TestForkRestartPasses(t *testing.T) {
	arch := map[string]uint32{"amd64": unix.AUDIT_ARCH_X86_64, "arm64": unix.AUDIT_ARCH_AARCH64}[runtime.GOARCH]
	if arch == 0 {
		t.Skipf("no checkpoint forks on %s", runtime.GOARCH)
	}
	start := func(args ...string) int {
		cmd := exec.Command(args[0], args[1:]...)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		return cmd.Process.Pid
	}
	childless := start("sleep", "60")
	parent := start("sh", "-c", "sleep 60 & wait")
	for deadline := time.Now().Add(5 * time.Second); ; {
		if kids, _ := children(parent); len(kids) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the shell's child did not come")
		}
		time.Sleep(10 * time.Millisecond)
	}
	fork := func(tid int) unotify.Call {
		c := unotify.Call{TID: tid, Nr: unix.SYS_CLONE, Arch: arch}
		c.Args[0] = unix.CLONE_CHILD_SETTID | unix.CLONE_CHILD_CLEARTID | uint64(unix.SIGCHLD)
		return c
	}

	f := &forks{reaper: childless, interp: childless, pidfd: -1, kept: -1}
	if f.allow(fork(childless)) {
		t.Fatal("a fork passed with no window open")
	}
	f.window(true)
	if !f.allow(fork(childless)) {
		t.Fatal("the window's fork was refused")
	}
	for i := range maxForkRestarts {
		if !f.allow(fork(childless)) {
			t.Fatalf("restart %d of the window's fork, with no child made, was refused", i+1)
		}
	}
	if f.allow(fork(childless)) {
		t.Fatalf("restart %d passed: at most %d", maxForkRestarts+1, maxForkRestarts)
	}
	other := fork(childless)
	other.Args[0] |= unix.CLONE_PARENT
	if f.allow(fork(parent)) || f.allow(other) {
		t.Fatal("another thread's fork, or one with other flags, passed in the window")
	}
	if !f.window(false) {
		t.Fatal("the window does not report its fork")
	}
	if f.allow(fork(childless)) {
		t.Fatal("a fork passed after the window closed")
	}

	// A caller that has a child: its fork made one, so a repeat is a second fork.
	f = &forks{reaper: parent, interp: parent, pidfd: -1, kept: -1}
	f.window(true)
	if !f.allow(fork(parent)) {
		t.Fatal("the window's fork was refused")
	}
	if f.allow(fork(parent)) {
		t.Fatal("a second fork passed while the first one's child lives")
	}
	// Undelivered: the approval never reached the caller, so it may ask again.
	f.undelivered(fork(parent))
	if !f.allow(fork(parent)) {
		t.Fatal("the fork whose approval was not delivered was refused when it asked again")
	}
}
