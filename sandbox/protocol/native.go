package protocol

import (
	_ "embed"
	"maps"
	"slices"
	"strconv"
)

// NativeRunner returns the Python program a native guest's interpreter starts with
// (`python3 -I -B -c RUNNER [ARG...]`): the guest's end of this protocol. It
// reads the program's header (see Program) from stdin, runs the program as
// __main__ with GuestWorkdir as its working directory, and writes its frames
// (StepReady, StepExec, StepReport) on fd 3. Its arguments: none (a run), "session"
// (cells on fd 3's socket), "preimport MODULE..." (a warm worker), or "control"
// (a run under gVisor: stdin is a socket, fd 3 the same, and the runner reports
// what it finds in force, StepExec, before it reads the program).
func NativeRunner() string {
	return "_sandcell_version = " + strconv.Itoa(Version) + "  # (protocol.Version)\n" + displays + toolsModule + nativeRunner
}

// DisplaysSource returns the Python source of display() that both guests share
// (displays.py: the function _sandcell_displays(io, json, base64), which returns the
// class whose display method is the guest's builtin), for a bootstrap to begin with.
func DisplaysSource() string { return displays }

var (
	//go:embed native.py
	nativeRunner string
	//go:embed displays.py
	displays string
)

// NativeTmp is the native guest's private temporary directory.
const NativeTmp = "/tmp"

// NativeEnv is a native guest's environment, as KEY=VALUE sorted by key: a few
// defaults for the root's libraries (matplotlib draws to files, in NativeTmp; a
// UTF-8 locale), then env (which policy has filtered), which may override them.
func NativeEnv(env map[string]string) []string {
	all := map[string]string{
		"HOME": NativeTmp, "LANG": "C.UTF-8", "PATH": "/usr/bin",
		"MPLBACKEND": "Agg", "MPLCONFIGDIR": NativeTmp + "/.matplotlib",
	}
	maps.Copy(all, env)
	var out []string
	for _, k := range slices.Sorted(maps.Keys(all)) {
		out = append(out, k+"="+all[k])
	}
	return out
}
