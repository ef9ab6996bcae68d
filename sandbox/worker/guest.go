package worker

import (
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandcell/sandcell/sandbox/engine"
	"github.com/sandcell/sandcell/sandbox/protocol"
)

// The guest phase: its program on stdin, and its run.

// GuestWorkdir is the guest path of the workspace preopen, and its working directory.
const GuestWorkdir = "/ws"

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

// Program is what the snapshot's bootstrap reads from stdin before the program's own
// stdin: ten decimal digits giving the header's length, then the header (see
// bundle/bootstrap.py).
func Program(req *protocol.Request) ([]byte, error) {
	var fields []string
	switch {
	case req.Code != "" && req.Path != "":
		return nil, fmt.Errorf("request sets both code and path")
	case req.Isolated && req.Path != "":
		return nil, fmt.Errorf("an isolated request runs code, not a path")
	case req.Path != "":
		fields = []string{"path", GuestWorkdir + "/" + req.Path, ""}
	default:
		name := req.Filename
		if name == "" {
			name = "<string>"
		}
		mode := "code"
		if req.Isolated {
			mode = "isolated"
		}
		fields = []string{mode, req.Code, name}
	}
	fields = append(fields, strconv.Itoa(len(req.Args)))
	fields = append(fields, req.Args...)
	return header(append(fields, envFields(req.Env)...))
}

// envFields is env as the header carries it: KEY, VALUE pairs in key order.
func envFields(env map[string]string) []string {
	keys := make([]string, 0, len(env))
	for k := range env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var fields []string
	for _, k := range keys {
		fields = append(fields, k, env[k])
	}
	return fields
}

// header joins fields with NUL after ten digits giving the length.
func header(fields []string) ([]byte, error) {
	for _, f := range fields {
		if strings.ContainsRune(f, 0) {
			return nil, fmt.Errorf("the program contains a NUL byte")
		}
	}
	h := strings.Join(fields, "\x00")
	return fmt.Appendf(nil, "%010d%s", len(h), h), nil
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
