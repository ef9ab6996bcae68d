package sandbox_test

// The native backend's escape suite. On native the guest is native code already, so
// the faithful attacker is a Python program calling the kernel itself (ctypes and
// libc's syscall(), os, socket, mmap) from inside a real native run:
// testdata/native_escape.py. It runs once per configuration below, with the worker's
// real hardening and the real native root, and the test prints which layer stops
// what, as TestEscapeMatrix does for the wasm backend.

import (
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sandcell/sandcell/sandbox"
	"github.com/sandcell/sandcell/sandbox/policy"
	"github.com/sandcell/sandcell/sandbox/protocol"
)

// nativeEscapeProgram is the probes (embedded: the unprivileged rerun's binary runs
// away from the source tree).
//
//go:embed testdata/native_escape.py
var nativeEscapeProgram string

// nativeTarget is what the probes aim at: the wasm suite's targets, and the
// identity of the test's own "/" (a guest whose "/" is it sees the host's tree).
type nativeTarget struct {
	target
	HostRoot [2]uint64 `json:"host_root"`
}

// nativeFilterErrno is what the seccomp filter answers in the "seccomp" column
// instead of EPERM, so that a cell shows whether the filter or something behind it
// stopped a probe (EPERM alone could be either: no capability, Landlock). Nothing in
// the kernel answers EL2HLT to these calls. Every other column with a filter runs the
// real profile.
const nativeFilterErrno = unix.EL2HLT

// nativeColumn is a configuration of the native hardening: a column of the matrix.
//
// Not every layer can be turned off on native. The native backend always starts its
// worker in new user, mount, network, IPC and UTS namespaces (Spawner.runNative: the
// worker's own mount namespace is what gives the guest the native root, and making
// it takes the user namespace; without it the worker refuses to run, see
// worker.native), so every column has them, with the rlimits, no capabilities,
// no_new_privs and the pivoted read-only root: that is "base", and there is no
// column without namespaces. The pid namespace is the one that can be left out (the
// spawner does so where a procfs cannot be mounted, and policy then has to leave
// pidns out of require): "pidns" is base with it, and every other column is without
// it unless it says so ("all" is the default native run, which has it).
type nativeColumn struct {
	name                     string
	seccomp, landlock, pidns bool
	marked                   bool // the filter answers nativeFilterErrno (see there)
}

var nativeColumns = []nativeColumn{
	{name: "base"},
	{name: "seccomp", seccomp: true, marked: true},
	{name: "landlock", landlock: true},
	{name: "pidns", pidns: true},
	{name: "all", seccomp: true, landlock: true, pidns: true},
	{name: "all but pidns", seccomp: true, landlock: true},
}

// nativeSingleLayers are the columns that add one layer to base.
var nativeSingleLayers = []string{"seccomp", "landlock", "pidns"}

// hardening returns the column's hardening: the default native run's (policy's
// NativeHardening), with the column's layers alone on, each of them required, so that
// a layer that silently failed to apply ends the run rejected.
func (c nativeColumn) hardening(pol policy.Policy, limits protocol.Limits) protocol.Hardening {
	h := pol.NativeHardening(limits)
	if c.name == "all" {
		return h // exactly what a default native run gets
	}
	h.Require = []string{protocol.LayerRlimits, protocol.LayerNoNewPrivs, protocol.LayerCapabilities,
		protocol.LayerUserNS, protocol.LayerNetNS, protocol.LayerMountNS, protocol.LayerIPCNS, protocol.LayerUTSNS}
	if c.pidns {
		h.Require = append(h.Require, protocol.LayerPidNS)
	}
	if c.seccomp {
		h.Require = append(h.Require, protocol.LayerSeccomp)
		if c.marked {
			prof := *h.Seccomp
			e := uint(nativeFilterErrno)
			prof.DefaultErrnoRet = &e
			h.Seccomp = &prof
		}
	} else {
		h.Seccomp = nil
	}
	h.Landlock = c.landlock
	if c.landlock {
		h.Require = append(h.Require, protocol.LayerLandlock)
	}
	return h
}

