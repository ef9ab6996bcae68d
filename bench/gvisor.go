package main

// The native table's gVisor column: the native root's own python3, with the same
// command, environment and workspace as python3 (chroot), under runsc (gVisor's
// user-space kernel between the program and the host's) and nothing of Sandcell's.
// It is what a gVisor layer under the native backend would add to a run: the
// sandbox's start (runsc, its gofer and sentry), every system call served by the
// sentry, and every file read through the gofer.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// gvisorPlatform is runsc's platform: ptrace works on any kernel; kvm needs
// /dev/kvm and, on a virtual machine, nested virtualisation (on this bench's
// machines runsc's kvm platform did not start python3).
const gvisorPlatform = "ptrace"

// gvisorRequire is the CLI's --require for the native backend's gvisor layer: it
// and every other layer but Landlock, which gVisor's kernel lacks.
const gvisorRequire = "gvisor,rlimits,userns,netns,mntns,pidns,ipcns,utsns,capabilities,no_new_privs,seccomp"

// gvisor runs python3 of the native root in one runsc container per run.
type gvisor struct {
	runsc   string // runsc's path
	version string // its first line of --version
	dir     string // where each run's bundle (config.json) and runsc's state go
	rootfs  string // the native root, the container's read-only root
	ws      string // the workspace, bound read-write at /ws
	n       atomic.Int64
}

// newGVisor finds runsc and checks that it runs python3 of the root; it returns
// why not when it cannot.
func newGVisor(rootfs, ws, dir string) (*gvisor, string) {
	runsc, err := exec.LookPath("runsc")
	if err != nil {
		return nil, "skipped: no runsc (apt-get install runsc)"
	}
	out, err := exec.Command(runsc, "--version").Output()
	if err != nil {
		return nil, "skipped: runsc --version: " + err.Error()
	}
	g := &gvisor{runsc: runsc, version: strings.SplitN(string(out), "\n", 2)[0], dir: dir, rootfs: rootfs, ws: ws}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, "skipped: " + err.Error()
	}
	if out, _, err := g.python(nprog{code: "print(6 * 7)"}); err != nil || out != "42\n" {
		return nil, fmt.Sprintf("skipped: runsc does not run python3 here (%q, %v)", out, err)
	}
	return g, ""
}

// spec is the container of one run: the root read-only, /ws the workspace, /tmp a
// tmpfs, new pid, network (loopback only: runsc --network=none), IPC, UTS and
// mount namespaces, no capabilities, no new privileges.
func (g *gvisor) spec(code string) *specs.Spec {
	return &specs.Spec{
		Version: specs.Version,
		Process: &specs.Process{
			// uid 0 of the container's own user space (the gofer serves files as
			// the caller), with no capability: as python3 (chroot) runs.
			User: specs.User{},
			Args: []string{"/usr/bin/python3.13", "-I", "-c", code},
			Env: []string{"HOME=/tmp", "LANG=C.UTF-8", "MPLBACKEND=Agg", "MPLCONFIGDIR=/tmp/.matplotlib",
				"PATH=/usr/bin"},
			Cwd:             "/ws",
			NoNewPrivileges: true,
			Capabilities:    &specs.LinuxCapabilities{},
		},
		Root: &specs.Root{Path: g.rootfs, Readonly: true},
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc"},
			{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "noexec"}},
			{Destination: "/ws", Type: "bind", Source: g.ws, Options: []string{"rbind", "rw", "nosuid", "nodev", "noexec"}},
		},
		Linux: &specs.Linux{Namespaces: []specs.LinuxNamespace{
			{Type: specs.PIDNamespace}, {Type: specs.NetworkNamespace}, {Type: specs.IPCNamespace},
			{Type: specs.UTSNamespace}, {Type: specs.MountNamespace},
		}},
	}
}

// python runs p.code in a new container and returns its stdout; the time of the
// whole runsc run is the caller's to take.
func (g *gvisor) python(p nprog) (string, time.Duration, error) {
	id := "bench-" + strconv.FormatInt(g.n.Add(1), 10)
	bundleDir, state := filepath.Join(g.dir, id), filepath.Join(g.dir, id+".state")
	defer os.RemoveAll(state)
	defer os.RemoveAll(bundleDir)
	if err := os.MkdirAll(bundleDir, 0o755); err != nil {
		return "", 0, err
	}
	b, err := json.Marshal(g.spec(p.code))
	if err != nil {
		return "", 0, err
	}
	if err := os.WriteFile(filepath.Join(bundleDir, "config.json"), b, 0o644); err != nil {
		return "", 0, err
	}
	// --rootless: runsc configures no cgroup and needs no capability of its own
	// beyond what it finds; the run ends with runsc (it runs attached).
	cmd := exec.Command(g.runsc, "--rootless", "--network=none", "--platform="+gvisorPlatform,
		"--root", state, "run", "--bundle", bundleDir, id)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", 0, fmt.Errorf("runsc run: %v: %s", err, stderr.Bytes())
	}
	return stdout.String(), 0, nil
}
