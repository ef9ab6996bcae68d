package sandbox

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandcell/sandcell/sandbox/seccomp/unotify"
)

// forks is a native session's checkpoints (the runner's _sandcell_session): the
// session's pid 1 forks the interpreter and stays as its reaper; before each cell
// the interpreter forks a checkpoint of itself, which stops itself at once
// (SIGSTOP) and is continued only to carry on as the interpreter when the cell is
// rolled back (the daemon ends the interpreter). The guest may start no process:
// its filter asks the daemon about every new process (seccomp.WithCheckpoints), and
// allow lets one fork through, from the interpreter's main thread, with glibc's
// fork's flags, while a window is open: at the session's open (pid 1's fork of the
// interpreter) and between a cell's frame and its ack (the checkpoint's). Any other
// is EPERM, as without checkpoints. Guest code can still run on the main thread in
// the window (an os.register_at_fork hook, a signal handler), and the checkpoint is
// a copy of an interpreter the guest may have changed: so the daemon keeps the
// window's child only if it is stopped by the cell's ack, kills it otherwise (the
// cell then has no checkpoint), and, while the cell runs, kills a kept checkpoint
// that is no longer stopped (the guest may continue it with a signal): a checkpoint
// runs only as the interpreter.
type forks struct {
	reaper int // the worker's pid: the session's pid 1

	mu       sync.Mutex
	closed   bool   // the session is closed: no pidfd is taken any more
	interp   int    // the interpreter's pid, whose main thread may fork
	pidfd    int    // the interpreter's, to signal it without a race with pid reuse; -1: none
	kept     int    // the cell's checkpoint's pidfd, stopped; -1: none
	keptPid  int    // its pid
	keptLost string // why the cell's checkpoint was ended, if it was
	open     bool   // one fork may pass
	forked   bool   // the window's fork passed
	refused  int    // calls refused since refusedAt
	since    time.Time
}

// superviseForks answers the calls the session's filter asks about (its listener l)
// until the session's last process ends; open opens the window for pid 1's fork of
// the interpreter (a warm worker's opens when it is claimed for a session, and a
// run's never: its guest's forks are all refused).
func superviseForks(l *os.File, reaper int, open bool) *forks {
	f := &forks{reaper: reaper, interp: reaper, pidfd: -1, kept: -1, open: open}
	go unotify.Supervise(l, f.allow, f.undelivered)
	return f
}

// refusalsPerSecond bounds how many refused calls a second the daemon answers at
// full speed: a guest looping on fork costs the daemon a few system calls each,
// which no limit of the guest's counts; past it, each answer waits.
const refusalsPerSecond = 200

// allow answers one call the filter asks about: the window's fork passes, once.
// A signal pending as the approved fork starts makes the kernel restart the call
// before it makes a child (ERESTARTNOINTR), and the restart asks again: it is
// refused, and that cell has no checkpoint. Nothing the daemon can read tells a
// restart from a second fork whose child has already been reaped (and whose CPU
// time no count of the session's would then hold), so none passes.
func (f *forks) allow(c unotify.Call) bool {
	f.mu.Lock()
	if f.open && c.TID == f.interp && unotify.CheckpointFork(c) {
		f.open, f.forked = false, true
		f.mu.Unlock()
		return true
	}
	if now := time.Now(); now.Sub(f.since) > time.Second {
		f.refused, f.since = 0, now
	}
	f.refused++
	slow := f.refused > refusalsPerSecond
	f.mu.Unlock()
	if slow {
		time.Sleep(time.Second / refusalsPerSecond)
	}
	return false
}

// undelivered takes back an approval its caller did not get (it will ask again).
func (f *forks) undelivered(c unotify.Call) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.forked && c.TID == f.interp {
		f.open, f.forked = true, false
	}
}