// runNativeEscape runs the probe program under column c, with a host directory of
// its own (so that what one column lets through does not make the next look
// stopped), and returns each probe's outcome. It builds the request as runNative
// does, but with the column's hardening and, without a pid namespace, a spawner
// told to start workers without one.
func runNativeEscape(t *testing.T, tg nativeTarget, c nativeColumn, prog string) map[string]string {
	t.Helper()
	tg.HostDir = filepath.Join(tg.HostDir, strings.ReplaceAll(c.name, " ", "-"))
	os.Mkdir(tg.HostDir, 0o755)
	os.WriteFile(filepath.Join(tg.HostDir, "secret"), []byte(secretText), 0o644)
	os.Symlink("secret", filepath.Join(tg.HostDir, "link"))
	arg, _ := json.Marshal(tg)
	pol := policy.Default()
	limits, err := pol.Resolve(protocol.Limits{TimeoutMS: 50_000})
	if err != nil {
		t.Fatal(err)
	}
	req := protocol.Request{Backend: protocol.BackendNative, RootDir: nativeRoot(t), Code: prog,
		Args: []string{string(arg)}, Workspace: t.TempDir(), Limits: limits, Hardening: c.hardening(pol, limits)}
	sp := sandbox.NewSpawner()
	if !c.pidns {
		sandbox.WithoutPidNamespace(sp, "the escape matrix's column without a pid namespace")
	}
	res, err := sp.Run(context.Background(), req)
	if err != nil {
		t.Fatalf("%s: %v", c.name, err)
	}
	if res.Reason != protocol.Exited || res.ExitCode != 0 {
		t.Fatalf("%s: the probes ended %s %d: %v\nstdout: %.3000s\nstderr: %.3000s", c.name, res.Reason, res.ExitCode,
			res.Diagnostics, res.Stdout, res.Stderr)
	}
	// Each column has exactly its layers: the required ones active (else the run
	// was rejected, above), the others not.
	e := res.Enforcement
	if e == nil || e.Backend != protocol.BackendNative {
		t.Fatalf("%s: contract %+v", c.name, e)
	}
	if miss := e.Missing(req.Hardening.Require); len(miss) > 0 {
		t.Fatalf("%s: layers not active: %v", c.name, miss)
	}
	for layer, on := range map[string]bool{protocol.LayerSeccomp: c.seccomp, protocol.LayerLandlock: c.landlock,
		protocol.LayerPidNS: c.pidns} {
		if e.Active(layer) != on {
			t.Fatalf("%s: %s active = %v, want %v", c.name, layer, e.Active(layer), on)
		}
	}
	var got map[string]string
	if err := json.Unmarshal(res.Stdout, &got); err != nil {
		t.Fatalf("%s: %v: %s\nstderr: %.3000s", c.name, err, res.Stdout, res.Stderr)
	}
	t.Logf("%s: probes in %s s, each in a child of its own: %s; active: %v (Landlock ABI %d)", c.name,
		got["(seconds)"], got["(isolated)"], e.ActiveLayers(), e.Landlock.ABI)
	delete(got, "(seconds)")
	delete(got, "(isolated)")
	return got
}

// nativeProbeNames returns the probes' names in the program's order.
func nativeProbeNames(t *testing.T, prog string) []string {
	t.Helper()
	var names []string
	inList := false
	for _, line := range strings.Split(prog, "\n") {
		switch {
		case strings.HasPrefix(line, "PROBES = ["):
			inList = true
		case inList && line == "]":
			return names
		case inList:
			l := strings.TrimSpace(line)
			if strings.HasPrefix(l, "(\"") {
				names = append(names, strings.SplitN(l[2:], "\"", 2)[0])
			}
		}
	}
	t.Fatal("no PROBES list in the probe program")
	return nil
}

// nativeCell is a cell as the matrix prints it.
func nativeCell(col, outcome string) string {
	switch {
	case outcome == "":
		return "(missing)"
	case col == "seccomp" && outcome == unix.ErrnoName(nativeFilterErrno):
		return "filter"
	case strings.HasPrefix(outcome, "no escape: "):
		return strings.TrimPrefix(outcome, "no escape: ")
	}
	return outcome
}

// nativeEvery is every column but "all" and "all but pidns": what base stops,
// every column stops.
var nativeEvery = []string{"base", "seccomp", "landlock", "pidns"}

