package worker

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
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

// The worker's own root, when it has a mount namespace, holds only these: the guest's
// root directory (preopened as "/") with the workspace mounted at its "ws" and a
// private tmpfs at its "tmp", the interpreter's library, a procfs of its pid
// namespace, and (in a warm worker, until its run is known) the directories its
// run's workspace may be in.
const (
	rootGuest     = "/guest"
	rootWorkspace = rootGuest + "/ws"
	rootTmp       = protocol.GuestTmpDir // rootGuest + "/tmp"
	rootLibrary   = "/lib"
	rootRoots     = "/roots"
)

// tmpInodes bounds the files and directories of the guest's /tmp.
const tmpInodes = 16384

// tmpBytes is the size of the guest's /tmp for req: protocol.DefaultTmpBytes, or its
// workspace's quota where that is smaller (the daemon counts /tmp against the quota
// too). A tmpfs is memory that no memory limit of the run counts (and a session's
// lasts between its cells): a quota is a disk's figure, often gigabytes, so it never
// sizes /tmp alone.
func tmpBytes(req *protocol.Request) int64 {
	if req.WorkspaceQuota > 0 && req.WorkspaceQuota < protocol.DefaultTmpBytes {
		return req.WorkspaceQuota
	}
	return protocol.DefaultTmpBytes
}

// guestDisk is what the worker tells its guest about its storage (see diskField):
// the workspace's quota, the figures of the workspace's file system (see fsFigures:
// read before the seccomp filter, which refuses statfs(2)), and the size of the
// guest's /tmp (0: it has none). A worker serves one run or one session; this is set
// as it gives its guest a workspace and a /tmp (prepare, attach).
var guestDisk struct {
	quota int64
	fs    string
	tmp   int64
}

// hardened is the state of hardening: the contract so far, and where the workspace
// and the interpreter's library are reachable (for the preopens).
type hardened struct {
	enf       protocol.Enforcement
	workspace string
	library   string
	guestRoot string // host directory preopened as the guest's "/", or "" (then the workspace is /ws)
	tmp       string // host directory of the guest's /tmp (a private tmpfs), or "" (it has none)
	warm      bool   // prepared before the run was known (see prepare)
	native    bool   // the native backend: the root is Debian's, the guest is exec'd (see native.go)
	capLock   error  // lockCapabilities' error

	seccomp    *seccomp.Program // compiled ahead by a warm worker, or nil
	seccompErr error
	// listener is the filter's (a program that notifies: a native session's
	// checkpoints, see seccomp.WithCheckpoints), for the parent; nil otherwise.
	listener *os.File
}

// Hardening applies req.Hardening to this process in two steps: prepare, then
// narrow (see those for the order). Neither stops half-way: a layer that fails is
// reported inactive and the caller decides, from Require, whether the guest may run.
// The parent has already made the worker a session leader with a parent-death
// signal, an empty environment, fds 0-5 only and (when asked) its own namespaces.

