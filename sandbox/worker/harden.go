package worker

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/landlock-lsm/go-landlock/landlock"
	llsys "github.com/landlock-lsm/go-landlock/landlock/syscall"
	"golang.org/x/sys/unix"
	"kernel.org/pub/linux/libs/security/libcap/cap"
	"kernel.org/pub/linux/libs/security/libcap/psx"

	"github.com/sandcell/sandcell/sandbox/protocol"
	"github.com/sandcell/sandcell/sandbox/seccomp"
)

// Paths at which the worker reaches the workspace and the library once it has its own
// mount namespace (the root of that namespace holds nothing else).
const (
	rootWorkspace = "/ws"
	rootLibrary   = "/lib"
)

// hardened is the result of harden: the contract, and where the workspace and the
// interpreter's library are now reachable (for the preopens).
type hardened struct {
	enf       protocol.Enforcement
	workspace string
	library   string
}

// harden applies h to this process, in the order below, verifying each layer and
// recording in the contract what holds and why something does not. It never stops
// half-way: a layer that fails is reported inactive and the caller decides, from
// h.Require, whether the guest may run. The parent has already made the worker a
// session leader with a parent-death signal, an empty environment, fds 0-5 only and
// (when asked) its own namespaces.
//
//  1. rlimits                 (setrlimit(2): CORE 0, NOFILE, FSIZE, CPU; NPROC in a userns)
//  2. namespaces              (verified against the parent's; a private root by pivot_root(2),
//     a host name of its own)
//  3. capabilities            (libcap: every set emptied on every thread, secure bits locked)
//  4. Landlock                (go-landlock at the kernel's ABI: /lib read-only, /ws
//     read-write, TCP bind/connect denied, abstract sockets and signals scoped)
//  5. no_new_privs            (on every thread)
//  6. seccomp                 (libseccomp, TSYNC)
func harden(req *protocol.Request) *hardened {
	h := req.Hardening
	st := &hardened{
		enf: protocol.Enforcement{Namespaces: map[string]bool{}, Rlimits: map[string]uint64{},
			Errors: map[string]string{}},
		workspace: fmt.Sprintf("/proc/self/fd/%d", WorkspaceFD),
		library:   req.LibDir,
	}
	fail := func(layer string, err error) { st.enf.Errors[layer] = err.Error() }

	userns := setRlimits(h, st, fail)

	if h.Namespaces {
		if userns && st.enf.Namespaces[protocol.LayerMountNS] {
			if err := pivot(req.Workspace, req.LibDir); err != nil {
				st.enf.Namespaces[protocol.LayerMountNS] = false
				fail(protocol.LayerMountNS, err)
			} else {
				st.workspace, st.library = rootWorkspace, rootLibrary
				st.enf.MountRoot = []string{rootWorkspace + " (read-write)", rootLibrary + " (read-only)",
					"/proc (read-only, this pid namespace's processes only)"}
			}
		} else {
			st.enf.Namespaces[protocol.LayerMountNS] = false
		}
		// The UTS namespace is verified by its link like the others; its host name is
		// left as cloned (WASI gives the guest no way to read it, and systemd's
		// ProtectHostname= denies sethostname to the whole service).
		if st.enf.Namespaces[protocol.LayerPidNS] && os.Getpid() != 1 {
			st.enf.Namespaces[protocol.LayerPidNS] = false
			fail(protocol.LayerPidNS, errors.New("not pid 1 of its pid namespace"))
		}
		for layer, on := range st.enf.Namespaces {
			if !on && st.enf.Errors[layer] == "" {
				fail(layer, errors.New("the worker does not have a namespace of its own"))
			}
		}
	}

	// Capabilities and (below ABI 8) Landlock are per thread: libcap's psx applies
	// them to every thread it finds in /proc/PID/task, which must be this process's.
	threads := checkThreadList()
	if threads != nil {
		fail(protocol.LayerCapabilities, threads)
		if h.Landlock {
			fail(protocol.LayerLandlock, threads)
		}
	} else {
		dropCapabilities(st, fail)
		if h.Landlock {
			if err := restrictLandlock(st); err != nil {
				fail(protocol.LayerLandlock, err)
			}
		}
	}

	// no_new_privs on every thread (seccomp's TSYNC below also extends it to every
	// thread it synchronises).
	var err error
	if threads == nil {
		if _, _, e := psx.Syscall6(unix.SYS_PRCTL, unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0, 0); e != 0 {
			err = e
		}
	} else {
		err = unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
	}
	if err != nil {
		fail(protocol.LayerNoNewPrivs, err)
	}
	nnp, err := unix.PrctlRetInt(unix.PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0)
	st.enf.NoNewPrivs = err == nil && nnp == 1
	if threads != nil && h.Seccomp == nil {
		// Set on this thread only, and no seccomp TSYNC to extend it: not the layer.
		st.enf.NoNewPrivs = false
		fail(protocol.LayerNoNewPrivs, threads)
	}

	st.enf.Seccomp.Mode = "disabled"
	if h.Seccomp != nil {
		if err := installSeccomp(h, st); err != nil {
			fail(protocol.LayerSeccomp, err)
		}
	}
	return st
}

