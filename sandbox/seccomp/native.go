package seccomp

import (
	"slices"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// setID is the set-user-ID and set-group-ID mode bits (S_ISUID, S_ISGID).
const setID = 0o6000

// openCreates are the open(2) flags with which it reads its mode: O_CREAT and
// O_TMPFILE's own bit (__O_TMPFILE).
const openCreates = unix.O_CREAT | 0x400000

// mapSharedAny is the bit MAP_SHARED (0x1) and MAP_SHARED_VALIDATE (0x3) share;
// MAP_PRIVATE (0x2) has it clear.
const mapSharedAny = 0x1

// NativeRules returns the seccomp profile of the native backend: the worker, once
// hardened, replaces itself with Debian's CPython (execve), which keeps this filter,
// and so the kernel's system call surface, narrowed to what CPython and the
// scientific stack (numpy, pandas, matplotlib, scipy, scikit-learn with their BLAS
// threads) call, is the guest's boundary. It was drawn from traces of those
// libraries' own test suites (strace -f -c) and of the Go worker's last steps before
// the exec, grouped below with the reason each group is there. processes lets the
// guest start processes (fork, vfork, clone without CLONE_THREAD, wait); without it
// threads alone work.
//
// Refused with EPERM, by being absent: every call that reaches beyond the process
// or its files: ptrace and process_vm_readv/writev, bpf, io_uring, userfaultfd,
// perf_event_open, keyctl and the other key calls, mount and every new mount API
// call, pivot_root, chroot, unshare, setns, module and kexec loading, memfd_create
// (an executable mapping of memory the guest wrote), socket(2) (no network: the
// guest has socketpair(2) of AF_UNIX only), setrlimit (limits only go down, and
// only the worker sets them; RLIMIT_DATA, whose soft and hard limits are one, is
// the exception: the worker sets it at the exec), personality, and clone with a namespace flag.
//
// No new executable memory (W^X for the guest): mmap with PROT_EXEC is allowed only
// for a file (not MAP_ANONYMOUS), and mprotect/pkey_mprotect never with PROT_EXEC.
// The only files the guest can map executable are the root's (the workspace, /tmp
// and /dev are mounted noexec), so the guest runs Debian's machine code and no code
// of its own making (ctypes still calls what those libraries export: that is the
// system call surface above).
func NativeRules(processes bool) specs.LinuxSeccomp {
	eperm := uint(unix.EPERM)
	rules := []specs.LinuxSyscall{
		// glibc's pthread_create and posix_spawn try clone3 first and fall back to
		// clone on ENOSYS (whose flags, unlike clone3's struct, a filter can read).
		errnoRule(unix.ENOSYS, "clone3"),

		// Starting the guest: the worker's execve of the root's python3 (Landlock
		// lets only the interpreter and the dynamic loader be executed), and what
		// glibc's start-up does in every new program.
		allow("execve", "execveat", "arch_prctl", "set_tid_address", "set_robust_list",
			"get_robust_list", "rseq", "getrlimit"),
		// Reading limits, for this process: prlimit64 with no new limit. Setting
		// one only for RLIMIT_DATA (and no old limit asked): the worker's last step
		// before the exec sets the guest's memory limit, soft and hard alike, so
		// the guest may lower it and never raise it (see worker.execGuest).
		allowIf(append(args(0, ^uint64(0), 0), args(2, ^uint64(0), 0)...), "prlimit64"),
		allowIf(append(append(args(0, ^uint64(0), 0), args(1, ^uint64(0), unix.RLIMIT_DATA)...), args(3, ^uint64(0), 0)...), "prlimit64"),

		// Memory: the heap, anonymous mappings, the dynamic loader's mappings of
		// the root's libraries. No new executable memory (see above).
		// Shared anonymous memory is refused: RLIMIT_DATA does not count it (it is
		// shmem), so it would pass the memory limit (Python's mmap.mmap(-1, n) is
		// such a mapping: it fails with EPERM). An executable mapping is a file's,
		// never writable.
		allow("brk", "munmap", "madvise", "mremap", "msync", "mincore", "mlock", "munlock",
			"get_mempolicy"),
		allowIf(append(args(2, unix.PROT_EXEC, 0), args(3, unix.MAP_ANONYMOUS, 0)...), "mmap"),
		allowIf(append(args(2, unix.PROT_EXEC, 0), args(3, unix.MAP_ANONYMOUS|mapSharedAny, unix.MAP_ANONYMOUS)...), "mmap"),
		allowIf(append(args(2, unix.PROT_EXEC|unix.PROT_WRITE, unix.PROT_EXEC), args(3, unix.MAP_ANONYMOUS, 0)...), "mmap"),
		allowIf(args(2, unix.PROT_EXEC, 0), "mprotect", "pkey_mprotect"),

		// Threads (CPython's, OpenBLAS's, the Go worker's before the exec): clone
		// with CLONE_THREAD and no namespace flag.
		allowIf(args(0, unix.CLONE_THREAD|namespaceFlags, unix.CLONE_THREAD), "clone"),
		allow("futex", "futex_waitv", "gettid", "getpid", "getppid", "exit", "exit_group",
			"sched_yield", "sched_getaffinity", "sched_setaffinity", "sched_getparam",
			"sched_getscheduler", "sched_get_priority_max", "sched_get_priority_min",
			"membarrier", "getcpu", "getpriority"),
		// prctl: thread names, mapping names, reading the seccomp mode and
		// no_new_privs, and setting no_new_privs again (all the Go worker and glibc
		// ask); nothing that changes capabilities or the process's limits.
		allowIf(args(0, ^uint64(0), unix.PR_SET_NAME), "prctl"),
		allowIf(args(0, ^uint64(0), unix.PR_GET_NAME), "prctl"),
		allowIf(args(0, ^uint64(0), unix.PR_SET_VMA), "prctl"),
		allowIf(args(0, ^uint64(0), unix.PR_GET_SECCOMP), "prctl"),
		allowIf(args(0, ^uint64(0), unix.PR_GET_NO_NEW_PRIVS), "prctl"),
		allowIf(args(0, ^uint64(0), unix.PR_SET_NO_NEW_PRIVS), "prctl"),

		// Signals: handlers, masks, waiting for one, and sending one within the
		// guest's own pid namespace (Landlock's signal scope keeps it there too).
		allow("rt_sigaction", "rt_sigprocmask", "rt_sigreturn", "sigaltstack", "rt_sigsuspend",
			"rt_sigtimedwait", "rt_sigpending", "pause", "kill", "tkill", "tgkill",
			"alarm", "setitimer", "getitimer", "timer_create", "timer_settime", "timer_gettime",
			"timer_getoverrun", "timer_delete"),

		// Time.
		// restart_syscall: the kernel resumes a timed wait (futex, nanosleep, poll)
		// that a stop interrupted through it; a session's interpreter is stopped
		// between cells, and glibc aborts when its futex wait fails with EPERM.
		allow("restart_syscall"),
		allow("nanosleep", "clock_nanosleep", "clock_gettime", "clock_getres", "gettimeofday",
			"time", "getrusage", "times", "timerfd_create", "timerfd_settime", "timerfd_gettime"),

		// Identity and the machine, read only.
		allow("getuid", "geteuid", "getgid", "getegid", "getresuid", "getresgid", "getgroups",
			"getpgrp", "getpgid", "getsid", "uname", "sysinfo", "umask"),

		// Descriptors and files. Which paths these reach is Landlock's and the mount
		// namespace's business: the root read-only, /ws and /tmp read-write, no device
		// but /dev/null, zero, full, random and urandom.
		// No fallocate: space reserved without a write passes the workspace quota
		// faster than its measure (EOPNOTSUPP: glibc's posix_fallocate then writes).
		errnoRule(unix.EOPNOTSUPP, "fallocate"),
		allow("read", "write", "readv", "writev", "pread64", "pwrite64", "preadv", "pwritev",
			"preadv2", "pwritev2", "lseek", "close", "close_range", "dup", "dup2", "dup3",
			"flock", "fsync", "fdatasync", "sync_file_range", "ftruncate", "truncate",
			"fadvise64", "readahead", "copy_file_range", "sendfile", "splice", "tee",
			"fstat", "stat", "lstat", "newfstatat", "statx", "statfs", "fstatfs",
			"getdents", "getdents64", "mkdir", "mkdirat", "rmdir", "unlink", "unlinkat", "rename", "renameat", "renameat2",
			"link", "linkat", "symlink", "symlinkat", "readlink", "readlinkat",
			"chown", "fchown", "fchownat", "lchown",
			"utime", "utimes", "utimensat", "futimesat", "access", "faccessat", "faccessat2",
			"getcwd", "chdir", "fchdir",
			"getxattr", "lgetxattr", "fgetxattr", "listxattr", "llistxattr", "flistxattr"),
		// No set-user-ID or set-group-ID bit on a file the guest makes or changes:
		// the workspace is the host's, where it would be honoured. openat2's mode is
		// in a struct the filter cannot read: ENOSYS (glibc and CPython do not use it).
		// (open's mode is read only with O_CREAT or O_TMPFILE: otherwise it is
		// whatever the register held, and the call is allowed whatever it says.)
		allowIf(args(1, setID, 0), "chmod", "fchmod", "creat"),
		allowIf(args(2, setID, 0), "fchmodat", "fchmodat2"),
		allowIf(args(1, openCreates, 0), "open"),
		allowIf(args(2, setID, 0), "open"),
		allowIf(args(2, openCreates, 0), "openat"),
		allowIf(args(3, setID, 0), "openat"),
		errnoRule(unix.ENOSYS, "openat2"),
		// fcntl: descriptors, status flags, record locks, seals, pipe size read; no
		// leases or directory notices (a lease holds whoever opens the file next,
		// the daemon reading a display included).
		allowIf(args(1, ^uint64(0), unix.F_DUPFD), "fcntl"),
		allowIf(args(1, ^uint64(0), unix.F_DUPFD_CLOEXEC), "fcntl"),
		allowIf(args(1, ^uint64(0), unix.F_GETFD), "fcntl"),
		allowIf(args(1, ^uint64(0), unix.F_SETFD), "fcntl"),
		allowIf(args(1, ^uint64(0), unix.F_GETFL), "fcntl"),
		allowIf(args(1, ^uint64(0), unix.F_SETFL), "fcntl"),
		allowIf(args(1, ^uint64(0), unix.F_GETLK), "fcntl"),
		allowIf(args(1, ^uint64(0), unix.F_SETLK), "fcntl"),
		allowIf(args(1, ^uint64(0), unix.F_SETLKW), "fcntl"),
		allowIf(args(1, ^uint64(0), unix.F_OFD_GETLK), "fcntl"),
		allowIf(args(1, ^uint64(0), unix.F_OFD_SETLK), "fcntl"),
		allowIf(args(1, ^uint64(0), unix.F_OFD_SETLKW), "fcntl"),
		allowIf(args(1, ^uint64(0), unix.F_GET_SEALS), "fcntl"),
		allowIf(args(1, ^uint64(0), unix.F_GETPIPE_SZ), "fcntl"),
		// ioctl: is it a terminal, its window size, blocking mode, close-on-exec,
		// bytes waiting to be read.
		allowIf(args(1, ^uint64(0), unix.TCGETS), "ioctl"),
		allowIf(args(1, ^uint64(0), unix.TIOCGWINSZ), "ioctl"),
		// (FIONBIO, FIOCLEX, FIONCLEX, FIONREAD: asm-generic/ioctls.h)
		allowIf(args(1, ^uint64(0), 0x5421), "ioctl"),
		allowIf(args(1, ^uint64(0), 0x5451), "ioctl"),
		allowIf(args(1, ^uint64(0), 0x5450), "ioctl"),
		allowIf(args(1, ^uint64(0), 0x541B), "ioctl"),

		// Pipes, waiting, event loops; Unix socket pairs (asyncio's self-pipe,
		// multiprocessing's connections) and I/O on them. No socket(2).
		allow("pipe", "pipe2", "select", "pselect6", "poll", "ppoll", "epoll_create", "epoll_create1",
			"epoll_ctl", "epoll_wait", "epoll_pwait", "epoll_pwait2", "eventfd", "eventfd2"),
		allowIf(args(0, ^uint64(0), unix.AF_UNIX), "socketpair"),
		// Never out of band: AF_UNIX's out-of-band byte (MSG_OOB) is a seldom used
		// corner of the kernel with a record of memory-safety bugs, and nothing in
		// the stack sends one. The flags are sendmsg's and recvmsg's third argument,
		// the others' fourth.
		allowIf(args(2, unix.MSG_OOB, 0), "sendmsg", "recvmsg"),
		allowIf(args(3, unix.MSG_OOB, 0), "sendto", "recvfrom", "sendmmsg", "recvmmsg"),
		allow("shutdown", "getsockopt", "getsockname", "getpeername"),
	}
	// setsockopt: SOL_SOCKET's buffer, timeout, linger and credential options
	// only. Not a socket filter (SO_ATTACH_FILTER, SO_ATTACH_BPF: a program the
	// kernel runs on every message) nor any other level's options.
	for _, opt := range []uint64{unix.SO_REUSEADDR, unix.SO_SNDBUF, unix.SO_RCVBUF, unix.SO_KEEPALIVE,
		unix.SO_LINGER, unix.SO_PASSCRED, unix.SO_RCVLOWAT, unix.SO_SNDLOWAT, unix.SO_RCVTIMEO,
		unix.SO_SNDTIMEO, unix.SO_RCVTIMEO_NEW, unix.SO_SNDTIMEO_NEW} {
		rules = append(rules, allowIf(append(args(1, ^uint64(0), unix.SOL_SOCKET), args(2, ^uint64(0), opt)...), "setsockopt"))
	}
	rules = append(rules,

		// Randomness.
		allow("getrandom"),
	)
	if processes {
		// Processes: fork, vfork and clone without CLONE_THREAD (never with a
		// namespace flag), waiting for them, process groups. The children keep
		// every layer, count against the same RLIMIT_NPROC and die with pid 1.
		rules = append(rules,
			allowIf(args(0, namespaceFlags, 0), "clone"),
			allow("fork", "vfork", "wait4", "waitid", "setpgid", "setsid", "pidfd_open", "pidfd_send_signal"))
	}
	return specs.LinuxSeccomp{
		DefaultAction:   specs.ActErrno,
		DefaultErrnoRet: &eperm,
		Architectures:   []specs.Arch{specs.ArchX86_64, specs.ArchAARCH64},
		Syscalls:        rules,
	}
}

// WithCheckpoints returns p (a native profile without processes, NativeRules(false))
// for a native session whose interpreter forks a checkpoint of itself before each
// cell: a new process (clone without CLONE_THREAD and without a namespace flag) is
// no longer refused by the filter but notified (SCMP_ACT_NOTIFY) to the daemon,
// which lets exactly the checkpoint's fork through (unotify.Supervise) and refuses every
// other with EPERM, as before; and the interpreter may reap its checkpoints (wait4,
// waitid: with no other child, they find none). fork and vfork stay refused: glibc
// forks with clone.
func WithCheckpoints(p specs.LinuxSeccomp) specs.LinuxSeccomp {
	p.Syscalls = append(slices.Clone(p.Syscalls),
		specs.LinuxSyscall{Names: []string{"clone"}, Action: specs.ActNotify, Args: args(0, unix.CLONE_THREAD|namespaceFlags, 0)},
		allow("wait4", "waitid"))
	return p
}