// prepare does what needs no knowledge of the run beyond its template: it verifies
// the namespaces against the parent's and, with a mount namespace, gives the worker a
// root of its own (pivot). A cold worker's root has the workspace mounted already; a
// warm one's (a template's) has the directories of req.Roots instead, for attach.
func prepare(req *protocol.Request, warm bool) *hardened {
	h := req.Hardening
	st := &hardened{
		enf: protocol.Enforcement{Backend: protocol.BackendWasm, Namespaces: map[string]bool{},
			Rlimits: map[string]uint64{}, Errors: map[string]string{}},
		workspace: fmt.Sprintf("/proc/self/fd/%d", protocol.WorkspaceFD),
		library:   req.LibDir,
		warm:      warm,
		native:    req.Backend == protocol.BackendNative,
	}
	if st.native {
		st.enf.Backend = protocol.BackendNative
	}
	fail := func(layer string, err error) { st.enf.Errors[layer] = err.Error() }
	for layer, name := range protocol.Namespaces() {
		link, err := os.Readlink("/proc/self/ns/" + name)
		host := h.HostNamespaces[name]
		st.enf.Namespaces[layer] = h.Namespaces && err == nil && host != "" && link != host
	}
	if st.enf.Namespaces[protocol.LayerNetNS] {
		if err := emptyNetwork(); err != nil {
			st.enf.Namespaces[protocol.LayerNetNS] = false
			fail(protocol.LayerNetNS, err)
		}
	}
	defer st.lockCaps()
	if warm && h.Seccomp != nil {
		st.seccomp, st.seccompErr = seccomp.Compile(*h.Seccomp)
	}
	if !h.Namespaces {
		setGuestDisk(req, st)
		return st
	}
	if st.enf.Namespaces[protocol.LayerUserNS] && st.enf.Namespaces[protocol.LayerMountNS] {
		ws, tmp := req.Workspace, tmpBytes(req)
		if warm {
			ws, tmp = "", 0 // both mounted once the run is known (attach)
		}
		if st.native {
			if err := pivotNative(req, st.enf.Namespaces[protocol.LayerPidNS]); err != nil {
				st.enf.Namespaces[protocol.LayerMountNS] = false
				fail(protocol.LayerMountNS, err)
			} else {
				st.workspace, st.library, st.guestRoot = GuestWorkdir, "/", "/"
				st.enf.MountRoot = nativeMountRoot(st.enf.Namespaces[protocol.LayerPidNS])
			}
		} else if err := pivot(ws, req.LibDir, req.Roots, st.enf.Namespaces[protocol.LayerPidNS], tmp); err != nil {
			st.enf.Namespaces[protocol.LayerMountNS] = false
			fail(protocol.LayerMountNS, err)
		} else {
			st.workspace, st.library, st.guestRoot = rootWorkspace, rootLibrary, rootGuest
			if !warm {
				st.tmp = rootTmp
			}
			proc := "/proc (read-only, this pid namespace's processes only)"
			if !st.enf.Namespaces[protocol.LayerPidNS] {
				proc = "/proc (read-only, the parent's, its masks kept)"
			}
			st.enf.MountRoot = []string{rootGuest + " (read-only; the guest's /)", rootWorkspace + " (read-write; the guest's /ws)",
				rootTmp + " (read-write, a tmpfs of the run's own and of bounded size; the guest's /tmp)",
				rootLibrary + " (read-only)", proc}
		}
	} else {
		st.enf.Namespaces[protocol.LayerMountNS] = false
	}
	if !warm {
		setGuestDisk(req, st)
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
	return st
}

// emptyNetwork checks that this process's network namespace holds a loopback device
// that is down and nothing else (/proc/self/net/dev, and SIOCGIFFLAGS through a
// socket of no address family's network: AF_UNIX).
func emptyNetwork() error {
	b, err := os.ReadFile("/proc/self/net/dev")
	if err != nil {
		return fmt.Errorf("network devices: %w", err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	for _, l := range lines[min(2, len(lines)):] { // two header lines
		if name, _, _ := strings.Cut(strings.TrimSpace(l), ":"); name != "lo" {
			return fmt.Errorf("the network namespace has a device %q", name)
		}
	}
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("socket: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("loopback flags: %w", err)
	}
	if ifr.Uint16()&unix.IFF_UP != 0 {
		return errors.New("the network namespace's loopback device is up")
	}
	return nil
}

// lockCaps runs lockCapabilities where libcap's psx can find this process's threads
// (see checkThreadList); narrow reports the error if the sets stay non-empty.
func (st *hardened) lockCaps() {
	if err := checkThreadList(); err != nil {
		st.capLock = err
		return
	}
	st.capLock = lockCapabilities()
}

// narrow confines the process to req, in this order, verifying each layer:
//
//  0. a warm worker mounts the run's workspace (attach) and detaches req.Roots
//  1. rlimits       (setrlimit(2): CORE 0, NOFILE, FSIZE, CPU, DATA; NPROC in a
//     userns; the native backend's DATA at its exec, see execGuest)
//  2. capabilities  (libcap: every set emptied on every thread, secure bits locked)
//  3. Landlock      (go-landlock at the kernel's ABI: the library read-only, the
//     workspace read-write, TCP bind/connect denied, abstract sockets and signals
//     scoped)
//  4. no_new_privs  (on every thread)
//  5. seccomp       (libseccomp, TSYNC)
//
// Landlock forbids every change of the mount tree once in force (landlock(7)), which
// is why a warm worker's workspace is mounted first and its domain entered only here.
func narrow(req *protocol.Request, st *hardened) {
	h := req.Hardening
	fail := func(layer string, err error) { st.enf.Errors[layer] = err.Error() }
	if st.warm {
		if st.guestRoot == "" {
			fail(protocol.LayerMountNS, errors.New("a warm worker needs its own mount namespace"))
		} else if err := attach(req, st.enf.Namespaces[protocol.LayerMountNS]); err != nil {
			// The guest must not run without its workspace: report the mount
			// namespace (which holds it) inactive, whatever the policy requires.
			st.enf.Namespaces[protocol.LayerMountNS] = false
			fail(protocol.LayerMountNS, err)
			h.Require = append(h.Require, protocol.LayerMountNS)
			req.Hardening.Require = h.Require
		} else {
			st.tmp = rootTmp
			setGuestDisk(req, st)
		}
	}
	if h.Seccomp != nil && st.seccomp == nil && st.seccompErr == nil {
		// Compiled before the rlimits are set: libseccomp's allocations would count
		// against RLIMIT_DATA, which on the native backend is the guest's memory
		// limit (below about 100 MiB the compilation failed, and every run with it).
		st.seccomp, st.seccompErr = seccomp.Compile(*h.Seccomp)
	}
	setRlimits(h, st, fail)

	// Capabilities and (below ABI 8) Landlock are per thread: libcap's psx applies
	// them to every thread it finds in /proc/PID/task, which must be this process's.
	threads := checkThreadList()
	if threads != nil {
		fail(protocol.LayerCapabilities, threads)
		if h.Landlock {
			fail(protocol.LayerLandlock, threads)
		}
	} else {
		// Landlock first: while the threads still hold CAP_SYS_ADMIN in their user
		// namespace they need no no_new_privs to enter the domain (landlock(7)),
		// which saves a round of signals to every thread.
		if h.Landlock {
			if err := restrictLandlock(st); err != nil {
				fail(protocol.LayerLandlock, err)
			}
		}
		dropCapabilities(st, fail)
	}

	// no_new_privs: on this thread, and seccomp's TSYNC below extends it to every
	// thread it synchronises (seccomp(2)); without a seccomp filter, on every thread.
	var err error
	if threads == nil && h.Seccomp == nil {
		if _, _, e := psx.Syscall6(unix.SYS_PRCTL, unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0, 0); e != 0 {
			err = e
		}
	} else {
		err = unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
	}
	if err != nil {
		fail(protocol.LayerNoNewPrivs, err)
	}
	if threads != nil && h.Seccomp == nil {
		// Set on this thread only, and no seccomp TSYNC to extend it: not the layer.
		fail(protocol.LayerNoNewPrivs, threads)
	}

	nnp, err := unix.PrctlRetInt(unix.PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) // (the filter may deny it)

	st.enf.Seccomp.Mode = "disabled"
	if h.Seccomp != nil {
		if err := installSeccomp(h, st); err != nil {
			fail(protocol.LayerSeccomp, err)
		}
	}
	// On every thread: set by psx, or by the filter's TSYNC.
	st.enf.NoNewPrivs = err == nil && nnp == 1 && (threads == nil || h.Seccomp != nil) &&
		(h.Seccomp == nil || st.enf.Seccomp.Active)
	// A network namespace shared with the other workers keeps them apart only while
	// none can open a socket in it: the filter denies socket(2).
	if h.SharedNetwork && st.enf.Namespaces[protocol.LayerNetNS] &&
		(!st.enf.Seccomp.Active || h.Seccomp == nil || !protocol.DeniesSyscall(*h.Seccomp, "socket")) {
		st.enf.Namespaces[protocol.LayerNetNS] = false
		fail(protocol.LayerNetNS, errors.New("the empty network namespace is shared with other workers, and no seccomp filter in force keeps them from opening sockets in it"))
	}
}

// setRlimits sets the limits of h and reads every one back into the contract. A warm
// worker's CPU limit counts from the run: the CPU time it used before is added.
func setRlimits(h protocol.Hardening, st *hardened, fail func(string, error)) {
	userns := st.enf.Namespaces[protocol.LayerUserNS]
	cpu := h.Rlimits.CPU
	if st.warm && cpu > 0 {
		var ru unix.Rusage
		if unix.Getrusage(unix.RUSAGE_SELF, &ru) == nil {
			cpu += uint64(ru.Utime.Sec+ru.Stime.Sec) + 1
		}
	}
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
		{"DATA", unix.RLIMIT_DATA, h.Rlimits.DATA, h.Rlimits.DATA},
	}
	var errs []string
	for _, r := range set {
		if r.name != "CORE" && r.soft == 0 {
			continue
		}
		if r.name == "DATA" && st.native {
			// Set by execGuest, the last step before the exec: the worker's own
			// mappings may already be past the guest's limit (see execGuest). What
			// would refuse it there is checked here.
			var l unix.Rlimit
			if err := unix.Getrlimit(r.resource, &l); err != nil {
				errs = append(errs, fmt.Sprintf("%s: %v", r.name, err))
			} else if l.Max < r.hard {
				errs = append(errs, fmt.Sprintf("%s: the inherited hard limit (%d) is below %d", r.name, l.Max, r.hard))
			} else {
				st.enf.Rlimits[r.name] = r.soft
			}
			continue
		}
		if r.name == "NPROC" && !userns {
			continue // RLIMIT_NPROC counts per user: it would count every process of the parent's user, the daemon's own included
		}
		if err := unix.Setrlimit(r.resource, &unix.Rlimit{Cur: r.soft, Max: r.hard}); err != nil {
			errs = append(errs, fmt.Sprintf("%s: %v", r.name, err))
		}
	}
	for _, r := range set {
		var l unix.Rlimit
		if r.name == "DATA" && st.native {
			continue
		}
		if unix.Getrlimit(r.resource, &l) == nil && l.Cur != unix.RLIM_INFINITY {
			st.enf.Rlimits[r.name] = l.Cur
		}
	}
	if len(errs) > 0 {
		fail(protocol.LayerRlimits, errors.New(strings.Join(errs, "; ")))
	}
}

// pivot gives the worker a root of its own: a small read-only ramfs holding
// rootGuest (the guest's "/", holding only "ws" and "tmp"), the workspace at
// rootWorkspace (a bind mount: read-write, nosuid, nodev, noexec) and a new tmpfs of
// tmp bytes at rootTmp unless workspace is "", the interpreter's library at
// rootLibrary (read-only), a procfs, and each of roots at
// rootRoots/N (read-write, for attach), with the host's tree detached. Everything
// is reopened by path in this mount namespace (a mount of the parent's namespace
// cannot be bind-mounted here) and the workspace is checked to be the directory the
// parent opened (fd 4), so a path swapped in between is refused. See
// mount_setattr(2), open_tree(2), move_mount(2), pivot_root(2) ("pivot_root(".", ".")").
func pivot(workspace, library string, roots []string, ownPid bool, tmp int64) error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private: %w", err)
	}
	if len(roots) > 8 {
		return errors.New("more than 8 workspace roots")
	}
	data := uint64(unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV | unix.MOUNT_ATTR_NOEXEC)
	mounts := map[string]int{}
	defer func() {
		for _, fd := range mounts {
			unix.Close(fd)
		}
	}()
	var err error
	if workspace != "" {
		if mounts["guest/ws"], err = cloneTree(workspace, protocol.WorkspaceFD, data); err != nil {
			return fmt.Errorf("workspace: %w", err)
		}
		if mounts["guest/tmp"], err = guestTmpfs(tmp); err != nil {
			return err
		}
	}
	if mounts["lib"], err = cloneTree(library, -1, unix.MOUNT_ATTR_RDONLY|data); err != nil {
		return fmt.Errorf("library: %w", err)
	}
	for i, r := range roots {
		if mounts[fmt.Sprintf("roots/%d", i)], err = cloneTree(r, -1, data); err != nil {
			return fmt.Errorf("workspace root %d (%s): %w", i, r, err)
		}
	}
	if mounts["proc"], err = procMount(ownPid); err != nil {
		return err
	}

	// ramfs, not tmpfs: ramfs records no birth time, which WASI reports as a file's
	// ctime, and so a guest cannot learn from its "/" when a warm worker was made.
	// (It is read-only before anything runs, so tmpfs's size bounds are not needed.)
	fs, err := unix.Fsopen("ramfs", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return fmt.Errorf("fsopen ramfs: %w", err)
	}
	defer unix.Close(fs)
	if err := unix.FsconfigSetString(fs, "mode", "0755"); err != nil {
		return fmt.Errorf("ramfs mode: %w", err)
	}
	if err := unix.FsconfigCreate(fs); err != nil {
		return fmt.Errorf("ramfs: %w", err)
	}
	root, err := unix.Fsmount(fs, unix.FSMOUNT_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("fsmount: %w", err)
	}
	defer unix.Close(root)
	// Attach the new root somewhere in this (private) namespace so that mounts can go
	// beneath it and pivot_root accepts it; where does not matter once pivoted.
	if err := unix.MoveMount(root, "", unix.AT_FDCWD, library, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("attach new root: %w", err)
	}
	dirs := []string{"guest", "guest/ws", "guest/tmp", "lib", "proc"}
	if len(roots) > 0 {
		dirs = append(dirs, "roots")
	}
	for i := range roots {
		dirs = append(dirs, fmt.Sprintf("roots/%d", i))
	}
	for _, name := range dirs {
		if err := unix.Mkdirat(root, name, 0o755); err != nil {
			return fmt.Errorf("mkdir %s: %w", name, err)
		}
	}
	for name, tree := range mounts {
		if err := unix.MoveMount(tree, "", root, name, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
			return fmt.Errorf("mount %s: %w", name, err)
		}
	}
	if err := unix.MountSetattr(root, "", unix.AT_EMPTY_PATH, &unix.MountAttr{
		Attr_set: unix.MOUNT_ATTR_RDONLY | data,
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
	if workspace != "" {
		if err := sameDir(rootWorkspace, protocol.WorkspaceFD); err != nil {
			return err
		}
	}
	// fd 4 is a directory of the parent's mount tree: from it, ".." leads to the host.
	return unix.Close(protocol.WorkspaceFD)
}

// attach mounts the workspace of req, a claim on a warm worker, at rootWorkspace:
// the directory is found beneath the root of req.Roots that holds req.Workspace
// (see walkBeneath) and must be the one the parent checked (req.WorkspaceID); then
// every root is detached, so that nothing but this workspace stays reachable.
func attach(req *protocol.Request, mntns bool) error {
	if !mntns {
		return errors.New("no mount namespace to mount the workspace in")
	}
	if req.WorkspaceID == nil {
		return errors.New("the claim does not identify its workspace")
	}
	var dir int = -1
	for i, r := range req.Roots {
		rel, err := filepath.Rel(r, req.Workspace)
		if err != nil || rel == ".." || strings.HasPrefix(rel, "../") || rel == "." {
			continue
		}
		if dir, err = walkBeneath(fmt.Sprintf("%s/%d", rootRoots, i), rel); err != nil {
			return fmt.Errorf("workspace: %w", err)
		}
		break
	}
	if dir < 0 {
		return errors.New("the workspace is not beneath a root this worker holds")
	}
	defer unix.Close(dir)
	var st unix.Stat_t
	if err := unix.Fstat(dir, &st); err != nil {
		return err
	}
	if uint64(st.Dev) != req.WorkspaceID.Dev || st.Ino != req.WorkspaceID.Ino {
		return errors.New("the workspace path no longer names the directory the parent checked")
	}
	tree, err := unix.OpenTree(dir, "", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_EMPTY_PATH)
	if err != nil {
		return openTreeError(err)
	}
	defer unix.Close(tree)
	if err := unix.MountSetattr(tree, "", unix.AT_EMPTY_PATH, &unix.MountAttr{
		Attr_set: unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV | unix.MOUNT_ATTR_NOEXEC}); err != nil {
		return fmt.Errorf("mount_setattr: %w", err)
	}
	if err := unix.MoveMount(tree, "", unix.AT_FDCWD, rootWorkspace, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("mount the workspace: %w", err)
	}
	// The guest's /tmp is made now, for this run: its times (a tmpfs records when it
	// was made) tell the guest nothing of when the worker was warmed.
	tmp, err := guestTmpfs(tmpBytes(req))
	if err != nil {
		return err
	}
	defer unix.Close(tmp)
	if err := unix.MoveMount(tmp, "", unix.AT_FDCWD, rootTmp, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("mount the guest's /tmp: %w", err)
	}
	for i := range req.Roots {
		if err := unix.Unmount(fmt.Sprintf("%s/%d", rootRoots, i), unix.MNT_DETACH); err != nil {
			return fmt.Errorf("detach workspace root %d: %w", i, err)
		}
	}
	return stampGuestRoot()
}

// guestTmpfs returns a detached tmpfs of size bytes for the guest's /tmp (read-write,
// nosuid, nodev, noexec; mode 1777 as a /tmp; at most tmpInodes files). It lives in
// this worker's mount namespace alone, so no other run sees it, and it is gone with
// the worker: nothing is left on the host to remove. Its pages are memory, bounded by
// size (and counted against the workspace's quota by the daemon, see
// protocol.GuestTmpDir).
func guestTmpfs(size int64) (int, error) {
	if size <= 0 {
		size = protocol.DefaultTmpBytes
	}
	return tmpfs(fmt.Sprintf("size=%d,nr_inodes=%d,mode=1777", size, tmpInodes),
		unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOEXEC)
}

// setGuestDisk records what the guest of req is told about its storage (see
// guestDisk) once st has given it its workspace and /tmp.
func setGuestDisk(req *protocol.Request, st *hardened) {
	guestDisk.quota, guestDisk.fs, guestDisk.tmp = req.WorkspaceQuota, "", 0
	if req.WorkspaceQuota <= 0 {
		guestDisk.fs, _ = fsFigures(st.workspace)
	}
	if st.tmp != "" {
		guestDisk.tmp = tmpBytes(req)
	}
}

// stampGuestRoot sets the access, modification and change times of the guest's "/"
// to now. The directory was made when the worker was warmed, and a guest that reads
// its times (os.stat("/")) would otherwise learn when the previous run in the pool
// ended. The root is read-only while anything else runs, so it is made writable
// for this one change (mount_setattr(2), utimensat(2)).
func stampGuestRoot() error {
	set := func(attr *unix.MountAttr) error { return unix.MountSetattr(unix.AT_FDCWD, "/", 0, attr) }
	if err := set(&unix.MountAttr{Attr_clr: unix.MOUNT_ATTR_RDONLY}); err != nil {
		return fmt.Errorf("root writable: %w", err)
	}
	err := unix.UtimesNanoAt(unix.AT_FDCWD, rootGuest, nil, unix.AT_SYMLINK_NOFOLLOW)
	if e := set(&unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY}); e != nil {
		return fmt.Errorf("root read-only again: %w", e)
	}
	if err != nil {
		return fmt.Errorf("guest root times: %w", err)
	}
	return nil
}

// walkBeneath opens the directory rel (relative, clean) beneath root one component
// at a time with O_NOFOLLOW, so no symbolic link is followed and nothing above root
// is reached. (openat2(2) RESOLVE_BENEATH would do it in one call, but container
// runtimes' seccomp filters, systemd-nspawn's among them, may answer it ENOSYS.)
func walkBeneath(root, rel string) (int, error) {
	fd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	for _, name := range strings.Split(rel, "/") {
		if name == "" || name == "." || name == ".." {
			unix.Close(fd)
			return -1, fmt.Errorf("%q is not a plain relative path", rel)
		}
		next, err := unix.Openat(fd, name, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		unix.Close(fd)
		if err != nil {
			return -1, err
		}
		fd = next
	}
	return fd, nil
}

// procMount returns a detached procfs of the worker's pid namespace showing only its
// process directories (subset=pid: no /proc/sys, no kernel files), read-only. The
// worker needs it for one thing: libcap's psx, which changes the capabilities and
// Landlock domain of every thread, finds the threads in /proc/PID/task. Landlock
// then denies the guest any access to it. See proc(5), "subset".
//
// Without a pid namespace of its own (ownPid false: the parent found that the kernel
// refuses a new procfs, see protocol.ProbeProcfs), the parent's /proc already lists this
// process's threads: it is cloned with its submounts (a container's masks stay,
// locked by the user namespace) and made read-only.
func procMount(ownPid bool) (int, error) {
	if !ownPid {
		m, err := unix.OpenTree(unix.AT_FDCWD, "/proc", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE)
		if err != nil {
			return -1, fmt.Errorf("clone /proc: %w", err)
		}
		attr := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV | unix.MOUNT_ATTR_NOEXEC}
		if err := unix.MountSetattr(m, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, attr); err != nil {
			unix.Close(m)
			return -1, fmt.Errorf("/proc read-only: %w", err)
		}
		return m, nil
	}
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
		return -1, openTreeError(err)
	}
	if err := unix.MountSetattr(tree, "", unix.AT_EMPTY_PATH, &unix.MountAttr{Attr_set: attrs}); err != nil {
		unix.Close(tree)
		return -1, fmt.Errorf("mount_setattr: %w", err)
	}
	return tree, nil
}