// window opens (true) the window for a cell's checkpoint, or closes it (false) and
// reports whether the checkpoint's fork passed.
func (f *forks) window(open bool) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	forked := f.forked
	f.open, f.forked = open, false
	if open {
		f.keptLost = ""
	}
	return forked
}

// keep takes the window's child as the cell's checkpoint if it is the
// interpreter's one living child and has stopped itself within a second; otherwise
// it kills every child of the interpreter (and pid 1's but the interpreter) and the
// cell has no checkpoint (false).
func (f *forks) keep() bool {
	f.mu.Lock()
	interp := f.interp
	f.mu.Unlock()
	deadline := time.Now().Add(time.Second)
	for {
		// The interpreter's children, or pid 1's once the interpreter has ended (a
		// cell that ends it at once): its children are pid 1's then.
		kids, _ := livingChildren(interp)
		orphans, err := livingChildren(f.reaper)
		kids = append(kids, slices.DeleteFunc(orphans, func(k int) bool { return k == interp })...)
		if err == nil && len(kids) == 1 && processState(kids[0]) == 'T' {
			if fd, err := unix.PidfdOpen(kids[0], 0); err == nil {
				f.mu.Lock()
				if !f.closed && processState(kids[0]) == 'T' {
					f.closeKept()
					f.kept, f.keptPid = fd, kids[0]
					f.mu.Unlock()
					return true
				}
				f.mu.Unlock()
				unix.Close(fd)
			}
		}
		if err != nil || time.Now().After(deadline) {
			for _, k := range kids {
				if fd, err := unix.PidfdOpen(k, 0); err == nil {
					unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
					unix.Close(fd)
				}
			}
			return false
		}
		time.Sleep(200 * time.Microsecond)
	}
}

// drop kills the last cell's checkpoint, which is not needed (the cell ended by
// itself). Nothing else of the guest's can be left: every fork but a kept
// checkpoint was killed at its cell's ack (keep).
func (f *forks) drop() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.kept >= 0 {
		unix.PidfdSendSignal(f.kept, unix.SIGKILL, nil, 0)
		f.closeKept()
	}
}

// closeKept lets go of the checkpoint's pidfd; f.mu is held.
func (f *forks) closeKept() {
	if f.kept >= 0 {
		unix.Close(f.kept)
		f.kept, f.keptPid = -1, 0
	}
}

// resume ends the interpreter (unless it has ended), calls beforeContinue, and
// continues the cell's checkpoint, which then carries on as the interpreter; it
// returns the ended interpreter's pid.
func (f *forks) resume(beforeContinue func()) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case f.keptLost != "":
		return 0, errors.New(f.keptLost)
	case f.pidfd < 0 || f.kept < 0:
		return 0, errors.New("no checkpoint is kept")
	}
	if err := unix.PidfdSendSignal(f.pidfd, unix.SIGKILL, nil, 0); err != nil && !errors.Is(err, unix.ESRCH) {
		return 0, err
	}
	// Continued only once the interpreter has ended: until then its end of the
	// checkpoint's pipe is open, and the checkpoint would wait on it anyway.
	exited(f.pidfd, time.Second)
	beforeContinue()
	err := unix.PidfdSendSignal(f.kept, unix.SIGCONT, nil, 0)
	f.closeKept()
	return f.interp, err
}

// watch, every 100 ms until unwatch is called, kills the cell's checkpoint if it
// is no longer stopped (a checkpoint runs only as the interpreter: the guest
// continued it, or ended it) and closes exit when the interpreter exits. unwatch
// returns once the watch has ended (a rollback continues the checkpoint after it),
// and may be called again.
func (f *forks) watch() (exit <-chan struct{}, unwatch func()) {
	ch, stop, done := make(chan struct{}), make(chan struct{}), make(chan struct{})
	var once sync.Once
	unwatch = func() { once.Do(func() { close(stop) }); <-done }
	f.mu.Lock()
	fd, err := unix.Dup(f.pidfd)
	f.mu.Unlock()
	if err != nil {
		close(done)
		return ch, unwatch
	}
	go func() {
		defer close(done)
		defer unix.Close(fd)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if exited(fd, 100*time.Millisecond) {
				close(ch)
				return
			}
			f.mu.Lock()
			if f.kept >= 0 && processState(f.keptPid) != 'T' {
				unix.PidfdSendSignal(f.kept, unix.SIGKILL, nil, 0)
				f.closeKept()
				f.keptLost = "the cell's checkpoint left its stop during the cell (a checkpoint runs only as the interpreter) and was ended"
			}
			f.mu.Unlock()
		}
	}()
	return ch, unwatch
}