// nativeStoppedAlone says which columns of one layer must, by design, stop each
// probe ("base" among them: then all of them). "all" and "all but pidns" must stop
// every probe. The printed matrix shows the rest (and the errno of each cell).
var nativeStoppedAlone = map[string][]string{
	// The mount namespace: the guest's tree (the native root, /ws, /tmp, /proc,
	// /dev) holds no host path.
	"list the host root":             nativeEvery,
	"read a host file":               nativeEvery,
	"stat a host path":               nativeEvery,
	"readlink a host symlink":        nativeEvery,
	"write a host file":              nativeEvery,
	"read /sys":                      nativeEvery,
	"symlink out of /ws":             nativeEvery,
	"relative symlink out of /ws":    nativeEvery,
	"hard link a host file into /ws": nativeEvery,
	".. out of /ws":                  nativeEvery,
	".. from every open fd":          nativeEvery,
	// Through /proc, the host is a path again: the user namespace (a guest in a
	// child user namespace without capabilities passes no ptrace access check on
	// the test process: cap_ptrace_access_check), Landlock, and the pid namespace
	// (no such process).
	"read a host file via /proc/PID/root":  nativeEvery,
	"write a host file via /proc/PID/root": nativeEvery,
	"reach pid 1's root (/proc/1/root)":    nativeEvery,
	"read the parent's /proc/PID/environ":  nativeEvery,
	// Read-only mounts, the seals of the program's memory file, noexec, RLIMIT_DATA.
	"write into the root (/usr/lib)":      nativeEvery,
	"write own code via /proc/self/mem":   nativeEvery,
	"write a held file via /proc/self/fd": nativeEvery,
	"map a /ws file executable":           nativeEvery,
	"a huge private mapping (1 TiB)":      nativeEvery,
	// Sockets: the filter refuses socket(2); the network namespace is empty.
	"socket AF_INET":                                   {"seccomp"},
	"socket AF_INET6":                                  {"seccomp"},
	"socket AF_UNIX":                                   {"seccomp"},
	"socket AF_NETLINK":                                {"seccomp"},
	"socket AF_PACKET":                                 nativeEvery, // no CAP_NET_RAW
	"socket AF_VSOCK":                                  {"seccomp"},
	"socket AF_ALG":                                    {"seccomp"},
	"connect to a host TCP port":                       nativeEvery, // and Landlock's TCP rule
	"send UDP to the host":                             nativeEvery,
	"connect to the hypervisor over AF_VSOCK":          {"seccomp"},
	"bind and listen on TCP":                           {"seccomp", "landlock"},
	"connect to a host Unix socket":                    nativeEvery,
	"MSG_OOB on a Unix socket pair":                    {"seccomp"},
	"attach a BPF filter to a socket pair":             {"seccomp"},
	"connect to an abstract Unix socket":               nativeEvery, // and Landlock's scope
	"connect to a host Unix socket via /proc/PID/root": nativeEvery,
	// The test process.
	"ptrace the parent":           nativeEvery,
	"process_vm_readv the parent": nativeEvery,
	"kill(2) the parent":          {"landlock", "pidns"}, // the filter allows kill: the guest signals its own
	"tgkill(2) the parent":        {"landlock", "pidns"},
	"pidfd_open the parent":       {"seccomp", "pidns"},
	// Processes and programs.
	"fork":                               {"seccomp"},
	"fork flood (300 live processes)":    {"seccomp"}, // and base when not root: see TestNativeEscapeMatrix
	"clone3 into a new user namespace":   {"seccomp"},
	"execve another program of the root": {"landlock"},
	// The kernel's wider surface, executable memory, memory past the limit.
	"keyctl":                             {"seccomp"},
	"perf_event_open":                    {"seccomp"},
	"userfaultfd":                        {"seccomp"},
	"io_uring_setup":                     {"seccomp"},
	"bpf map":                            {"seccomp"},
	"personality(READ_IMPLIES_EXEC)":     {"seccomp"},
	"load a kernel module":               nativeEvery, // no CAP_SYS_MODULE
	"a fresh executable mapping":         {"seccomp"},
	"mprotect to executable":             {"seccomp"},
	"a writable executable file mapping": {"seccomp"},
	"an executable memfd mapping":        {"seccomp"},
	"shared anonymous memory":            {"seccomp"},
	// Privileges, mounts, namespaces, limits.
	"set-id bit via chmod on a /ws file":      {"seccomp"},
	"set-id file via openat2":                 {"seccomp"},
	"mount a tmpfs":                           nativeEvery, // no capabilities
	"fsopen (the new mount API)":              nativeEvery,
	"unshare a user namespace":                {"seccomp"},
	"mount in a new user and mount namespace": {"seccomp", "landlock"},
	"unshare a network namespace":             nativeEvery,
	"setns into pid 1's network":              nativeEvery,
	"chroot":                                  nativeEvery,
	"raise an rlimit":                         nativeEvery,
}