// openTreeError says why open_tree(2) could not clone a directory. The mounts this
// namespace copied from the parent's are locked to the mounts beneath them
// (mount_namespaces(7)), so a directory with a mount beneath it is cloned only with
// that mount, which the worker does not ask for (see sandbox.CheckRoots).
func openTreeError(err error) error {
	if errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("open_tree: %w (a mount beneath the directory, which cannot be left out here, or an unbindable mount)", err)
	}
	return fmt.Errorf("open_tree: %w", err)
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

// lockCapabilities makes sure no capability can be gained or kept across execve(2)
// (capabilities(7)): the secure bits of libcap's "NOPRIV" mode set and locked, the
// bounding set emptied (one capability at a time, each on every thread), the
// ambient set cleared. It leaves the worker's current sets alone (a warm worker
// still mounts its workspace), so it runs before the run is known; dropCapabilities
// then empties the sets with one call.
func lockCapabilities() error {
	var errs []error
	if _, err := cap.GetAmbient(0); err == nil {
		errs = append(errs, cap.ResetAmbient())
	}
	bits := cap.SecbitNoRoot | cap.SecbitNoRootLocked | cap.SecbitNoSetUIDFixup | cap.SecbitNoSetUIDFixupLocked |
		cap.SecbitKeepCapsLocked | cap.SecbitNoCapAmbientRaise | cap.SecbitNoCapAmbientRaiseLocked
	errs = append(errs, bits.Set())
	for c := cap.Value(0); c < cap.MaxBits(); c++ {
		errs = append(errs, cap.DropBound(c))
	}
	return errors.Join(errs...)
}

