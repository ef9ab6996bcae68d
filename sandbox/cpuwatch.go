package sandbox

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// clockTick is the unit of /proc/PID/stat's utime and stime: USER_HZ, which Linux
// fixes at 100 for every architecture user space sees (proc(5)).
const clockTick = 10 * time.Millisecond

// processCPU returns the CPU time (user and system, every thread of it, and of the
// children it has waited for) the process pid has used, from /proc/PID/stat, to the
// clock tick.
func processCPU(pid int) (time.Duration, error) { return statCPU(pid, true) }

// ownCPU returns the CPU time the process pid has used itself (every thread of it,
// not its children), from /proc/PID/stat, to the clock tick: what its RLIMIT_CPU
// counts (setrlimit(2)).
func ownCPU(pid int) (time.Duration, error) { return statCPU(pid, false) }

// statCPU is processCPU, or ownCPU when children is false.
func statCPU(pid int, children bool) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces and parentheses: fields are
	// counted from after its last ')'. utime, stime, cutime and cstime are fields
	// 14 to 17.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := bytes.Fields(b[i+1:])
	if len(f) < 15 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f)+2)
	}
	var ticks uint64
	end := 13
	if children {
		end = 15
	}
	for _, s := range f[11:end] {
		n, err := strconv.ParseUint(string(s), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/%d/stat: %v", pid, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * clockTick, nil
}

// watchCPU closes the channel it returns once the live process p has used budget
// more CPU time than when watchCPU was called, as read reads it (processCPU: p and
// the children it waited for; treeCPU: p and every process under it), checking
// every 1/20 of the budget (between 10 and 250 ms), until stop is closed or p
// exits. A native session's cell limit (its interpreter runs every cell, so
// RLIMIT_CPU can only be the session's backstop), and a run's under gVisor (whose
// sentry does not enforce RLIMIT_CPU).
func watchCPU(p *proc, budget time.Duration, stop <-chan struct{}, read func(pid int) (time.Duration, error)) <-chan struct{} {
	over := make(chan struct{})
	pid := p.cmd.Process.Pid
	// Read only while the process is not reaped: its pid is not reused before.
	cpu := func() (time.Duration, error) {
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.gone {
			return 0, os.ErrProcessDone
		}
		return read(pid)
	}
	start, err := cpu()
	if err != nil {
		return over // gone: its end is heard elsewhere
	}
	every := min(max(budget/20, 10*time.Millisecond), 250*time.Millisecond)
	go func() {
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-p.exited:
				return
			case <-t.C:
			}
			used, err := cpu()
			if err != nil {
				return
			}
			if used-start >= budget {
				close(over)
				return
			}
		}
	}()
	return over
}

// endOthers kills every process of pid's pid namespace (if it has one of its own)
// but pid itself, found in /proc by their namespace, and waits (at most a second in
// all) until each has exited, so that none runs on once this returns. It scans
// again until a scan finds none alive (a fork between a scan and its kills is
// found by the next; at most 20 scans). Each is opened as a pidfd and its namespace
// read again before the signal, so a pid reused meanwhile by another process is
// never signalled.
func endOthers(pid int) {
	ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", pid))
	own, _ := os.Readlink("/proc/self/ns/pid")
	if err != nil || ns == own {
		// Not a pid namespace of its own (a policy without pidns): its processes
		// cannot be told from the host's by namespace; RLIMIT_NPROC and their
		// RLIMIT_CPU bound them.
		return
	}
	deadline := time.Now().Add(time.Second)
	for range 20 {
		entries, err := os.ReadDir("/proc")
		if err != nil {
			return
		}
		var killed []int
		for _, e := range entries {
			n, err := strconv.Atoi(e.Name())
			if err != nil || n == pid {
				continue
			}
			if l, _ := os.Readlink("/proc/" + e.Name() + "/ns/pid"); l != ns {
				continue
			}
			fd, err := unix.PidfdOpen(n, 0)
			if err != nil {
				continue
			}
			l, _ := os.Readlink("/proc/" + e.Name() + "/ns/pid")
			if l != ns || exited(fd, 0) {
				unix.Close(fd) // another process now, or one already ended (a zombie)
				continue
			}
			unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
			killed = append(killed, fd)
		}
		for _, fd := range killed {
			exited(fd, max(time.Until(deadline), 0))
			unix.Close(fd)
		}
		if len(killed) == 0 {
			return
		}
	}
}

// exited says whether the process of pidfd fd has exited, waiting up to d.
func exited(fd int, d time.Duration) bool {
	p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(p, int(d.Milliseconds()))
		if err != unix.EINTR {
			return err == nil && n > 0
		}
	}
}

// treeCPU returns the CPU time the process root and every process descending from
// it have used (each with the children it has waited for), from /proc, to the
// clock tick. A process that exits between the listing and its read is not counted
// unless its parent has reaped it.
func treeCPU(root int) (time.Duration, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	children := map[int][]int{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// The parent's pid is the second field after the command name's last ')'.
		if i := bytes.LastIndexByte(b, ')'); i >= 0 {
			if f := bytes.Fields(b[i+1:]); len(f) > 1 {
				if ppid, err := strconv.Atoi(string(f[1])); err == nil {
					children[ppid] = append(children[ppid], pid)
				}
			}
		}
	}
	total, err := processCPU(root)
	if err != nil {
		return 0, err
	}
	for todo := children[root]; len(todo) > 0; {
		pid := todo[len(todo)-1]
		todo = append(todo[:len(todo)-1], children[pid]...)
		if d, err := processCPU(pid); err == nil {
			total += d
		}
	}
	return total, nil
}
