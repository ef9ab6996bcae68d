package worker

import (
	"fmt"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandcell/sandcell/sandbox/engine"
	"github.com/sandcell/sandcell/sandbox/protocol"
)

// The guest phase: its program on stdin, and its run.

// GuestWorkdir is the guest path of the workspace preopen, and its working directory.
const GuestWorkdir = protocol.GuestWorkdir

// runGuest runs the request's Python program, whose program feedStdin has written:
// a fresh instance of the interpreter's snapshot, its RunExport called once.
func runGuest(req *protocol.Request, env *Env) protocol.Report {
	spec := guestSpec(req, env)
	spec.Ended = func(out engine.Outcome) { env.reply.send(report(out)) }
	return report(env.Engine.Run(env.Module, spec))
}

// msDuration is ms milliseconds.
func msDuration(ms int64) time.Duration { return time.Duration(ms) * time.Millisecond }

// memoryErrorFlag is added to the exit status the snapshot returns for a program
// that ended with an uncaught MemoryError (see bundle/bootstrap.py); a program's own
// status is below it.
const memoryErrorFlag = 0x100

func report(out engine.Outcome) protocol.Report {
	rep := protocol.Report{
		ExitCode:        out.ExitCode,
		Reason:          out.Reason,
		FuelConsumed:    out.FuelConsumed,
		PeakMemoryBytes: out.PeakMemoryBytes,
		Diagnostics:     out.Diagnostics,
	}
	if rep.Reason == protocol.Exited && rep.ExitCode >= 0 && rep.ExitCode&memoryErrorFlag != 0 {
		rep.Reason, rep.ExitCode = protocol.MemoryLimit, rep.ExitCode&0xFF
		rep.Diagnostics = append(rep.Diagnostics, fmt.Sprintf(
			"the program ran out of memory: an allocation was refused (uncaught MemoryError; guest memory %d MiB)",
			out.PeakMemoryBytes>>20))
	}
	return rep
}

// Program is what the guest reads from stdin before its own stdin (see
// protocol.Program), with the guest's storage figures (diskField).
func Program(req *protocol.Request) ([]byte, error) { return protocol.Program(req, diskField()) }

// diskField is the header's DISK field: what the guest's shutil.disk_usage reports
// (see bundle/bootstrap.py), as space-separated words: "quota=BYTES", the most the
// workspace and /tmp may hold together; without a quota, "fs=TOTAL,USED,FREE", the
// figures of the workspace's file system as the run began (statfs(2), as CPython
// computes them from statvfs), when they could be read; and "tmp=BYTES", the size of
// the guest's /tmp, when it has one. Empty: nothing is known.
func diskField() string {
	d := guestDisk
	var words []string
	if d.quota > 0 {
		words = append(words, fmt.Sprintf("quota=%d", d.quota))
	} else if d.fs != "" {
		words = append(words, d.fs)
	}
	if d.tmp > 0 {
		words = append(words, fmt.Sprintf("tmp=%d", d.tmp))
	}
	return strings.Join(words, " ")
}

// fsFigures is "fs=TOTAL,USED,FREE" for the file system holding dir, as
// shutil.disk_usage computes them from statvfs (free: what an unprivileged user
// may still use).
func fsFigures(dir string) (string, bool) {
	var st unix.Statfs_t
	if dir == "" || unix.Statfs(dir, &st) != nil {
		return "", false
	}
	size := uint64(st.Frsize)
	if size == 0 {
		size = uint64(st.Bsize)
	}
	return fmt.Sprintf("fs=%d,%d,%d", st.Blocks*size, (st.Blocks-st.Bfree)*size, st.Bavail*size), true
}

// feedStdin writes req's program and then its stdin to w, the write end of the pipe
// that is fd 0, from a goroutine, and closes it, so the guest reads the program, the
// data and then end of file, however often it reads past it. (A file given to
// wasmtime as stdin traps after repeated reads at end of file.) With w nil it makes
// fd 0 such a pipe first.
func feedStdin(req *protocol.Request, w *os.File) error {
	prog, err := Program(req)
	if err != nil {
		return err
	}
	if w == nil {
		r, pw, err := os.Pipe()
		if err != nil {
			return err
		}
		defer r.Close()
		if err := unix.Dup3(int(r.Fd()), 0, 0); err != nil {
			pw.Close()
			return err
		}
		w = pw
	}
	go func() {
		w.Write(prog)
		w.Write(req.Stdin)
		w.Close()
	}()
	return nil
}
