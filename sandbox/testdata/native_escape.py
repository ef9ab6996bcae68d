# The native escape probes (sandbox/native_escape_test.go, TestNativeEscapeMatrix).
#
# On the native backend the guest is native code already, so the attacker is this: a
# Python program in a real native run that calls the kernel directly (ctypes: libc's
# syscall(), mmap, mprotect) or through os and socket. Every probe aims at something
# outside the run (the test's host directory, its listeners, the test process itself,
# the kernel's wider surface) and ends in one of: "ESCAPED" (the call did what it
# asked), the name of the errno that stopped it, or "no escape: WHY" (the call worked
# but reached only the guest's own things). The outcomes go to stdout as one JSON
# object, name -> outcome, with "(isolated)" and "(seconds)" saying how they ran.
#
# sys.argv[1] is the target, as JSON: host_dir (holds "secret" and "link"),
# parent_pid (the test process), tcp_port, udp_port, unix_path, abstract and
# host_root ([dev, ino] of the test's "/").
#
# Where fork works (no seccomp filter), each probe runs in a child of its own, so that
# one that changes this process (personality, a new user namespace, a raised limit)
# does not change what the next one finds; where it does not, the probes run in this
# process, in order.

import ctypes
import errno
import json
import mmap
import os
import platform
import signal
import socket
import struct
import sys
import time

T = json.loads(sys.argv[1])
HOST = T["host_dir"]
PARENT = T["parent_pid"]
PROOT = "/proc/%d/root" % PARENT  # the test process's root, if this /proc shows it

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
MAP_FAILED = ctypes.c_void_p(-1).value

NR = {
    "x86_64": dict(ptrace=101, process_vm_readv=310, kill=62, tgkill=234, clone3=435, exit_group=231,
                   execve=59, keyctl=250, perf_event_open=298, userfaultfd=323, io_uring_setup=425, bpf=321,
                   personality=135, memfd_create=319, mount=165, fsopen=430, unshare=272, setns=308,
                   chroot=161, prlimit64=302, openat2=437, pidfd_open=434, finit_module=313),
    "aarch64": dict(ptrace=117, process_vm_readv=270, kill=129, tgkill=131, clone3=435, exit_group=94,
                    execve=221, keyctl=219, perf_event_open=241, userfaultfd=282, io_uring_setup=425, bpf=280,
                    personality=92, memfd_create=279, mount=40, fsopen=430, unshare=97, setns=268,
                    chroot=51, prlimit64=261, openat2=437, pidfd_open=434, finit_module=273),
}[platform.machine()]

PROT_RW = mmap.PROT_READ | mmap.PROT_WRITE
PROT_RWX = PROT_RW | mmap.PROT_EXEC
CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWNET = 0x20000, 0x10000000, 0x40000000


class NotEscaped(Exception):
    pass


def sc(name, *args):
    """libc's syscall(2): ints as longs, bytes as C strings; -1 raises OSError."""
    conv = [ctypes.c_char_p(a) if isinstance(a, bytes) else ctypes.c_long(a) for a in args]
    r = libc.syscall(ctypes.c_long(NR[name]), *conv)
    if r == -1:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return r


def check(r):
    if r == -1 or r == MAP_FAILED:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return r


def read_file(path):
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.read(fd, 64)
    finally:
        os.close(fd)


def create(path, mode=0o644):
    os.close(os.open(path, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, mode))


def beyond(path):
    """path (absolute) as reached by climbing out of wherever one starts."""
    return "../" * 16 + path.lstrip("/")


def not_own_root(path):
    st, me = os.stat(path), os.stat("/")
    if (st.st_dev, st.st_ino) == (me.st_dev, me.st_ino):
        raise NotEscaped("own root")
    os.listdir(path)


def list_host_root():
    for p in ("/", "/..", "/ws/" + "../" * 16):
        st = os.stat(p)
        if [st.st_dev, st.st_ino] == T["host_root"]:
            return
    raise NotEscaped("own root")


def dot_dot_from_fds():
    last = errno.EBADF
    for fd in range(64):
        try:
            os.close(os.open(beyond(HOST + "/secret"), os.O_RDONLY | os.O_CLOEXEC, dir_fd=fd))
            return
        except OSError as e:
            if e.errno not in (errno.EBADF, errno.ENOTDIR):
                last = e.errno
    raise OSError(last, os.strerror(last))


