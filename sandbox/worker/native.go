package worker

import (
	"debug/elf"
	_ "embed"
	"errors"
	"fmt"
	"maps"
	"os"
	"runtime"
	"slices"
	"strings"
	"unsafe"

	"github.com/landlock-lsm/go-landlock/landlock"
	llsys "github.com/landlock-lsm/go-landlock/landlock/syscall"
	"golang.org/x/sys/unix"

	"github.com/sandcell/sandcell/sandbox/protocol"
	"github.com/sandcell/sandcell/sandbox/seccomp"
)

// The native backend. The worker hardens itself exactly as for a wasm run (the same
// namespaces, rlimits, capabilities, Landlock and no_new_privs, with the native
// seccomp profile and a root of Debian's files instead of the interpreter's
// library), reports the contract (StepExec), and then replaces itself with the
// root's python3 (execve(2)), which keeps every layer: nothing of the worker's Go
// code is left in the guest's process.
//
// The guest's root, in the worker's mount namespace:
//
//	/       the native root (read-only, nosuid, nodev: its files alone may be mapped executable)
//	/ws     the workspace (read-write, nosuid, nodev, noexec)
//	/tmp    a private tmpfs of Hardening.TmpBytes (read-write, nosuid, nodev, noexec)
//	/proc   a procfs of the worker's pid namespace (subset=pid, read-only)
//	/dev    a read-only tmpfs holding null, zero, full, random and urandom (the host's
//	        devices, bound; nosuid, noexec) and the fd, stdin, stdout, stderr links
const (
	nativePython = "/usr/bin/python3.13"
	nativeTmp    = protocol.NativeTmp
)

// nativeDevices are the device nodes the native guest gets in /dev, and whether it
// may write to each.
var nativeDevices = map[string]bool{"null": true, "zero": true, "full": true, "random": false, "urandom": false}

// native serves a run (or, with session, a session: StepSession) on the native
// backend: prepare (namespaces, the native root), stdin, narrow, the contract, then
// the exec. It returns only if the guest could not be started; the reply then says
// why.
func native(r *reply, req *protocol.Request, session bool) {
	var rep protocol.Report
	defer func() { recoverReport(&rep); r.send(rep) }()
	if msg := check(req); msg != "" {
		rep = failed(msg)
		return
	}
	if req.RootDir == "" {
		rep = failed("a native run names no root file system")
		return
	}
	if session && (req.Resume || req.Fork || len(req.Preimport) > 0) {
		rep = failed("a native session is never resumed or forked (its checkpoints are processes, never saved), and imports nothing before its cells")
		return
	}
	st := prepare(req, false)
	args := []string{"python3", "-I", "-B", "-c", protocol.NativeRunner()}
	if (session || len(req.Preimport) > 0) && checkpoints(req, st) {
		// A session's interpreter (a warm worker's, if it is claimed for one) forks
		// a checkpoint of itself before each cell, which the filter lets through
		// only where the parent, given its listener, says so
		// (seccomp.WithCheckpoints); this process stays pid 1, the reaper, and
		// runs no cell.
		p := seccomp.WithCheckpoints(*req.Hardening.Seccomp)
		req.Hardening.Seccomp = &p
		args = append(args, "checkpoints")
	}
	switch {
	case session:
		// Cells come on the control fd; stdin stays the parent's /dev/null.
		args = append(args, "session")
	case len(req.Preimport) > 0:
		// A warm worker: stdin is the parent's pipe, which holds nothing until the
		// run is known (see protocol.Request.Preimport).
		for _, m := range req.Preimport {
			if !protocol.ModuleName(m) {
				rep = failed(fmt.Sprintf("cannot preimport %q: not a dotted module name", m))
				return
			}
		}
		args = append(append(args, "preimport"), req.Preimport...)
	default:
		if err := nativeStdin(req); err != nil {
			rep = failed("cannot prepare stdin: " + err.Error())
			return
		}
	}
	narrow(req, st)
	var ok bool
	if rep, ok = contract(req, st); !ok {
		return
	}
	r.st = st
	if !st.enf.Namespaces[protocol.LayerMountNS] {
		// Without a root of its own the worker cannot reach the native root's
		// interpreter by its guest path: refuse rather than run the host's.
		rep = failed("the native backend needs the worker's own mount namespace (mntns): " + st.enf.Errors[protocol.LayerMountNS])
		return
	}
	enf := st.enf
	exec := protocol.Frame{Step: protocol.StepExec, Report: &protocol.Report{Enforcement: &enf}}
	var err error
	if st.listener != nil {
		// The listener goes to the parent with the contract, and is closed here
		// before the exec: the guest never holds what answers its own calls.
		err = protocol.SendFile(r.ctl, exec, st.listener)
		st.listener.Close()
	} else if slices.Contains(args, "checkpoints") {
		rep = failed("the session's seccomp filter has no listener for its checkpoints")
		return
	} else {
		err = protocol.Send(r.ctl, exec)
	}
	if err != nil {
		r.ok = false
		r.once.Do(func() {}) // the parent is gone: nothing to report to
		return
	}
	if len(req.Preimport) > 0 {
		// A warm worker's interpreter starts and imports away from the workspace
		// (see the runner's _sandcell_preimport, sandbox/protocol/native.py); the runner goes to /ws at the claim.
		if err := unix.Chdir("/"); err != nil {
			fmt.Fprintf(os.Stderr, "sandcell: %v\n", err)
			os.Exit(127)
		}
	}
	execGuest(nativePython, args, protocol.NativeEnv(req.Env), req.Hardening.Rlimits.DATA)
}