// nativeOneLayer lists the probes that fewer than two layers are seen to stop (see
// nativeStoppers), and why. Every other probe must be stopped by at least two.
var nativeOneLayer = map[string]string{
	// The mount namespace alone: a host path the guest names is not in its tree.
	// Landlock would not stop a read if it were (the rule lets the guest read all
	// of its "/"); it would stop a write or a link, but the lookup fails first
	// (ENOENT), so no cell can show it. Reached through /proc/PID/root instead, the
	// same files are stopped by three layers (the rows above).
	"list the host root":             "the guest's / is the native root: that is the pivot itself",
	"read a host file":               "mount namespace only: Landlock lets the guest read all of its tree",
	"stat a host path":               "mount namespace only: Landlock does not hide metadata",
	"readlink a host symlink":        "mount namespace only: Landlock does not hide metadata",
	"write a host file":              "mount namespace; Landlock would refuse too, but the lookup fails first",
	"read /sys":                      "mount namespace only: no sysfs in the guest's tree",
	"symlink out of /ws":             "mount namespace; the link is made (in the workspace) and leads nowhere",
	"relative symlink out of /ws":    "mount namespace; the link is made (in the workspace) and leads nowhere",
	"hard link a host file into /ws": "mount namespace; Landlock would refuse too (EXDEV), but the lookup fails first",
	".. out of /ws":                  "mount namespace: .. from /ws is the native root",
	".. from every open fd":          "the guest holds no directory descriptor (the worker closes the workspace's before the exec): none to climb from",
	// Read-only mounts: Landlock's file rules duplicate them (nothing but /ws, /tmp
	// and three devices is writable), and the kernel checks the mount first, so
	// Landlock's refusal never shows.
	"write into the root (/usr/lib)":    "the read-only root (EROFS before Landlock's refusal)",
	"write own code via /proc/self/mem": "the read-only /proc (EROFS before Landlock's refusal)",
	"write a held file via /proc/self/fd": "the program's memory file is sealed (F_SEAL_WRITE); Landlock does not govern " +
		"kernel-internal files such as a memfd, and the filter allows the shared mapping of a file",
	"map a /ws file executable":      "noexec on /ws (and /tmp): the filter allows PROT_EXEC for files, and Landlock does not govern mmap",
	"a huge private mapping (1 TiB)": "RLIMIT_DATA: the native filter bounds no mapping's size",
	// The filter alone: it is the native guest's boundary to the kernel (see
	// docs/security.md, "The two backends"); no other layer governs these calls.
	"socket AF_INET":    "the filter; the empty network namespace leaves the socket nothing to reach (the connect rows)",
	"socket AF_INET6":   "the filter; the empty network namespace leaves the socket nothing to reach",
	"socket AF_UNIX":    "the filter; the mount and network namespaces leave it nothing to reach",
	"socket AF_NETLINK": "the filter; the kernel's netlink surface, in a network namespace of its own",
	"socket AF_VSOCK":   "the filter alone: vsock is not network-namespaced (see the connect row)",
	"connect to the hypervisor over AF_VSOCK": "the filter alone: vsock is not network-namespaced, nor governed by Landlock; " +
		"the host answers (a reset where nothing listens on the port)",
	"socket AF_ALG":                        "the filter (this kernel may have no AF_ALG: then base answers EAFNOSUPPORT)",
	"MSG_OOB on a Unix socket pair":        "the filter: socket pairs are allowed by design, their out-of-band data is not",
	"attach a BPF filter to a socket pair": "the filter: setsockopt takes SOL_SOCKET's plain options only",
	"fork":                                 "the filter: processes are a policy switch (native.processes); a child keeps every other layer",
	"clone3 into a new user namespace":     "the filter (ENOSYS: clone3's flags are in memory it cannot read); nothing else refuses a new process in a user namespace of its own",
	"execve another program of the root": "Landlock's execute right alone (the filter allows execve: the worker's own " +
		"exec of python3.13); the dynamic loader, which Landlock must let run, can still load another program of the root",
	"keyctl":                             "the filter",
	"perf_event_open":                    "the filter (perf_event_paranoid may refuse too)",
	"userfaultfd":                        "the filter (UFFD_USER_MODE_ONLY needs no privilege)",
	"io_uring_setup":                     "the filter",
	"bpf map":                            "the filter (kernel.unprivileged_bpf_disabled may refuse too)",
	"personality(READ_IMPLIES_EXEC)":     "the filter: with it, every readable mapping would be executable",
	"a fresh executable mapping":         "the filter (W^X is the filter's)",
	"mprotect to executable":             "the filter (W^X is the filter's)",
	"a writable executable file mapping": "the filter (W^X is the filter's)",
	"an executable memfd mapping":        "the filter (memfd_create refused; a memfd is not on a noexec mount)",
	"shared anonymous memory":            "the filter: RLIMIT_DATA does not count shared memory",
	"set-id bit via chmod on a /ws file": "the filter: Landlock has no right for a file's mode, and the workspace is the " +
		"host's, where the bit would count",
	"set-id file via openat2":  "the filter (ENOSYS): openat2's mode is in memory it cannot read",
	"unshare a user namespace": "the filter: a single-threaded guest may make one and hold every capability in it",
}