def write_held_file():
    # Every regular file held (the sealed program and stdin, fd 0), reopened for
    # writing; a writable shared mapping is the proof (nothing is written).
    answer = None
    for fd in range(64):
        try:
            st = os.fstat(fd)
        except OSError:
            continue
        if (st.st_mode & 0o170000) != 0o100000 or st.st_size == 0:
            continue
        try:
            nfd = os.open("/proc/self/fd/%d" % fd, os.O_RDWR | os.O_CLOEXEC)
        except OSError as e:
            answer = e.errno
            continue
        try:
            mmap.mmap(nfd, 4096, flags=mmap.MAP_SHARED, prot=PROT_RW).close()
            return
        except OSError as e:
            answer = e.errno
        finally:
            os.close(nfd)
    if answer is None:
        raise NotEscaped("no regular file held")
    raise OSError(answer, os.strerror(answer))


def socket_filter():
    # A classic BPF program of one instruction (accept everything), attached to one
    # end of a socket pair: a program of the guest's that the kernel runs.
    a, b = socket.socketpair()
    try:
        insn = ctypes.create_string_buffer(struct.pack("HBBI", 0x06, 0, 0, 0xFFFFFFFF), 8)  # BPF_RET|BPF_K
        a.setsockopt(socket.SOL_SOCKET, 26, struct.pack("H6xQ", 1, ctypes.addressof(insn)))  # SO_ATTACH_FILTER
    finally:
        a.close()
        b.close()


def msg_oob():
    a, b = socket.socketpair()
    try:
        a.send(b"x", socket.MSG_OOB)
    finally:
        a.close()
        b.close()


def set_id_chmod():
    create("/ws/setid")
    try:
        os.chmod("/ws/setid", 0o4755)
        if not os.stat("/ws/setid").st_mode & 0o4000:
            raise NotEscaped("the bit was dropped")
    finally:
        try:
            os.chmod("/ws/setid", 0o644)
        except OSError:
            pass


def set_id_openat2():
    how = struct.pack("QQQ", os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o6755, 0)
    buf = ctypes.create_string_buffer(how, len(how))
    fd = sc("openat2", -100, b"/ws/setid2", ctypes.addressof(buf), len(how))
    os.close(fd)
    try:
        if not os.stat("/ws/setid2").st_mode & 0o6000:
            raise NotEscaped("the bits were dropped")
    finally:
        try:
            os.chmod("/ws/setid2", 0o644)
        except OSError:
            pass


def sock(family, typ, proto=0):
    socket.socket(family, typ, proto).close()


def connect(family, typ, addr):
    s = socket.socket(family, typ)
    s.settimeout(3)
    try:
        s.connect(addr)
    finally:
        s.close()


def send_udp():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.sendto(b"escaped", ("127.0.0.1", T["udp_port"]))
    finally:
        s.close()


def vsock_host():
    # CID 2 is the host (the hypervisor). A reset is the host's answer (no listener on
    # that port): the connection reached it.
    try:
        connect(socket.AF_VSOCK, socket.SOCK_STREAM, (2, 9))
    except ConnectionResetError:
        pass


def bind_listen():
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind(("0.0.0.0", 0))
        s.listen(1)
    finally:
        s.close()


def process_vm_readv():
    buf = ctypes.create_string_buffer(8)
    local = struct.pack("QQ", ctypes.addressof(buf), 8)
    remote = struct.pack("QQ", 0x10000, 8)
    lb, rb = ctypes.create_string_buffer(local, 16), ctypes.create_string_buffer(remote, 16)
    try:
        sc("process_vm_readv", PARENT, ctypes.addressof(lb), 1, ctypes.addressof(rb), 1, 0)
    except OSError as e:
        if e.errno != errno.EFAULT:  # EFAULT: access granted, only the address was wrong
            raise


def pidfd_open():
    os.close(sc("pidfd_open", PARENT, 0))


def fork():
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)