// execGuest sets RLIMIT_DATA to data (soft and hard; 0 leaves it as inherited) and
// replaces the worker with path (execve(2)); it returns never. The contract is sent
// by then, so a failure is said on the guest's stderr and the worker ends as a shell
// does for a program it cannot run (127): no guest code runs without the limit.
//
// The limit is the last step, with nothing of the Go runtime's between it and the
// exec (both raw system calls, on this thread, with the vectors built beforehand):
// RLIMIT_DATA counts every private writable mapping, the worker's heap and its
// threads' stacks (8 MiB each) included, which may already be past the guest's
// limit (policy's least is 32 MiB). Set any earlier, a thread the runtime starts
// or a page of its metadata fails the worker ("pthread_create failed", "runtime:
// cannot allocate memory": seen under load). The native seccomp filter lets the
// process set RLIMIT_DATA on itself, and nothing else (seccomp.NativeRules).
func execGuest(path string, args, env []string, data uint64) {
	argv0, err := unix.BytePtrFromString(path)
	var argv, envv []*byte
	if err == nil {
		argv, err = cStrings(args)
	}
	if err == nil {
		envv, err = cStrings(env)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "sandcell: cannot start the native interpreter: %v\n", err)
		os.Exit(127)
	}
	runtime.LockOSThread()
	step := "set the memory limit (RLIMIT_DATA)"
	lim := unix.Rlimit{Cur: data, Max: data}
	var e unix.Errno
	if data > 0 {
		_, _, e = unix.RawSyscall6(unix.SYS_PRLIMIT64, 0, unix.RLIMIT_DATA, uintptr(unsafe.Pointer(&lim)), 0, 0, 0)
	}
	if e == 0 {
		step = "start the native interpreter"
		_, _, e = unix.RawSyscall(unix.SYS_EXECVE, uintptr(unsafe.Pointer(argv0)),
			uintptr(unsafe.Pointer(&argv[0])), uintptr(unsafe.Pointer(&envv[0])))
	}
	runtime.KeepAlive(argv0)
	runtime.KeepAlive(argv)
	runtime.KeepAlive(envv)
	// With the limit set, nothing may allocate: the parts are written as they are.
	for _, s := range []string{"sandcell: cannot ", step, ": ", e.Error(), "\n"} {
		unix.Write(2, unsafe.Slice(unsafe.StringData(s), len(s)))
	}
	unix.Exit(127)
}

// cStrings is ss as execve(2)'s NUL-terminated vector of NUL-terminated strings.
func cStrings(ss []string) ([]*byte, error) {
	v := make([]*byte, len(ss)+1)
	for i, s := range ss {
		p, err := unix.BytePtrFromString(s)
		if err != nil {
			return nil, err
		}
		v[i] = p
	}
	return v, nil
}

// checkpoints says a native session's interpreter keeps a checkpoint of itself (a
// fork before each cell): where its guest may not start processes (with processes
// on, a checkpoint could not be told from them), under a seccomp filter (which
// gates the fork), in a pid namespace of its own (pid 1, the reaper, outlives the
// interpreter it replaces with the checkpoint, and the parent can find every
// process of the session to end those a cell left).
func checkpoints(req *protocol.Request, st *hardened) bool {
	return !req.Hardening.Processes && req.Hardening.Seccomp != nil && st.enf.Namespaces[protocol.LayerPidNS]
}