// setRlimits sets the limits of h and reads every one back into the contract. It
// also verifies the namespaces (NPROC is only set inside a user namespace), and
// returns whether the worker has its own user namespace.
func setRlimits(h protocol.Hardening, st *hardened, fail func(string, error)) bool {
	for layer, name := range protocol.Namespaces {
		link, err := os.Readlink("/proc/self/ns/" + name)
		host := h.HostNamespaces[name]
		st.enf.Namespaces[layer] = h.Namespaces && err == nil && host != "" && link != host
	}
	userns := st.enf.Namespaces[protocol.LayerUserNS]
	cpu := h.Rlimits.CPU
	set := []struct {
		name     string
		resource int
		soft     uint64
		hard     uint64
	}{
		{"CORE", unix.RLIMIT_CORE, 0, 0},
		{"NOFILE", unix.RLIMIT_NOFILE, h.Rlimits.NOFILE, h.Rlimits.NOFILE},
		{"FSIZE", unix.RLIMIT_FSIZE, h.Rlimits.FSIZE, h.Rlimits.FSIZE},
		{"CPU", unix.RLIMIT_CPU, cpu, cpu + 1}, // SIGXCPU at soft, SIGKILL at hard
		{"NPROC", unix.RLIMIT_NPROC, h.Rlimits.NPROC, h.Rlimits.NPROC},
	}
	var errs []string
	for _, r := range set {
		if r.name != "CORE" && r.soft == 0 {
			continue
		}
		if r.name == "NPROC" && !userns {
			continue // would count every process of the parent's user (CASES.md)
		}
		if err := unix.Setrlimit(r.resource, &unix.Rlimit{Cur: r.soft, Max: r.hard}); err != nil {
			errs = append(errs, fmt.Sprintf("%s: %v", r.name, err))
		}
	}
	for _, r := range set {
		var l unix.Rlimit
		if unix.Getrlimit(r.resource, &l) == nil && l.Cur != unix.RLIM_INFINITY {
			st.enf.Rlimits[r.name] = l.Cur
		}
	}
	if len(errs) > 0 {
		fail(protocol.LayerRlimits, errors.New(strings.Join(errs, "; ")))
	}
	return userns
}