def fork_flood():
    # 300 processes that stay: glibc's clone() starting each in libc's pause() on a
    # small stack of its own, sharing this memory (CLONE_VM, not CLONE_THREAD: each is
    # a process of its own, as RLIMIT_NPROC and the filter see it), so that no child
    # runs Python or copies a page and the flood takes milliseconds, not seconds.
    stacks, pids = [], []
    pause = ctypes.cast(libc.pause, ctypes.c_void_p)
    libc.clone.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
    try:
        for i in range(300):
            stack = ctypes.create_string_buffer(16384)
            stacks.append(stack)
            top = (ctypes.addressof(stack) + 16384) & ~15
            pid = libc.clone(pause, top, 0x100 | signal.SIGCHLD, None)  # CLONE_VM
            if pid == -1:
                e = ctypes.get_errno()
                raise OSError(e, "after %d processes: %s" % (i, os.strerror(e)))
            pids.append(pid)
    finally:
        for p in pids:
            os.kill(p, signal.SIGKILL)
        for p in pids:
            os.waitpid(p, 0)


def clone3_userns():
    # struct clone_args (v0, 64 bytes): flags, pidfd, child_tid, parent_tid,
    # exit_signal, stack, stack_size, tls. The child (a copy of this process, as after
    # fork) leaves at once.
    args = struct.pack("8Q", CLONE_NEWUSER, 0, 0, 0, signal.SIGCHLD, 0, 0, 0)
    buf = ctypes.create_string_buffer(args, len(args))
    pid = sc("clone3", ctypes.addressof(buf), len(args))
    if pid == 0:
        sc("exit_group", 0)
    os.waitpid(pid, 0)


def execve(path):
    # The kernel opens and checks the file (seccomp, Landlock's execute right, the
    # mount's noexec) before it reads argv: a bad argv pointer answers EFAULT exactly
    # when the exec would have gone ahead, and this process is not replaced.
    try:
        sc("execve", path.encode(), 1, 0)
    except OSError as e:
        if e.errno != errno.EFAULT:
            raise


def keyctl():
    sc("keyctl", 1, b"sandcell-escape")  # KEYCTL_JOIN_SESSION_KEYRING


def perf_event_open():
    # PERF_TYPE_SOFTWARE, PERF_COUNT_SW_CPU_CLOCK, disabled | exclude_kernel | exclude_hv.
    attr = struct.pack("IIQQQQQ", 1, 128, 0, 0, 0, 0, 1 | 1 << 5 | 1 << 6).ljust(128, b"\0")
    buf = ctypes.create_string_buffer(attr, len(attr))
    os.close(sc("perf_event_open", ctypes.addressof(buf), 0, -1, -1, 8))  # PERF_FLAG_FD_CLOEXEC


def userfaultfd():
    os.close(sc("userfaultfd", os.O_CLOEXEC | 1))  # UFFD_USER_MODE_ONLY


def io_uring_setup():
    params = ctypes.create_string_buffer(120)
    os.close(sc("io_uring_setup", 4, ctypes.addressof(params)))


def bpf_map():
    attr = ctypes.create_string_buffer(struct.pack("5I", 2, 4, 4, 1, 0), 20)  # BPF_MAP_TYPE_ARRAY
    os.close(sc("bpf", 0, ctypes.addressof(attr), 20))  # BPF_MAP_CREATE


def memfd_exec():
    fd = sc("memfd_create", b"code", 1)  # MFD_CLOEXEC
    try:
        os.write(fd, b"\xc3" * 4096)
        mmap.mmap(fd, 4096, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_EXEC).close()
    finally:
        os.close(fd)


def anon(prot, flags, size=4096):
    p = check(libc.mmap(None, size, prot, flags, -1, 0))
    libc.munmap(p, size)


def mprotect_exec():
    p = check(libc.mmap(None, 4096, PROT_RW, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0))
    try:
        check(libc.mprotect(p, 4096, mmap.PROT_READ | mmap.PROT_EXEC))
    finally:
        libc.munmap(p, 4096)


def writable_exec_file_mapping():
    fd = os.open("/usr/bin/python3.13", os.O_RDONLY | os.O_CLOEXEC)
    try:
        p = check(libc.mmap(None, 4096, PROT_RWX, mmap.MAP_PRIVATE, fd, 0))
        libc.munmap(p, 4096)
    finally:
        os.close(fd)


