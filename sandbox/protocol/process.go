package protocol

import (
	"strconv"
	"strings"
)

// The worker's process interface, shared by the parent (package sandbox), which
// starts workers, and the worker (package sandbox/worker), which is one: the parent
// side links none of the worker's engine, seccomp or capability libraries.

// WorkerCommand is the hidden argv[1] that makes the binary a worker
// (worker.Main); cmd/appliance dispatches it before anything else.
const WorkerCommand = "__worker"

// ProbeProcfs is the argv[2] (after WorkerCommand) that makes a worker only try to
// mount a procfs of its pid namespace and exit: 0 if the kernel allows it,
// ProbeRefused with the reason on stderr if it refuses. Under a container's masked
// /proc the kernel refuses it (mount_too_revealing in fs/namespace.c), so the parent
// probes until it has one of these answers and, when refused, starts workers without
// a pid namespace.
const ProbeProcfs = "probe-procfs"

// ProbeRefused is the exit status of a ProbeProcfs worker whose procfs mount the
// kernel refused; any other failing status (a Go runtime's 2, a signal) is no answer.
const ProbeRefused = 3

// The worker's descriptors beyond stdin, stdout and stderr (see the package doc).
const (
	// ControlFD is the worker's control socket (Request in, Report out).
	ControlFD = 3
	// WorkspaceFD is the workspace directory, opened and checked by the parent.
	// Without its own mount namespace the worker preopens it through /proc/self/fd;
	// with one, it reopens the path inside the namespace and refuses it unless it is
	// this directory. Either way the directory it gets is the one the parent checked.
	WorkspaceFD = 4
	// ModuleFD is the precompiled module (.cwasm): a sealed in-memory copy the
	// parent made of the verified file, which nobody can write.
	ModuleFD = 5
)

// GuestLibDir is where the guest sees the interpreter's library (read-only): CPython's
// prefix is /usr/local. See bundle, which installs that library.
const GuestLibDir = "/usr/local/lib"

// StatusBytes returns the field (e.g. "VmRSS") of a /proc/PID/status text, given
// there in kB, in bytes; 0 if absent (proc(5)).
func StatusBytes(status []byte, field string) int64 {
	for _, line := range strings.Split(string(status), "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// GuestZoneDir is where the guest sees the IANA time zone database (read-only), where
// zoneinfo, dateutil and pytz look for it; the worker preopens the library's
// LibZoneDir there.
const GuestZoneDir = "/usr/share/zoneinfo"

// LibZoneDir is the directory within the interpreter's library (the bundle's lib)
// that holds the time zone database.
const LibZoneDir = "zoneinfo"