// pivot gives the worker a root of its own: a small read-only tmpfs holding the
// workspace at /ws (a bind mount: read-write, nosuid, nodev, noexec) and the
// interpreter's library at /lib (read-only), with the host's tree detached. Both are
// reopened by path in this mount namespace (a mount of the parent's namespace cannot
// be bind-mounted here) and the workspace is checked to be the directory the parent
// opened (fd 4), so a path swapped in between is refused. See mount_setattr(2),
// open_tree(2), move_mount(2), pivot_root(2) ("pivot_root(".", ".")").
func pivot(workspace, library string) error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private: %w", err)
	}
	wsTree, err := cloneTree(workspace, WorkspaceFD, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOEXEC)
	if err != nil {
		return fmt.Errorf("workspace: %w", err)
	}
	defer unix.Close(wsTree)
	libTree, err := cloneTree(library, -1, unix.MOUNT_ATTR_RDONLY|unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOEXEC)
	if err != nil {
		return fmt.Errorf("library: %w", err)
	}
	defer unix.Close(libTree)

	fs, err := unix.Fsopen("tmpfs", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return fmt.Errorf("fsopen tmpfs: %w", err)
	}
	defer unix.Close(fs)
	for k, v := range map[string]string{"size": "64k", "nr_inodes": "16", "mode": "0755"} {
		if err := unix.FsconfigSetString(fs, k, v); err != nil {
			return fmt.Errorf("tmpfs %s: %w", k, err)
		}
	}
	if err := unix.FsconfigCreate(fs); err != nil {
		return fmt.Errorf("tmpfs: %w", err)
	}
	root, err := unix.Fsmount(fs, unix.FSMOUNT_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("fsmount: %w", err)
	}
	defer unix.Close(root)
	// Attach the new root somewhere in this (private) namespace so that mounts can go
	// beneath it and pivot_root accepts it; where does not matter once pivoted.
	if err := unix.MoveMount(root, "", unix.AT_FDCWD, workspace, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("attach new root: %w", err)
	}
	proc, err := procMount()
	if err != nil {
		return err
	}
	defer unix.Close(proc)
	for name, tree := range map[string]int{"ws": wsTree, "lib": libTree, "proc": proc} {
		if err := unix.Mkdirat(root, name, 0o755); err != nil {
			return fmt.Errorf("mkdir %s: %w", name, err)
		}
		if err := unix.MoveMount(tree, "", root, name, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
			return fmt.Errorf("mount %s: %w", name, err)
		}
	}
	if err := unix.MountSetattr(root, "", unix.AT_EMPTY_PATH, &unix.MountAttr{
		Attr_set: unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV | unix.MOUNT_ATTR_NOEXEC,
	}); err != nil {
		return fmt.Errorf("new root read-only: %w", err)
	}
	if err := unix.Fchdir(root); err != nil {
		return fmt.Errorf("chdir new root: %w", err)
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach old root: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return err
	}
	if err := sameDir(rootWorkspace, WorkspaceFD); err != nil {
		return err
	}
	// fd 4 is a directory of the parent's mount tree: from it, ".." leads to the host.
	return unix.Close(WorkspaceFD)
}

// procMount returns a detached procfs of the worker's pid namespace showing only its
// process directories (subset=pid: no /proc/sys, no kernel files), read-only. The
// worker needs it for one thing: libcap's psx, which changes the capabilities and
// Landlock domain of every thread, finds the threads in /proc/PID/task. Landlock
// then denies the guest any access to it. See proc(5), "subset".
func procMount() (int, error) {
	fs, err := unix.Fsopen("proc", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("fsopen proc: %w", err)
	}
	defer unix.Close(fs)
	if err := unix.FsconfigSetString(fs, "subset", "pid"); err != nil {
		return -1, fmt.Errorf("proc subset=pid: %w", err)
	}
	if err := unix.FsconfigCreate(fs); err != nil {
		return -1, fmt.Errorf("mount proc for this pid namespace: %w", err)
	}
	m, err := unix.Fsmount(fs, unix.FSMOUNT_CLOEXEC,
		unix.MOUNT_ATTR_RDONLY|unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOEXEC)
	if err != nil {
		return -1, fmt.Errorf("fsmount proc: %w", err)
	}
	return m, nil
}

