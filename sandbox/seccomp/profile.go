package seccomp

import (
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// Rules returns the worker's seccomp profile: the system calls a worker makes once it
// is hardened, measured by tracing real runs (strace -f of `sandcell run` over
// programs that read, write, rename, link, sleep, read stdin and fill memory, with
// and without --cpu and --fuel), grouped below with the reason each group is there.
//
// Everything else fails with EPERM (the default action). Errno rather than kill: a
// denied call then surfaces as an ordinary error in wasmtime or the guest, the worker
// still sends its report, and the run ends with a result the caller can read;
// killing would turn every denied probe into an "internal_error" with no detail.
// A guest that has escaped wasmtime gains nothing from an errno.
//
// Calls that C libraries probe and then fall back from answer ENOSYS, not EPERM:
// glibc's pthread_create tries clone3 first and gives up on EPERM, but falls back to
// clone on ENOSYS, so an EPERM there would kill the first new thread.
func Rules() specs.LinuxSeccomp {
	eperm := uint(unix.EPERM)
	return specs.LinuxSeccomp{
		DefaultAction:   specs.ActErrno,
		DefaultErrnoRet: &eperm,
		Architectures:   []specs.Arch{specs.ArchX86_64, specs.ArchAARCH64},
		Syscalls: []specs.LinuxSyscall{
			// Probed by glibc, which falls back when told the call does not exist:
			// clone3 to clone (whose flags, unlike clone3's struct, a filter can read).
			errnoRule(unix.ENOSYS, "clone3"),

			// Memory: the Go heap, wasmtime's linear memories and guard regions,
			// thread stacks. No new executable mappings: the precompiled module is
			// mapped executable before the filter is installed, and nothing after
			// that needs PROT_EXEC (a guest that escaped cannot map shellcode). No
			// mapping over maxMapping either: RLIMIT_AS would break wasmtime's
			// reservations, so the size of each one is bounded here instead.
			allow("brk", "munmap", "madvise"),
			allowIf(append(args(2, unix.PROT_EXEC, 0), atMost(1, maxMapping)...), "mmap"),
			allowIf(args(2, unix.PROT_EXEC, 0), "mprotect"),
			allowIf(atMost(2, maxMapping), "mremap"),

			// Threads of the Go runtime and of wasmtime (its WASI runs a small tokio
			// pool). clone only for threads: CLONE_THREAD set and no namespace flag,
			// so no fork, no vfork and no new namespaces.
			allowIf(args(0, unix.CLONE_THREAD|namespaceFlags, unix.CLONE_THREAD), "clone"),
			allow("futex", "set_robust_list", "rseq", "set_tid_address", "gettid", "getpid",
				"exit", "exit_group", "sched_yield", "sched_getaffinity", "membarrier"),
			// Thread names (wasmtime's tokio threads), the Go runtime's naming of its
			// mappings, and reading the seccomp mode (the worker checks its own);
			// nothing else of prctl.
			allowIf(args(0, ^uint64(0), unix.PR_SET_NAME), "prctl"),
			allowIf(args(0, ^uint64(0), unix.PR_SET_VMA), "prctl"),
			allowIf(args(0, ^uint64(0), unix.PR_GET_SECCOMP), "prctl"),

			// Signals: the Go runtime's handlers, its preemption of its own threads
			// (tgkill), and wasmtime's trap handling. kill(2) is not here; a worker
			// in its own pid namespace and Landlock's signal scope keep tgkill to
			// itself.
			allow("rt_sigaction", "rt_sigprocmask", "rt_sigreturn", "sigaltstack", "tgkill"),

			// Time: sleeping, clocks (normally the vDSO; these are its fallbacks), and
			// the worker's own CPU time, which enforces the CPU limit.
			// restart_syscall is how the kernel resumes a timed wait that a stop
			// (SIGSTOP, a debugger) interrupted; without it the Go runtime's futex
			// sleeps fail with EPERM after a stop and continue.
			allow("nanosleep", "clock_nanosleep", "clock_gettime", "clock_getres",
				"gettimeofday", "getrusage", "restart_syscall"),

			// I/O on descriptors the worker already holds (guest stdio, control
			// socket, files the guest opened in /ws).
			// pwritev2: wasmtime writes a file opened for appending with RWF_APPEND
			// (the guest's open(f, "a")); preadv2 is its reading twin. Both act on
			// descriptors the worker already has, as pwritev and preadv do.
			allow("read", "write", "readv", "writev", "pread64", "pwrite64", "preadv",
				"pwritev", "preadv2", "pwritev2", "lseek", "close", "fcntl", "fsync", "fdatasync", "ftruncate",
				"fallocate", "fadvise64", "fstat"),
			// ioctl only to ask whether a descriptor is a terminal (isatty) and to
			// set blocking mode.
			allowIf(args(1, ^uint64(0), unix.TCGETS), "ioctl"),
			allowIf(args(1, ^uint64(0), 0x5421), "ioctl"), // FIONBIO (asm-generic/ioctls.h)

			// Files by path, for WASI's view of /ws and the read-only library. Which
			// paths these reach is Landlock's and the mount namespace's business.
			allow("openat", "openat2", "newfstatat", "statx", "getdents64", "mkdirat",
				"unlinkat", "renameat", "renameat2", "symlinkat", "readlinkat", "linkat",
				"utimensat", "faccessat", "faccessat2", "getcwd"),

			// Event loops: the Go netpoller and tokio (epoll, eventfd); waiting on the
			// guest's stdin pipe.
			allow("epoll_create1", "epoll_ctl", "epoll_wait", "epoll_pwait", "epoll_pwait2",
				"eventfd2", "poll", "ppoll"),

			// Randomness for WASI random_get and hash seeds.
			allow("getrandom"),

			// Reading resource limits; setting them is not allowed (prlimit64 with a
			// new limit, or for another process).
			allow("getrlimit"),
			allowIf(append(args(0, ^uint64(0), 0), args(2, ^uint64(0), 0)...), "prlimit64"),
		},
	}
}

// maxMapping is the largest mapping the worker may create: 8 GiB, twice the largest
// wasmtime makes (a linear memory's 4 GiB reservation with its guard region, measured
// at 4,362,076,160 bytes).
const maxMapping = 8 << 30

// namespaceFlags are the clone(2) flags that create namespaces (clone(2), "CLONE_NEW*").
// CLONE_NEWTIME is left out: its bit is part of the exit-signal byte for clone(2) and
// is only accepted by clone3 and unshare, both denied.
const namespaceFlags = unix.CLONE_NEWNS | unix.CLONE_NEWCGROUP | unix.CLONE_NEWUTS |
	unix.CLONE_NEWIPC | unix.CLONE_NEWUSER | unix.CLONE_NEWPID | unix.CLONE_NEWNET

func allow(names ...string) specs.LinuxSyscall {
	return specs.LinuxSyscall{Names: names, Action: specs.ActAllow}
}

func allowIf(conds []specs.LinuxSeccompArg, names ...string) specs.LinuxSyscall {
	return specs.LinuxSyscall{Names: names, Action: specs.ActAllow, Args: conds}
}

func errnoRule(errno unix.Errno, names ...string) specs.LinuxSyscall {
	e := uint(errno)
	return specs.LinuxSyscall{Names: names, Action: specs.ActErrno, ErrnoRet: &e}
}

// atMost is one SCMP_CMP_LE condition: argument index <= max.
func atMost(index uint, max uint64) []specs.LinuxSeccompArg {
	return []specs.LinuxSeccompArg{{Index: index, Value: max, Op: specs.OpLessEqual}}
}

// args is one SCMP_CMP_MASKED_EQ condition: (argument index & mask) == want.
func args(index uint, mask, want uint64) []specs.LinuxSeccompArg {
	return []specs.LinuxSeccompArg{{Index: index, Value: mask, ValueTwo: want, Op: specs.OpMaskedEqual}}
}