// nativeStoppers returns the layers that stop a probe on their own, as the matrix
// shows it: "base" if base stops it, and each single layer whose column stops it
// with another answer than base's (the layer answered before anything base has; an
// equal answer may be base's, and is not counted).
func nativeStoppers(results map[string]map[string]string, probe string) []string {
	var out []string
	base := results["base"][probe]
	if base != "ESCAPED" {
		out = append(out, "base")
	}
	for _, l := range nativeSingleLayers {
		if c := results[l][probe]; c != "ESCAPED" && c != base {
			out = append(out, l)
		}
	}
	return out
}

// TestNativeEscapeMatrix is the native escape suite (see the file comment).
func TestNativeEscapeMatrix(t *testing.T) {
	nativeRoot(t)
	if warmMode {
		t.Skip("native runs are never served warm: the cold pass of `make test` runs this")
	}
	names := nativeProbeNames(t, nativeEscapeProgram)
	if len(names) < 45 {
		t.Fatalf("only %d probes", len(names))
	}
	wt, check := escapeTargets(t)
	var root unix.Stat_t
	if err := unix.Stat("/", &root); err != nil {
		t.Fatal(err)
	}
	tg := nativeTarget{target: wt, HostRoot: [2]uint64{uint64(root.Dev), root.Ino}}
	results := map[string]map[string]string{}
	for _, c := range nativeColumns {
		results[c.name] = runNativeEscape(t, tg, c, nativeEscapeProgram)
	}
	check()

	// The matrix, one line per probe: ESCAPED, or what stopped it ("filter": the
	// seccomp column's filter, see nativeFilterErrno).
	var m strings.Builder
	fmt.Fprintf(&m, "\n%-50s", "attempt")
	for _, c := range nativeColumns {
		fmt.Fprintf(&m, " %-13s", c.name)
	}
	m.WriteString("\n")
	for _, p := range names {
		fmt.Fprintf(&m, "%-50s", p)
		for _, c := range nativeColumns {
			fmt.Fprintf(&m, " %-13.13s", nativeCell(c.name, results[c.name][p]))
		}
		m.WriteString("\n")
	}
	t.Log(m.String())

	oneLayer := maps.Clone(nativeOneLayer)
	stoppedAlone := maps.Clone(nativeStoppedAlone)
	if os.Getuid() != 0 {
		// RLIMIT_NPROC binds inside the worker's user namespace, but not when the
		// worker maps to host root (the kernel exempts root's user): the daemon
		// runs as its own unprivileged user in production.
		stoppedAlone["fork flood (300 live processes)"] = nativeEvery
	} else {
		oneLayer["fork flood (300 live processes)"] = "the filter: as root, RLIMIT_NPROC does not bind a worker mapped to host root"
		t.Log("running as root: RLIMIT_NPROC does not bind a worker mapped to host root, so base lets a fork flood through")
	}
	for _, c := range nativeColumns {
		for p, o := range results[c.name] {
			if !slices.Contains(names, p) {
				t.Errorf("%s: an outcome for unknown probe %q", c.name, p)
			}
			if strings.HasPrefix(o, "error: ") || strings.HasPrefix(o, "child ended") {
				t.Errorf("%s: %q failed as a probe, not as an escape: %s", c.name, p, o)
			}
		}
		for _, p := range names {
			if results[c.name][p] == "" {
				t.Errorf("%s: no outcome for %q", c.name, p)
			}
		}
	}
	var one []string
	for _, p := range names {
		if _, ok := stoppedAlone[p]; !ok {
			t.Errorf("no expectation for probe %q", p)
		}
		for _, c := range []string{"all", "all but pidns"} {
			if results[c][p] == "ESCAPED" {
				t.Errorf("%q escaped under %s", p, c)
			}
		}
		for _, c := range stoppedAlone[p] {
			if results[c][p] == "ESCAPED" {
				t.Errorf("%q escaped under %s, which must stop it", p, c)
			}
		}
		s := nativeStoppers(results, p)
		why, listed := oneLayer[p]
		switch {
		case len(s) < 2 && !listed:
			t.Errorf("%q is stopped by %v alone", p, s)
		case len(s) < 2:
			one = append(one, fmt.Sprintf("%-40s %-9s %s", p, strings.Join(s, ","), why))
		case listed:
			t.Logf("%q, listed as stopped by one layer, is stopped by %v here", p, s)
		}
	}
	for name := range stoppedAlone {
		if !slices.Contains(names, name) {
			t.Errorf("expectation for unknown probe %q", name)
		}
	}
	for name := range oneLayer {
		if !slices.Contains(names, name) {
			t.Errorf("one-layer entry for unknown probe %q", name)
		}
	}
	t.Logf("stopped by one layer (%d of %d probes):\n%s", len(one), len(names), strings.Join(one, "\n"))
}