// cloneTree opens path in this mount namespace, checks that it is the directory open
// as fd want (unless want < 0), and returns a detached bind mount of it with attrs
// set.
func cloneTree(path string, want int, attrs uint64) (int, error) {
	fd, err := unix.Open(path, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	defer unix.Close(fd)
	if want >= 0 {
		if err := sameDir(fmt.Sprintf("/proc/self/fd/%d", fd), want); err != nil {
			return -1, err
		}
	}
	tree, err := unix.OpenTree(fd, "", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_EMPTY_PATH)
	if err != nil {
		return -1, fmt.Errorf("open_tree: %w", err)
	}
	if err := unix.MountSetattr(tree, "", unix.AT_EMPTY_PATH, &unix.MountAttr{Attr_set: attrs}); err != nil {
		unix.Close(tree)
		return -1, fmt.Errorf("mount_setattr: %w", err)
	}
	return tree, nil
}

// sameDir returns an error unless path and the open fd are the same directory.
func sameDir(path string, fd int) error {
	var a, b unix.Stat_t
	if err := unix.Stat(path, &a); err != nil {
		return err
	}
	if err := unix.Fstat(fd, &b); err != nil {
		return err
	}
	if a.Dev != b.Dev || a.Ino != b.Ino {
		return errors.New("the workspace path no longer names the directory the parent checked")
	}
	return nil
}

// checkThreadList returns an error unless /proc is a procfs of this process's own pid
// namespace, so that /proc/PID/task lists this process's threads. In a new pid
// namespace whose procfs could not be mounted, /proc is the parent's, where PID 1 is
// another process (whose threads psx would wait on, or change instead of ours).
func checkThreadList() error {
	self, err := os.Readlink("/proc/self")
	if err != nil || self != strconv.Itoa(os.Getpid()) {
		return fmt.Errorf("no procfs of this process's pid namespace to find its threads (/proc/self is %q, pid %d)", self, os.Getpid())
	}
	if _, err := os.Stat(fmt.Sprintf("/proc/%d/task/%d", os.Getpid(), unix.Gettid())); err != nil {
		return fmt.Errorf("no procfs of this process's pid namespace to find its threads: %w", err)
	}
	return nil
}

// dropCapabilities empties every capability set of every thread and locks the secure
// bits (libcap's "NOPRIV" mode), so that uid 0 inside the user namespace is worth
// nothing. A worker that has no capability to begin with (an unprivileged parent
// without a user namespace) cannot lock the bits and needs not: its sets are empty.
func dropCapabilities(st *hardened, fail func(string, error)) {
	modeErr := cap.ModeNoPriv.Set()
	if err := cap.NewSet().SetProc(); err != nil && modeErr == nil {
		modeErr = err
	}
	st.enf.Capabilities = cap.GetProc().String()
	if amb, err := cap.GetAmbient(0); err == nil && amb {
		st.enf.Capabilities += " (ambient set not empty)"
	}
	if st.enf.Capabilities != "=" && modeErr != nil {
		fail(protocol.LayerCapabilities, modeErr)
	}
}

// landlockConfigs are go-landlock's presets by ABI version (index 0: none).
var landlockConfigs = []landlock.Config{{}, landlock.V1, landlock.V2, landlock.V3, landlock.V4,
	landlock.V5, landlock.V6, landlock.V7, landlock.V8, landlock.V9, landlock.V10, landlock.V11}

// restrictLandlock enters a Landlock domain built for the kernel's ABI (or the newest
// go-landlock knows): the library read-only, the workspace read-write (no execute,
// no device ioctls, no device, socket or fifo nodes), every other path denied, TCP
// bind and connect denied (ABI 4+), abstract Unix sockets and signals scoped to the
// domain (ABI 6+). Strict, not best effort: the ABI is chosen to match, so an error
// means the domain is not there.
func restrictLandlock(st *hardened) error {
	abi, err := llsys.LandlockGetABIVersion()
	if err != nil {
		return fmt.Errorf("landlock unavailable: %w", err)
	}
	if abi >= len(landlockConfigs) {
		abi = len(landlockConfigs) - 1
	}
	cfg := landlockConfigs[abi]
	denied := landlock.AccessFSSet(llsys.AccessFSExecute | llsys.AccessFSIoctlDev | llsys.AccessFSMakeChar |
		llsys.AccessFSMakeBlock | llsys.AccessFSMakeSock | llsys.AccessFSMakeFifo | llsys.AccessFSResolveUnix)
	read := landlock.AccessFSSet(llsys.AccessFSReadFile | llsys.AccessFSReadDir)
	rules := []landlock.Rule{
		landlock.PathAccess(read&cfg.HandledAccessFS, st.library),
		landlock.PathAccess(cfg.HandledAccessFS&^denied, st.workspace),
	}
	if err := cfg.Restrict(rules...); err != nil {
		return fmt.Errorf("landlock ABI %d: %w", abi, err)
	}
	st.enf.Landlock = protocol.LandlockState{Active: true, ABI: abi, FS: cfg.HandledAccessFS.String(),
		Net: cfg.HandledAccessNet.String(), Scoped: cfg.Scoped.String()}
	return nil
}

// installSeccomp compiles h.Seccomp, installs it on every thread and checks the mode.
func installSeccomp(h protocol.Hardening, st *hardened) error {
	prog, err := seccomp.Compile(*h.Seccomp)
	if err != nil {
		return err
	}
	if err := prog.Install(); err != nil {
		return err
	}
	mode, err := seccomp.Mode()
	if err != nil || mode != 2 {
		return fmt.Errorf("seccomp mode is %d after install (%v)", mode, err)
	}
	st.enf.Seccomp = protocol.SeccompState{Active: true, Mode: "filter", SHA256: prog.SHA256,
		Instructions: prog.Instructions, Arch: prog.Arch, DefaultAction: string(h.Seccomp.DefaultAction)}
	return nil
}