// dropCapabilities empties every capability set of every thread, so that uid 0
// inside the user namespace is worth nothing (with lockCapabilities: libcap's
// "NOPRIV" mode). A worker that has no capability to begin with (an unprivileged
// parent without a user namespace) cannot lock the bits and needs not: its sets are
// empty.
func dropCapabilities(st *hardened, fail func(string, error)) {
	err := st.capLock
	if e := cap.NewSet().SetProc(); e != nil && err == nil {
		err = e
	}
	st.enf.Capabilities = cap.GetProc().String()
	if amb, e := cap.GetAmbient(0); e == nil && amb {
		st.enf.Capabilities += " (ambient set not empty)"
	}
	if st.enf.Capabilities != "=" && err != nil {
		fail(protocol.LayerCapabilities, err)
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
	if st.tmp != "" && !st.native {
		rules = append(rules, landlock.PathAccess(cfg.HandledAccessFS&^denied, st.tmp))
	}
	if st.native {
		native, err := nativeLandlockRules(cfg.HandledAccessFS, denied)
		if err != nil {
			return fmt.Errorf("landlock ABI %d: %w", abi, err)
		}
		rules = append(rules, native...)
	}
	// libcap's psx lists this process's threads for every later change made on
	// all of them (the capabilities): that directory stays readable, nothing in it.
	rules = append(rules, landlock.PathAccess(llsys.AccessFSReadDir&cfg.HandledAccessFS,
		fmt.Sprintf("/proc/%d/task", os.Getpid())))
	if st.guestRoot != "" && !st.native {
		// The guest may list its "/" (which holds only "ws" and "tmp").
		rules = append(rules, landlock.PathAccess(llsys.AccessFSReadDir&cfg.HandledAccessFS, st.guestRoot))
	}
	// go-landlock builds the ruleset; it is entered on every thread with one round
	// of libcap's psx. A thread without CAP_SYS_ADMIN in its user namespace needs
	// no_new_privs first (landlock_restrict_self(2)).
	fd, flags, err := cfg.NewRulesetFD(rules...)
	if err != nil {
		return fmt.Errorf("landlock ABI %d: %w", abi, err)
	}
	if fd < 0 {
		return fmt.Errorf("landlock ABI %d: nothing to restrict", abi)
	}
	defer unix.Close(fd)
	if c, err := cap.GetProc().GetFlag(cap.Effective, cap.SYS_ADMIN); err != nil || !c {
		if _, _, e := psx.Syscall6(unix.SYS_PRCTL, unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0, 0); e != 0 {
			return fmt.Errorf("prctl(PR_SET_NO_NEW_PRIVS): %w", e)
		}
	}
	if err := llsys.AllThreadsLandlockRestrictSelf(fd, uint32(flags)); err != nil {
		return fmt.Errorf("landlock ABI %d: landlock_restrict_self: %w", abi, err)
	}
	st.enf.Landlock = protocol.LandlockState{Active: true, ABI: abi, FS: cfg.HandledAccessFS.String(),
		Net: cfg.HandledAccessNet.String(), Scoped: cfg.Scoped.String()}
	return nil
}

// installSeccomp compiles h.Seccomp, installs it on every thread and checks the mode.
func installSeccomp(h protocol.Hardening, st *hardened) error {
	prog, err := st.seccomp, st.seccompErr
	if prog == nil && err == nil {
		prog, err = seccomp.Compile(*h.Seccomp)
	}
	if err != nil {
		return err
	}
	if prog.Notifies {
		if st.listener, err = prog.InstallListener(); err != nil {
			return err
		}
	} else if err := prog.Install(); err != nil {
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