// gone says the interpreter has exited.
func (f *forks) gone() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.pidfd >= 0 && exited(f.pidfd, 0)
}

// adopt finds the interpreter: pid 1's one living child other than gone (an
// interpreter ended by a rollback, which pid 1 may not have reaped yet), and holds
// a pidfd of it. The child is there within a second, or adopt fails.
func (f *forks) adopt(gone int) error {
	deadline := time.Now().Add(time.Second)
	for {
		kids, err := livingChildren(f.reaper)
		if err != nil {
			return err
		}
		kids = slices.DeleteFunc(kids, func(k int) bool { return k == gone })
		if len(kids) == 1 {
			fd, err := unix.PidfdOpen(kids[0], 0)
			if err == nil {
				// Still pid 1's child once opened: the pidfd is of that process.
				if again, _ := livingChildren(f.reaper); slices.Contains(again, kids[0]) {
					f.mu.Lock()
					defer f.mu.Unlock()
					if f.closed {
						unix.Close(fd)
						return errors.New("the session is closed")
					}
					if f.pidfd >= 0 {
						unix.Close(f.pidfd)
					}
					f.interp, f.pidfd = kids[0], fd
					return nil
				}
				unix.Close(fd)
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the session's pid 1 has %d living children where the interpreter should be the one", len(kids))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// close lets go of the interpreter's and the checkpoint's pidfds, for good.
func (f *forks) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	if f.pidfd >= 0 {
		unix.Close(f.pidfd)
		f.pidfd = -1
	}
	f.closeKept()
}

// processState is the state letter of process pid (/proc/PID/stat: R, S, T, Z,
// ...), or 0 if it cannot be read.
func processState(pid int) byte {
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if i := bytes.LastIndexByte(st, ')'); err == nil && i >= 0 && i+2 < len(st) {
		return st[i+2]
	}
	return 0
}

// errSessionEnded is livingChildren's error for a pid 1 that has ended (its
// children cannot be read): the session's worker is gone.
var errSessionEnded = errors.New("the session's worker has ended")

// livingChildren lists pid's children that have not exited (zombies left out);
// errSessionEnded when they cannot be read.
func livingChildren(pid int) ([]int, error) {
	kids, err := children(pid)
	if err != nil {
		return nil, errSessionEnded
	}
	return slices.DeleteFunc(kids, func(k int) bool { return !living(k) }), nil
}

// living says process pid has a thread that has not exited. Its main thread's
// state alone would not tell: a process whose main thread has exited shows as a
// zombie (Z) while its other threads run on.
func living(pid int) bool {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return false // gone, and reaped
	}
	for _, t := range tasks {
		st, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, t.Name()))
		if i := bytes.LastIndexByte(st, ')'); err == nil && i >= 0 && i+2 < len(st) && st[i+2] != 'Z' && st[i+2] != 'X' {
			return true
		}
	}
	return false
}

// children lists pid's children, living or not reaped (/proc's children list of
// its main thread: proc(5)).
func children(pid int) ([]int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
	if err != nil {
		return nil, err
	}
	var kids []int
	for _, s := range strings.Fields(string(b)) {
		if n, err := strconv.Atoi(s); err == nil {
			kids = append(kids, n)
		}
	}
	return kids, nil
}
