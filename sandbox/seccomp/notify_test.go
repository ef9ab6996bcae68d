package seccomp

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"runtime"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sandcell/sandcell/sandbox/seccomp/unotify"
)

// notifyVictimEnv makes the test binary a native session's interpreter as far as
// its filter goes: WithCheckpoints(NativeRules(false)), its listener sent on fd 3.
const notifyVictimEnv = "SANDCELL_SECCOMP_NOTIFY_VICTIM"

func init() {
	if os.Getenv(notifyVictimEnv) == "1" {
		// The main goroutine stays on the main thread, whose id is the process's:
		// as the interpreter's main thread, the one that forks its checkpoints.
		runtime.LockOSThread()
	}
}

func notifyVictim() {
	fail := func(what string, err error) {
		os.Stdout.WriteString(what + ": " + err.Error())
		os.Exit(2)
	}
	prog, err := Compile(WithCheckpoints(NativeRules(false)))
	if err != nil {
		fail("compile", err)
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		fail("no_new_privs", err)
	}
	if err := prog.Install(); err == nil {
		fail("install", os.ErrInvalid) // a notifying program needs its listener
	}
	l, err := prog.InstallListener()
	if err != nil {
		fail("install", err)
	}
	if err := unix.Sendmsg(3, []byte{0}, unix.UnixRights(int(l.Fd())), nil, 0); err != nil {
		fail("send the listener", err)
	}
	l.Close()
	res := map[string]string{}
	fork := func(name string, flags uintptr) {
		r, _, e := unix.RawSyscall6(unix.SYS_CLONE, flags, 0, 0, 0, 0, 0)
		if e != 0 {
			res[name] = e.Error()
			return
		}
		if r == 0 {
			unix.RawSyscall(unix.SYS_EXIT_GROUP, 7, 0, 0)
		}
		var ws unix.WaitStatus
		if _, err := unix.Wait4(int(r), &ws, 0, nil); err != nil {
			res[name] = "forked, not reaped: " + err.Error()
			return
		}
		res[name] = "forked"
	}
	glibcFork := uintptr(unix.CLONE_CHILD_SETTID | unix.CLONE_CHILD_CLEARTID | unix.SIGCHLD)
	fork("checkpoint", glibcFork)
	fork("second", glibcFork)
	fork("plain", uintptr(unix.SIGCHLD))
	fork("vm", uintptr(unix.CLONE_VM|unix.SIGCHLD))
	_, _, e := unix.RawSyscall(unix.SYS_FORK, 0, 0, 0)
	res["fork(2)"] = e.Error()
	b, _ := json.Marshal(res)
	os.Stdout.Write(b)
	os.Exit(0)
}

// A native session's filter: the daemon's answer decides a new process. The one
// checkpoint fork it allows runs; a second, one with other flags, fork(2), each
// fail with EPERM as the plain native profile's refusals do; threads are not asked
// about; and Supervise returns once the process is gone.
func TestSuperviseCheckpointFork(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	ours, theirs := os.NewFile(uintptr(fds[0]), "ours"), os.NewFile(uintptr(fds[1]), "theirs")
	defer ours.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	// No asynchronous preemption in the victim: the Go runtime's SIGURG arriving
	// during the approved clone restarts it (fork returns ERESTARTNOINTR when a
	// signal is pending), which asks again, and the second ask of one checkpoint is
	// refused (seen once in 2 test suites at once on 2 cores: 5 asks, checkpoint
	// EPERM). In a session that leaves the cell without a checkpoint (fail
	// closed: no second process); this test is of the filter's answers.
	cmd.Env = append(os.Environ(), notifyVictimEnv+"=1", "GODEBUG=asyncpreemptoff=1")
	cmd.ExtraFiles = []*os.File{theirs}
	out := new(bytes.Buffer) // read once the victim has ended
	cmd.Stdout = out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	theirs.Close()
	buf, oob := make([]byte, 1), make([]byte, unix.CmsgSpace(4))
	_, oobn, _, _, err := unix.Recvmsg(int(ours.Fd()), buf, oob, unix.MSG_CMSG_CLOEXEC)
	if err != nil {
		cmd.Wait()
		t.Fatalf("receive the listener: %v (%s)", err, out)
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) != 1 {
		cmd.Wait()
		t.Fatalf("no listener came: %v (%s)", err, out)
	}
	lfds, err := unix.ParseUnixRights(&msgs[0])
	if err != nil || len(lfds) != 1 {
		t.Fatalf("no listener came: %v", err)
	}
	var asked, allowed atomic.Int32
	served := make(chan error, 1)
	go func() {
		served <- unotify.Supervise(os.NewFile(uintptr(lfds[0]), "listener"), func(c unotify.Call) bool {
			asked.Add(1)
			if c.TID != cmd.Process.Pid || !unotify.CheckpointFork(c) || allowed.Load() > 0 {
				return false
			}
			allowed.Add(1)
			return true
		}, func(unotify.Call) { allowed.Add(-1) })
	}()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("victim: %v: %s", err, out)
	}
	if err := <-served; err != nil {
		t.Fatalf("Supervise: %v", err)
	}
	var res map[string]string
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatalf("victim output %q: %v", out, err)
	}
	eperm := unix.EPERM.Error()
	want := map[string]string{"checkpoint": "forked", "second": eperm, "plain": eperm, "vm": eperm, "fork(2)": eperm}
	for k, v := range want {
		if res[k] != v {
			t.Errorf("%s: got %q, want %q", k, res[k], v)
		}
	}
	if n := asked.Load(); n != 4 {
		t.Errorf("the daemon was asked %d times, want 4 (the clones; fork(2) is refused by the filter)", n)
	}
}

// A file's profile may not notify: only the daemon answers, for its own checkpoints.
func TestLoadFileRefusesNotify(t *testing.T) {
	p := WithCheckpoints(NativeRules(false))
	b, _ := json.Marshal(p)
	path := t.TempDir() + "/profile.json"
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadFile(path); err == nil {
		t.Fatal("a profile with SCMP_ACT_NOTIFY was loaded")
	}
	if prog, err := Compile(p); err != nil || !prog.Notifies {
		t.Fatalf("the worker's own profile: %v", err)
	}
}