def map_ws_exec():
    with open("/ws/code.bin", "wb") as f:
        f.write(b"\xc3" * 4096)
    fd = os.open("/ws/code.bin", os.O_RDONLY | os.O_CLOEXEC)
    try:
        mmap.mmap(fd, 4096, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_EXEC).close()
    finally:
        os.close(fd)


def mount_tmpfs(where):
    os.makedirs(where, exist_ok=True)
    sc("mount", b"tmpfs", where.encode(), b"tmpfs", 0, 0)


def userns_mount():
    sc("unshare", CLONE_NEWUSER | CLONE_NEWNS)
    mount_tmpfs("/ws/mnt2")


def setns_pid1_net():
    fd = os.open("/proc/1/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        sc("setns", fd, CLONE_NEWNET)
    finally:
        os.close(fd)


def raise_rlimit():
    new = ctypes.create_string_buffer(struct.pack("QQ", 1 << 20, 1 << 20), 16)
    sc("prlimit64", 0, 7, ctypes.addressof(new), 0)  # RLIMIT_NOFILE


def finit_module():
    fd = os.open("/usr/bin/python3.13", os.O_RDONLY | os.O_CLOEXEC)
    try:
        sc("finit_module", fd, b"", 0)
    finally:
        os.close(fd)


PROBES = [
    # Files: the host's, reached directly, through /proc, or out of /ws.
    ("list the host root", list_host_root),
    ("read a host file", lambda: read_file(HOST + "/secret")),
    ("stat a host path", lambda: os.stat(HOST + "/secret")),
    ("readlink a host symlink", lambda: os.readlink(HOST + "/link")),
    ("write a host file", lambda: create(HOST + "/pwned")),
    ("read a host file via /proc/PID/root", lambda: read_file(PROOT + HOST + "/secret")),
    ("write a host file via /proc/PID/root", lambda: create(PROOT + HOST + "/pwned")),
    ("reach pid 1's root (/proc/1/root)", lambda: not_own_root("/proc/1/root")),
    ("read the parent's /proc/PID/environ", lambda: read_file("/proc/%d/environ" % PARENT)),
    ("read /sys", lambda: read_file("/sys/kernel/mm/transparent_hugepage/enabled")),
    ("symlink out of /ws", lambda: (os.symlink(HOST + "/secret", "/ws/out-link"), read_file("/ws/out-link"))),
    ("relative symlink out of /ws", lambda: (os.symlink(beyond(HOST + "/secret"), "/ws/up-link"), read_file("/ws/up-link"))),
    ("hard link a host file into /ws", lambda: os.link(HOST + "/secret", "/ws/hard-link")),
    (".. out of /ws", lambda: read_file("/ws/" + beyond(HOST + "/secret"))),
    (".. from every open fd", dot_dot_from_fds),
    ("write into the root (/usr/lib)", lambda: create("/usr/lib/pwned")),
    ("write own code via /proc/self/mem", lambda: os.close(os.open("/proc/self/mem", os.O_RDWR | os.O_CLOEXEC))),
    ("write a held file via /proc/self/fd", write_held_file),
    # Sockets and the test's listeners.
    ("socket AF_INET", lambda: sock(socket.AF_INET, socket.SOCK_STREAM)),
    ("socket AF_INET6", lambda: sock(socket.AF_INET6, socket.SOCK_DGRAM)),
    ("socket AF_UNIX", lambda: sock(socket.AF_UNIX, socket.SOCK_STREAM)),
    ("socket AF_NETLINK", lambda: sock(socket.AF_NETLINK, socket.SOCK_RAW, 0)),
    ("socket AF_PACKET", lambda: sock(socket.AF_PACKET, socket.SOCK_RAW, 0)),
    ("socket AF_VSOCK", lambda: sock(socket.AF_VSOCK, socket.SOCK_STREAM)),
    ("socket AF_ALG", lambda: sock(socket.AF_ALG, socket.SOCK_SEQPACKET)),
    ("connect to a host TCP port", lambda: connect(socket.AF_INET, socket.SOCK_STREAM, ("127.0.0.1", T["tcp_port"]))),
    ("send UDP to the host", send_udp),
    ("connect to the hypervisor over AF_VSOCK", vsock_host),
    ("bind and listen on TCP", bind_listen),
    ("connect to a host Unix socket", lambda: connect(socket.AF_UNIX, socket.SOCK_STREAM, T["unix_path"])),
    ("connect to a host Unix socket via /proc/PID/root",
     lambda: connect(socket.AF_UNIX, socket.SOCK_STREAM, PROOT + T["unix_path"])),
    ("MSG_OOB on a Unix socket pair", msg_oob),
    ("attach a BPF filter to a socket pair", socket_filter),
    ("connect to an abstract Unix socket", lambda: connect(socket.AF_UNIX, socket.SOCK_STREAM, "\0" + T["abstract"])),
    # The test process.
    ("ptrace the parent", lambda: sc("ptrace", 0x4206, PARENT, 0, 0)),  # PTRACE_SEIZE: never stops it
    ("process_vm_readv the parent", process_vm_readv),
    ("kill(2) the parent", lambda: sc("kill", PARENT, 0)),
    ("tgkill(2) the parent", lambda: sc("tgkill", PARENT, PARENT, 0)),
    ("pidfd_open the parent", pidfd_open),
    # Processes and programs.
    ("fork", fork),
    ("fork flood (300 live processes)", fork_flood),
    ("clone3 into a new user namespace", clone3_userns),
    ("execve another program of the root", lambda: execve("/usr/bin/getconf")),
    # The kernel's wider surface.
    ("keyctl", keyctl),
    ("perf_event_open", perf_event_open),
    ("userfaultfd", userfaultfd),
    ("io_uring_setup", io_uring_setup),
    ("bpf map", bpf_map),
    ("personality(READ_IMPLIES_EXEC)", lambda: sc("personality", 0x0400000)),
    ("load a kernel module", finit_module),
    # Memory: executable memory of the guest's own making, and memory past the limit.
    ("a fresh executable mapping", lambda: anon(PROT_RWX, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)),
    ("mprotect to executable", mprotect_exec),
    ("a writable executable file mapping", writable_exec_file_mapping),
    ("an executable memfd mapping", memfd_exec),
    ("map a /ws file executable", map_ws_exec),
    ("shared anonymous memory", lambda: anon(PROT_RW, mmap.MAP_SHARED | mmap.MAP_ANONYMOUS, 1 << 20)),
    ("a huge private mapping (1 TiB)", lambda: anon(PROT_RW, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | mmap.MAP_NORESERVE, 1 << 40)),
    # Privileges, mounts, namespaces, limits.
    ("set-id bit via chmod on a /ws file", set_id_chmod),
    ("set-id file via openat2", set_id_openat2),
    ("mount a tmpfs", lambda: mount_tmpfs("/ws/mnt")),
    ("fsopen (the new mount API)", lambda: os.close(sc("fsopen", b"tmpfs", 1))),
    ("unshare a user namespace", lambda: sc("unshare", CLONE_NEWUSER)),
    ("mount in a new user and mount namespace", userns_mount),
    ("unshare a network namespace", lambda: sc("unshare", CLONE_NEWNET)),
    ("setns into pid 1's network", setns_pid1_net),
    ("chroot", lambda: sc("chroot", b"/ws")),
    ("raise an rlimit", raise_rlimit),
]


def outcome(fn):
    try:
        fn()
    except NotEscaped as e:
        return "no escape: %s" % e
    except OSError as e:
        if e.errno:
            return errno.errorcode.get(e.errno, str(e.errno))
        return "error: %s" % e
    except Exception as e:
        return "error: %r" % e
    return "ESCAPED"


def isolated(fn):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        signal.alarm(20)
        try:
            out = outcome(fn)
        except BaseException as e:
            out = "error: %r" % e
        os.write(w, out.encode())
        os._exit(0)
    os.close(w)
    data = b""
    while True:
        c = os.read(r, 4096)
        if not c:
            break
        data += c
    os.close(r)
    _, status = os.waitpid(pid, 0)
    return data.decode() or "child ended without an answer (status %#x)" % status


def main():
    try:
        fork()
        can_fork = True
    except OSError:
        can_fork = False
    out = {}
    began = time.monotonic()
    for name, fn in PROBES:
        out[name] = isolated(fn) if can_fork else outcome(fn)
    out["(isolated)"] = str(can_fork)
    out["(seconds)"] = "%.2f" % (time.monotonic() - began)
    sys.stdout.write(json.dumps(out))
    sys.stdout.flush()


main()