// mfdNoexecSeal is MFD_NOEXEC_SEAL (linux/memfd.h).
const mfdNoexecSeal = 0x8

// nativeStdin makes fd 0 a sealed memory file holding req's program (the header
// the runner reads, see Program) and then its stdin: a file, since the worker that
// would feed a pipe is gone after the exec; sealed, so the guest cannot grow it.
// It is made before the seccomp filter, which refuses memfd_create.
func nativeStdin(req *protocol.Request) error {
	prog, err := Program(req)
	if err != nil {
		return err
	}
	// Not executable (MFD_NOEXEC_SEAL, Linux 6.3): its bytes are the caller's, and
	// must not become machine code the guest maps.
	fd, err := unix.MemfdCreate("stdin", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING|mfdNoexecSeal)
	if errors.Is(err, unix.EINVAL) {
		fd, err = unix.MemfdCreate("stdin", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	}
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), "stdin")
	defer f.Close()
	if _, err := f.Write(append(prog, req.Stdin...)); err != nil {
		return err
	}
	if _, err := f.Seek(0, 0); err != nil {
		return err
	}
	seals := unix.F_SEAL_SEAL | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_WRITE
	if _, err := unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, seals); err != nil {
		return err
	}
	return unix.Dup3(fd, 0, 0)
}

// pivotNative gives the worker the native root (see the layout above) and pivots
// into it. As in pivot, every mount is made detached from a path reopened in this
// namespace and the workspace is checked to be the directory the parent opened.
func pivotNative(req *protocol.Request, ownPid bool) error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private: %w", err)
	}
	data := uint64(unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV | unix.MOUNT_ATTR_NOEXEC)
	var fds []int
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	keep := func(fd int, err error) (int, error) {
		if err == nil {
			fds = append(fds, fd)
		}
		return fd, err
	}
	root, err := keep(cloneTree(req.RootDir, -1, unix.MOUNT_ATTR_RDONLY|unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV))
	if err != nil {
		return fmt.Errorf("native root: %w", err)
	}
	ws, err := keep(cloneTree(req.Workspace, protocol.WorkspaceFD, data))
	if err != nil {
		return fmt.Errorf("workspace: %w", err)
	}
	proc, err := keep(procMount(ownPid))
	if err != nil {
		return err
	}
	size := req.Hardening.TmpBytes
	if size <= 0 {
		size = 64 << 20
	}
	tmp, err := keep(tmpfs(fmt.Sprintf("size=%d,mode=1777,nr_inodes=16384", size), data))
	if err != nil {
		return fmt.Errorf("/tmp: %w", err)
	}
	dev, err := keep(tmpfs("size=64k,mode=0755,nr_inodes=64", unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NOEXEC))
	if err != nil {
		return fmt.Errorf("/dev: %w", err)
	}
	nodes := map[string]int{}
	for _, name := range slices.Sorted(maps.Keys(nativeDevices)) {
		f, err := unix.Openat(dev, name, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o666)
		if err != nil {
			return fmt.Errorf("/dev/%s: %w", name, err)
		}
		unix.Close(f)
		if nodes[name], err = keep(cloneDevice("/dev/" + name)); err != nil {
			return fmt.Errorf("/dev/%s: %w", name, err)
		}
	}
	for name, target := range map[string]string{"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0",
		"stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2"} {
		if err := unix.Symlinkat(target, dev, name); err != nil {
			return fmt.Errorf("/dev/%s: %w", name, err)
		}
	}
	// Attach the root somewhere in this (private) namespace so that mounts can go
	// beneath it and pivot_root accepts it; where does not matter once pivoted.
	if err := unix.MoveMount(root, "", unix.AT_FDCWD, req.RootDir, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("attach the native root: %w", err)
	}
	for _, m := range []struct {
		fd   int
		at   int
		name string
	}{{ws, root, "ws"}, {tmp, root, "tmp"}, {proc, root, "proc"}, {dev, root, "dev"}} {
		if err := unix.MoveMount(m.fd, "", m.at, m.name, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
			return fmt.Errorf("mount /%s: %w", m.name, err)
		}
	}
	for name, node := range nodes {
		if err := unix.MoveMount(node, "", dev, name, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
			return fmt.Errorf("mount /dev/%s: %w", name, err)
		}
	}
	if err := unix.MountSetattr(dev, "", unix.AT_EMPTY_PATH, &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY}); err != nil {
		return fmt.Errorf("/dev read-only: %w", err)
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
	if err := unix.Chdir(GuestWorkdir); err != nil {
		return err
	}
	if err := sameDir(GuestWorkdir, protocol.WorkspaceFD); err != nil {
		return err
	}
	return unix.Close(protocol.WorkspaceFD)
}

