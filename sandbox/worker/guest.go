package worker

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
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
	spec.Ended = func(out engine.Outcome) {
		rep := report(out)
		env.withDisplays(&rep)
		env.reply.send(rep)
	}
	// An epochless engine cannot stop the guest at its CPU limit: the report goes
	// from the watcher's goroutine while the guest still runs, and the process ends.
	// Its output is left open until the exit (closed, a file the guest opened next
	// could take fd 1).
	spec.Overrun = func(out engine.Outcome) {
		rep := report(out)
		env.withDisplays(&rep)
		env.reply.deliver(rep, false)
		if !env.reply.ok {
			os.Exit(1) // as Serve: the exchange failed
		}
		os.Exit(0)
	}
	rep := report(env.Engine.Run(env.Module, spec))
	env.withDisplays(&rep)
	return rep
}

// guestDisplaysFile is where in its /tmp the wasm guest leaves what its run or cell
// displayed (bundle/bootstrap.py's DISPLAYS), as JSON: the items a native runner
// reports.
const guestDisplaysFile = ".sandcell-displays"

// guestDisplays returns, and removes, what the guest's run or cell displayed, as it
// named them (untrusted: the parent checks each against the workspace), and why
// none, when the guest left something it cannot read there: not a regular file
// (whatever it is, it is removed), larger than a frame, not a list of items.
func (env *Env) guestDisplays() ([]protocol.Display, string) {
	if env.Tmp == "" {
		return nil, ""
	}
	path := filepath.Join(env.Tmp, guestDisplaysFile)
	defer os.RemoveAll(path)
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return nil, ""
	}
	if err != nil {
		return nil, "the guest's list of displays was left out: " + err.Error()
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		return nil, "the guest's list of displays was left out: not a regular file"
	}
	b, err := io.ReadAll(io.LimitReader(f, protocol.MaxGuestFrame+1))
	var items []protocol.Display
	switch {
	case err != nil:
		return nil, "the guest's list of displays was left out: " + err.Error()
	case len(b) > protocol.MaxGuestFrame:
		return nil, fmt.Sprintf("the guest's list of displays was left out: over %d bytes", protocol.MaxGuestFrame)
	case json.Unmarshal(b, &items) != nil:
		return nil, "the guest's list of displays was left out: not a JSON list of displays"
	}
	return items, ""
}

// withDisplays adds to rep what the guest displayed (see guestDisplays).
func (env *Env) withDisplays(rep *protocol.Report) {
	var why string
	if rep.Displays, why = env.guestDisplays(); why != "" {
		rep.Diagnostics = append(rep.Diagnostics, why)
	}
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