// TestNativeEscapeMatrixUnprivileged runs the native escape suite again as an
// unprivileged user (uid 65534), as the daemon runs in production: there the workers
// map to that user, RLIMIT_NPROC binds, and nothing in the matrix may depend on being
// root.
func TestNativeEscapeMatrixUnprivileged(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("not root: TestNativeEscapeMatrix itself runs unprivileged")
	}
	if warmMode {
		t.Skip("native runs are never served warm: the cold pass of `make test` runs this")
	}
	if testing.Short() {
		t.Skip("-short")
	}
	out := asNobody(t, "-test.run=^TestNativeEscapeMatrix$")
	if !strings.Contains(out, "--- PASS: TestNativeEscapeMatrix") {
		t.Fatalf("native escape suite as uid 65534:\n%s", out)
	}
	if i := strings.Index(out, "attempt"); i >= 0 {
		t.Logf("as uid 65534:\n%s", out[i:])
	}
}

// asNobody runs this test binary as uid 65534 with args (-test.run=...), verbose, and
// returns its output; a failure to run it fails t. The native root is used where
// it is when uid 65534 can reach it, else through a tree of hard links to it (or a
// copy, across file systems) in a world-searchable directory: CI clones into a
// directory only root may enter.
func asNobody(t *testing.T, args ...string) string {
	t.Helper()
	root, err := filepath.Abs(nativeRoot(t))
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("/var/tmp", "sandcell-native-unprivileged-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o755)
	if !searchable(root) {
		linked := filepath.Join(dir, "rootfs")
		if out, err := exec.Command("cp", "-al", root, linked).CombinedOutput(); err != nil {
			os.RemoveAll(linked)
			if out, err := exec.Command("cp", "-a", root, linked).CombinedOutput(); err != nil {
				t.Fatalf("a copy of the native root for uid 65534: %v %s", err, out)
			}
			t.Logf("hard links refused (%s): the native root copied", strings.TrimSpace(string(out)))
		}
		root = linked
	}
	tmp := filepath.Join(dir, "tmp")
	os.Mkdir(tmp, 0o777)
	os.Chmod(tmp, 0o777)
	// The binary's directory is never a workspace, nor holds one: it gets its own.
	os.Mkdir(filepath.Join(dir, "bin"), 0o755)
	bin := filepath.Join(dir, "bin", "sandbox.test")
	src, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, src, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, append(args, "-test.v", "-test.count=1")...)
	cmd.Dir = dir
	cmd.Env = []string{"TMPDIR=" + tmp, "HOME=" + tmp, "PATH=/usr/bin:/bin", "SANDCELL_NATIVE_ROOT=" + root}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("as uid 65534: %v\n%s", err, out)
	}
	return string(out)
}

// searchable says whether every directory from / to path lets others search it.
func searchable(path string) bool {
	for d := path; ; d = filepath.Dir(d) {
		st, err := os.Stat(d)
		if err != nil || st.Mode().Perm()&0o001 == 0 {
			return false
		}
		if d == "/" {
			return true
		}
	}
}
