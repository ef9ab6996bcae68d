package sandbox

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"time"
)

// clockTick is the unit of /proc/PID/stat's utime and stime: USER_HZ, which Linux
// fixes at 100 for every architecture user space sees (proc(5)).
const clockTick = 10 * time.Millisecond

// processCPU returns the CPU time (user and system, every thread of it, not its
// children) the process pid has used, from /proc/PID/stat, to the clock tick.
func processCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces and parentheses: fields are
	// counted from after its last ')'. utime and stime are fields 14 and 15.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := bytes.Fields(b[i+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f)+2)
	}
	var ticks uint64
	for _, s := range f[11:13] {
		n, err := strconv.ParseUint(string(s), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/%d/stat: %v", pid, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * clockTick, nil
}

// watchCPU closes the channel it returns once the live process p has used budget
// more CPU time than when watchCPU was called, checking every 1/20 of the budget
// (between 10 and 250 ms), until stop is closed or p exits. A native session's
// cell limit: its interpreter runs every cell, so RLIMIT_CPU can only be the
// session's backstop.
func watchCPU(p *proc, budget time.Duration, stop <-chan struct{}) <-chan struct{} {
	over := make(chan struct{})
	pid := p.cmd.Process.Pid
	// Read only while the process is not reaped: its pid is not reused before.
	cpu := func() (time.Duration, error) {
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.gone {
			return 0, os.ErrProcessDone
		}
		return processCPU(pid)
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