// tmpfs returns a detached tmpfs mounted with options (comma-separated key=value)
// and attrs.
func tmpfs(options string, attrs uint64) (int, error) {
	fs, err := unix.Fsopen("tmpfs", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("fsopen tmpfs: %w", err)
	}
	defer unix.Close(fs)
	for _, kv := range strings.Split(options, ",") {
		k, v, _ := strings.Cut(kv, "=")
		if err := unix.FsconfigSetString(fs, k, v); err != nil {
			return -1, fmt.Errorf("tmpfs %s: %w", kv, err)
		}
	}
	if err := unix.FsconfigCreate(fs); err != nil {
		return -1, fmt.Errorf("tmpfs: %w", err)
	}
	m, err := unix.Fsmount(fs, unix.FSMOUNT_CLOEXEC, int(attrs))
	if err != nil {
		return -1, fmt.Errorf("fsmount tmpfs: %w", err)
	}
	return m, nil
}

// nativeMountRoot is the contract's description of the native root.
func nativeMountRoot(ownPid bool) []string {
	proc := "/proc (read-only, this pid namespace's processes only)"
	if !ownPid {
		proc = "/proc (read-only, the parent's, its masks kept)"
	}
	return []string{"/ (the native root, read-only)", "/ws (read-write, noexec)",
		"/tmp (read-write, private tmpfs, noexec)", proc,
		"/dev (read-only: null, zero, full, random, urandom)"}
}

// interpreterPath returns the program interpreter (PT_INTERP, the dynamic loader)
// of the ELF file at path, which Landlock must let be executed with it.
func interpreterPath(path string) (string, error) {
	f, err := elf.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			b := make([]byte, p.Filesz)
			if _, err := p.ReadAt(b, 0); err != nil {
				return "", err
			}
			return strings.TrimRight(string(b), "\x00"), nil
		}
	}
	return "", errors.New("no program interpreter")
}

// nativeLandlockRules are the native guest's paths beyond the root (read-only, from
// the caller's first rule) and the workspace: /tmp as the workspace; the interpreter
// and its dynamic loader executable, and nothing else; the writable devices read
// and written, the random ones read.
func nativeLandlockRules(handled landlock.AccessFSSet, denied landlock.AccessFSSet) ([]landlock.Rule, error) {
	loader, err := interpreterPath(nativePython)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", nativePython, err)
	}
	exec := landlock.AccessFSSet(llsys.AccessFSExecute|llsys.AccessFSReadFile) & handled
	rules := []landlock.Rule{
		landlock.PathAccess(handled&^denied, nativeTmp),
		landlock.PathAccess(exec, nativePython, loader),
	}
	rw := landlock.AccessFSSet(llsys.AccessFSReadFile|llsys.AccessFSWriteFile|llsys.AccessFSTruncate) & handled
	for _, name := range slices.Sorted(maps.Keys(nativeDevices)) {
		access := landlock.AccessFSSet(llsys.AccessFSReadFile) & handled
		if nativeDevices[name] {
			access = rw
		}
		rules = append(rules, landlock.PathAccess(access, "/dev/"+name))
	}
	return rules, nil
}

// cloneDevice returns a detached bind mount (nosuid, noexec) of the character device
// at path.
func cloneDevice(path string) (int, error) {
	fd, err := unix.Open(path, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return -1, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFCHR {
		return -1, errors.New("not a character device")
	}
	tree, err := unix.OpenTree(fd, "", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_EMPTY_PATH)
	if err != nil {
		return -1, openTreeError(err)
	}
	if err := unix.MountSetattr(tree, "", unix.AT_EMPTY_PATH, &unix.MountAttr{
		Attr_set: unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NOEXEC}); err != nil {
		unix.Close(tree)
		return -1, fmt.Errorf("mount_setattr: %w", err)
	}
	return tree, nil
}
