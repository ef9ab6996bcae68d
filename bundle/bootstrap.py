# Sandcell's guest bootstrap. It runs once, in __main__, when the interpreter's
# snapshot is made (bundle/interpreter/sandcell.c, sandcell_init): it does the work
# that does not depend on any program (the modules agents use most imported, the
# compiler and evaluation loop warmed), and it defines _sandcell_run, which the C side
# takes out of __main__ and calls once in every run, in a fresh copy of that state.
#
# _sandcell_run reads the program from stdin: ten ASCII digits giving the length of a
# header, then the header, UTF-8 fields separated by NUL (which no field may contain):
#   MODE, SOURCE-OR-PATH, NAME, DISK, N, ARG1..ARGN, KEY1, VALUE1, ...
# MODE "code": SOURCE is the program, NAME its file name ("<string>" for -c);
# MODE "path": PATH is the script (/ws/...), NAME is empty.
# MODE "isolated": as "code", for a program of the daemon's own (the SQL tool, the
# self-test): sys.path stays the read-only standard library alone, so nothing the
# workspace holds is ever imported by it.
# MODE "cell": SOURCE is one cell of a session (NAME its name in tracebacks): it runs
# in the same __main__ as the session's earlier cells, which _sandcell_run, called
# again on the same instance, keeps; the value of a last expression is shown as the
# interactive interpreter shows it (sys.displayhook), which goes on stdout framed by
# value marks: "\0\x1bsandcell-value MARK\0", the text, "\0\x1bsandcell-end MARK\0",
# after the cell's own output (the worker's parent takes it out as the cell's value).
# Its arguments are "restored" (or "") when the interpreter was restored since the
# last cell, or "forked" when it was restored from another session's state (a fork:
# as restored, and what the interpreter seeded from a one-time random source is
# seeded afresh, as CPython's own os.fork() child does), and MARK, random hex of the
# parent's for this cell ("": the value goes on stdout unframed). Ten digits and
# the cell's stdin follow the header; the session's first cell sets what a run's
# program gets (random reseeded, /ws, sys.path), later ones only the environment.
# Whatever follows the header of another mode is the program's own stdin.
#
# It gives the run what a fresh `python -c CODE ARGS` or `python /ws/PATH ARGS` would
# have: `random` reseeded from WASI's random source, the environment, sys.argv and
# sys.orig_argv of this run, /ws as the working directory; then it runs the program in
# __main__ with the same tracebacks (its own frame left out) and returns the exit
# status as the interpreter would compute it, reduced modulo 256 as a POSIX exit(3)
# would (one beyond a C long is 255, as native CPython's). Then it ends the program as
# the interpreter's finalization would, as far as a program can see (see end()).
def _sandcell_init():
    import builtins
    # What the bootstrap calls, as names of its own: a program (a session's cell, and
    # the ones after it) may replace any builtin.
    from builtins import (BaseException, IndexError, KeyboardInterrupt, MemoryError, OSError, OverflowError,  # noqa: F401
                          SystemExit, TypeError, ValueError, bytearray, bytes,
                          compile, enumerate, eval, exec, getattr, id, int, isinstance, issubclass, len, max, memoryview,
                          print, range, set,
                          str, tuple, type)
    import os
    import random
    import sys

    # The modules agents use most, imported into the snapshot (most are frozen into
    # python.wasm as well, see bundle/interpreter/build-inside.sh).
    import ast, atexit, base64, bisect, collections, copy, csv, dataclasses, datetime  # noqa: E401
    import decimal, enum, fractions, functools, gc, hashlib, heapq, io, itertools  # noqa: E401
    import json, linecache, math, operator, pathlib, re, sqlite3, statistics  # noqa: E401
    import string, struct, textwrap, time, traceback, typing, zlib  # noqa: E401
    # SQLite's lock tables (bundle/interpreter/sandcell.c), forgotten when the
    # interpreter is restored: its memory holds them as they were; and SQLite's
    # generator, reset in a fork.
    from _sandcell import audit_hook, forget_locks, reseed_sqlite

    # -S skips site, which is what defines exit() and quit(); scripts use them.
    builtins.exit = builtins.quit = sys.exit
    # display(), as the native backend's: its source (sandbox/protocol/displays.py)
    # is _sandcell_displays_source, defined before this file, compiled under a name
    # of its own so that a traceback through it shows its lines, not a program's.
    # What a run or cell displayed is left in DISPLAYS, the guest's /tmp, for the
    # worker to read once it has ended (sandbox/worker: guestDisplays).
    name = "<sandcell display>"
    linecache.cache[name] = (len(_sandcell_displays_source), None, _sandcell_displays_source.splitlines(True), name)
    ns = {}
    exec(compile(_sandcell_displays_source, name, "exec"), ns)
    displays = ns["_sandcell_displays"](io, json, base64)
    builtins.display = displays.display
    DISPLAYS = "/tmp/.sandcell-displays"
    # sandcell.tools (sandbox/protocol/tools.py, _sandcell_tools_source): the tools
    # the daemon offers the run, each call through the interpreter's host function
    # _sandcell.tool_call, which the worker answers over its tools channel. In
    # sys.modules from the snapshot on, so a workspace sandcell.py is not it.
    from _sandcell import tool_call
    import types
    name = "<sandcell tools>"
    linecache.cache[name] = (len(_sandcell_tools_source), None, _sandcell_tools_source.splitlines(True), name)
    ns = {}
    exec(compile(_sandcell_tools_source, name, "exec"), ns)
    loads, dumps = json.loads, json.dumps
    sys.modules["sandcell"], sys.modules["sandcell.tools"] = ns["_sandcell_tools"](
        lambda msg: loads(tool_call(dumps(msg).encode())), json, types)
    del name, ns, types
    # site would also have put site-packages on sys.path: the site layer, read-only
    # like the standard library (bundle/interpreter/build-site.sh). Last, as site puts
    # it; an isolated program leaves it out (see run()).
    SITE = "/usr/local/lib/python3.13/site-packages"
    sys.path.append(SITE)
    # Modules of the workspace are compiled from their source each time, never from
    # bytecode: no __pycache__ is read or written in /ws, and a .pyc there is no
    # module. Bytecode cannot be reviewed, and whether a cached one is used instead
    # of its source depends on the source's modification time, which nothing binds:
    # an approval of code (which binds the workspace's files) must see what runs.
    # Everything else (the site layer's cached bytecode) loads as CPython loads it.
    import importlib.machinery as machinery

    class WorkspaceLoader(machinery.SourceFileLoader):
        def get_code(self, fullname):
            path = self.get_filename(fullname)
            return self.source_to_code(self.get_data(path), path)

    workspace_finder = machinery.FileFinder.path_hook((WorkspaceLoader, machinery.SOURCE_SUFFIXES))

    def workspace_hook(entry, abspath=os.path.abspath, finder=workspace_finder):
        # "" is the working directory; POSIX keeps a leading "//", which is "/" here.
        path = "/" + abspath(entry or ".").lstrip("/")
        if path == "/ws" or path.startswith("/ws/"):
            return finder(entry)
        raise ImportError("not in the workspace")

    sys.path_hooks.insert(0, workspace_hook)
    # The guest has no executable file (WASI starts no processes): CPython says so
    # with an empty sys.executable, which platform.libc_ver() and others understand,
    # where a path that does not exist here made them fail. sys.orig_argv keeps the
    # name the interpreter was started by.
    argv0 = sys.executable
    sys.executable = sys._base_executable = ""
    # The file system as Linux has it, where WASI's differs. wasmtime's WASI
    # implements rmdir("d/") as rmdir(2) of "." in d, which Linux refuses with EINVAL
    # whether d is empty or not; wasi-libc takes rmdir(".") for a removal of the
    # working directory by its name, and it keeps chdir's path as given ("/ws/d/",
    # "/ws/d/.."), which os.getcwd() then returns. os.rmdir and os.chdir are wrapped
    # to do what Linux does. (wasmtime's WASI functions cannot be wrapped on the host
    # side: each reads its path from the memory of the wasm instance that calls it.)
    import errno, stat as stat_module
    from os import fsdecode, fspath, strerror
    posix_rmdir, posix_chdir, getcwd, stat = os.rmdir, os.chdir, os.getcwd, os.stat
    normpath, realpath = os.path.normpath, os.path.realpath

    def failure(code, path, path2=None):
        return OSError(code, strerror(code), path, None, path2) if path2 is not None else OSError(code, strerror(code), path)

    def rmdir(path, *, dir_fd=None):
        try:
            p = fspath(path)
        except TypeError:
            return posix_rmdir(path, dir_fd=dir_fd)  # as posix says it
        sep, dot, dotdot = ("/", ".", "..") if isinstance(p, str) else (b"/", b".", b"..")
        q = p.rstrip(sep)
        if p and not q:
            raise failure(errno.EBUSY, path)  # "/", a mount point
        last = q.rpartition(sep)[2]
        if last == dot:
            raise failure(errno.EINVAL, path)
        if last == dotdot:
            raise failure(errno.ENOTEMPTY, path)
        if len(q) == len(p):
            return posix_rmdir(path, dir_fd=dir_fd)
        try:
            return posix_rmdir(q, dir_fd=dir_fd)
        except OSError as e:
            e.filename = path  # the name as given, as posix's
            raise

    def chdir(path):
        posix_chdir(path)
        if isinstance(path, int):
            return
        try:
            cwd = getcwd()
            clean = normpath(cwd)
            if clean != cwd:
                # The same directory by a plain name: through a symbolic link,
                # ".." is not the lexical parent, and then the name stays.
                here, there = stat("."), stat(clean)
                if (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino):
                    posix_chdir(clean)
        except OSError:
            pass

    for wrapper, wrapped in ((rmdir, posix_rmdir), (chdir, posix_chdir)):
        wrapper.__name__ = wrapper.__qualname__ = wrapped.__name__
        wrapper.__doc__, wrapper.__module__ = wrapped.__doc__, wrapped.__module__
        setattr(os, wrapped.__name__, wrapper)
        for functions in (os.supports_dir_fd, os.supports_fd, os.supports_follow_symlinks, os.supports_effective_ids):
            if wrapped in functions:
                functions.discard(wrapped)
                functions.add(wrapper)

    # Outside /ws and /tmp the guest's "/" is a read-only file system of the worker's
    # (it holds only their mount points): a change there fails in the host with
    # EROFS, which wasmtime's WASI does not know and reports as EIO. Linux tells a
    # user other than root EACCES for a change in a directory that is not theirs, and
    # so does this guard, an audit hook (a program cannot remove one), before the
    # call: when what the call would change lies on that file system. The one
    # directory of it a guest reaches is "/" itself (its entries are the mount
    # points), which the guard knows by its inode (WASI gives every file the same
    # st_dev). /ws and /tmp are two file systems: a rename or link between them fails
    # with EXDEV (shutil.move then copies), which wasmtime's WASI also reports as EIO.
    # The guard also refuses a rename with a trailing slash whose source is not a
    # directory (ENOTDIR, as rename(2); wasmtime renames it).
    O_CREAT = os.O_CREAT
    root = []  # the inode of the guest's read-only "/" this run (none without one)
    # What the guard learnt of directories, by absolute name: whether one is "/",
    # and which file system holds it. A name means another directory only after a
    # symbolic link is made or removed or a directory is renamed (which the guard
    # sees), or another program changed the workspace (before this run or cell).
    is_root, mounts = {}, {}

    def forget():
        is_root.clear()
        mounts.clear()

    def at(dir_fd):
        # Audit events give the default directory (the working one) as a negative fd.
        return None if dir_fd is None or type(dir_fd) is int and dir_fd < 0 else dir_fd

    def head(path):
        """The name of the directory that holds path, absolute, or None."""
        p = fsdecode(fspath(path))
        q = p.rstrip("/")
        if not q:
            return p and "/"  # "/" is its own parent; "" names nothing
        d = (q.rpartition("/")[0] or "/") if "/" in q else "."
        return d if d.startswith("/") else getcwd() + "/" + d

    def on_root(path, dir_fd=None):
        """Whether the directory holding path is the guest's read-only "/"."""
        if not root:
            return False
        try:
            if at(dir_fd) is not None:  # relative to a descriptor: ask each time
                p = fsdecode(fspath(path)).rstrip("/")
                d = p.rpartition("/")[0] if "/" in p else ""
                return (stat(d, dir_fd=dir_fd) if d else stat(dir_fd)).st_ino == root[0]
            d = head(path)
            if d is None:
                return False
            hit = is_root.get(d)
            if hit is None:
                hit = stat(d).st_ino == root[0]
                if len(is_root) > 4096:
                    is_root.clear()
                is_root[d] = hit
            return hit
        except (OSError, TypeError, ValueError):
            return False  # the call says what is wrong

    def mount(path, dir_fd):
        """Which of the guest's writable file systems ("ws", "tmp") holds path's
        directory, "" for neither, None when it cannot be told."""
        if at(dir_fd) is not None:
            return None
        try:
            d = head(path)
            top = mounts.get(d)
            if top is None:
                top = realpath(d).split("/")[1]
                if len(mounts) > 4096:
                    mounts.clear()
                mounts[d] = top
        except (OSError, TypeError, ValueError, IndexError):
            return None
        return top if top in ("ws", "tmp") else ""

    def exists(path, dir_fd=None):
        try:
            return stat(path, dir_fd=at(dir_fd), follow_symlinks=False)
        except (OSError, TypeError, ValueError):
            return None

    def cross(src, dst, src_dir_fd, dst_dir_fd):
        a, b = mount(src, src_dir_fd), mount(dst, dst_dir_fd)
        if a and b and a != b:
            raise failure(errno.EXDEV, src, dst)

    def on_open(path, mode, flags, *_):
        if type(flags) is int and flags & O_CREAT and not isinstance(path, int) and on_root(path) and \
                exists(path) is None:
            raise failure(errno.EACCES, path)

    def on_mkdir(path, mode, dir_fd, *_):
        if on_root(path, dir_fd) and exists(path, dir_fd) is None:
            raise failure(errno.EACCES, path)

    def on_remove(path, dir_fd, *_):
        # A name that is not there is ENOENT (the host's EROFS comes first; Linux
        # finds the name before it asks whether it may remove it).
        if on_root(path, dir_fd):
            raise failure(errno.ENOENT if exists(path, dir_fd) is None else errno.EACCES, path)
        forget()  # (it may be a symbolic link: cheaper to forget than to look)

    def on_rename(src, dst, src_dir_fd, dst_dir_fd, *_):
        try:
            slash = fsdecode(fspath(src)).endswith("/") or fsdecode(fspath(dst)).endswith("/")
        except (TypeError, ValueError):
            return
        st = exists(src, src_dir_fd)
        ro = on_root(src, src_dir_fd) or on_root(dst, dst_dir_fd)
        if st is None:
            if ro:
                raise failure(errno.ENOENT, src, dst)
            return
        if slash and not stat_module.S_ISDIR(st.st_mode):
            raise failure(errno.ENOTDIR, src, dst)
        if ro:
            raise failure(errno.EACCES, src, dst)
        cross(src, dst, src_dir_fd, dst_dir_fd)
        if not stat_module.S_ISREG(st.st_mode):
            forget()  # a directory or a link moves: names beneath it change

    def on_link(src, dst, src_dir_fd, dst_dir_fd, *_):
        if exists(src, src_dir_fd) is None:
            return  # ENOENT, first
        if on_root(dst, dst_dir_fd) and exists(dst, dst_dir_fd) is None:
            raise failure(errno.EACCES, src, dst)
        cross(src, dst, src_dir_fd, dst_dir_fd)

    def on_symlink(src, dst, dir_fd, *_):
        if on_root(dst, dir_fd) and exists(dst, dir_fd) is None:
            raise failure(errno.EACCES, src, dst)
        forget()

    def on_utime(path, times, ns, dir_fd, *_):
        try:
            st = stat(path, dir_fd=at(dir_fd)) if not isinstance(path, int) else stat(path)
        except (OSError, TypeError, ValueError):
            return
        if root and st.st_ino == root[0]:
            raise failure(errno.EACCES, path)

    def on_connect(*_):
        pass  # allowed: guard notes that the run opened a database

    checks = {"open": on_open, "os.mkdir": on_mkdir, "os.rmdir": on_remove, "os.remove": on_remove,
              "os.rename": on_rename, "os.link": on_link, "os.symlink": on_symlink, "os.utime": on_utime,
              "sqlite3.connect": on_connect}
    checking = []
    # Whether the run opened a file or a database: only then can a file object or a
    # connection the program left open outlive __main__ (see end()).
    opened = []

    # The audit hook of the events in checks, called from C for those alone
    # (_sandcell.audit_hook): a hook of Python's (sys.addaudithook) would be called
    # for every audited event of the program (id() in copy.deepcopy, sys._getframe
    # in logging, ...).
    def guard(event, args):
        if checking:
            return
        check = checks[event]
        checking.append(event)
        try:
            check(*args)
        finally:
            checking.pop()
        if not opened and (event == "open" or event == "sqlite3.connect"):
            opened.append(event)

    audit_hook(guard, tuple(checks))

    # shutil.disk_usage, which CPython defines only where os.statvfs exists (WASI has
    # none): what the worker says of the run's storage in the program's header (see
    # sandbox/worker/guest.go, diskField), which the program cannot change. With a
    # quota (the daemon's), every path reports it as total, what /ws and /tmp hold
    # (their files' sizes, as the daemon counts them) as used and the rest as free;
    # without one, /tmp reports its own size, anything else the workspace's file
    # system as it was when the run began; with neither, OSError.
    import shutil
    storage = {}

    def settle(disk):
        """What this run (or cell) is told: its storage, and its read-only "/"."""
        storage.clear()
        for word in disk.split():
            key, _, value = word.partition("=")
            storage[key] = tuple(int(v) for v in value.split(","))
        forget()  # another program may have changed the workspace meanwhile
        try:
            root[:] = [stat("/").st_ino]
        except OSError:
            root[:] = []

    usage = collections.namedtuple("usage", "total used free")
    usage.total.__doc__ = "Total space in bytes"
    usage.used.__doc__ = "Used space in bytes"
    usage.free.__doc__ = "Free space in bytes"
    usage.__module__ = "shutil"

    def tree_bytes(top):
        total, dirs = 0, [top]
        while dirs:
            try:
                entries = os.scandir(dirs.pop())
            except OSError:
                continue
            with entries:
                for e in entries:
                    try:
                        if e.is_dir(follow_symlinks=False):
                            dirs.append(e.path)
                        elif e.is_file(follow_symlinks=False):
                            total += e.stat(follow_symlinks=False).st_size
                    except OSError:
                        pass
        return total

    def in_tmp(path):
        if isinstance(path, int):
            return False
        p = realpath(fsdecode(fspath(path)))
        return p == "/tmp" or p.startswith("/tmp/")

    def disk_usage(path):
        """Return disk usage statistics about the given path.

        Returned value is a named tuple with attributes 'total', 'used' and
        'free', which are the amount of total, used and free space, in bytes.
        Here: the workspace's quota, what /ws and /tmp hold, and the rest."""
        stat(path)  # a path that is not there fails as statvfs would
        quota, fs, tmp = storage.get("quota", (0,))[0], storage.get("fs"), storage.get("tmp", (0,))[0]
        if quota > 0:
            used = tree_bytes("/ws") + (tree_bytes("/tmp") if tmp else 0)
            return usage(quota, used, max(quota - used, 0))
        if tmp > 0 and in_tmp(path):
            used = tree_bytes("/tmp")
            return usage(tmp, used, max(tmp - used, 0))
        if fs and len(fs) == 3:
            return usage(*fs)
        raise OSError(errno.ENOSYS, "disk usage is not known here: the run has no quota, and its "
                      "workspace's file system could not be measured", path)

    disk_usage.__module__ = "shutil"
    shutil.disk_usage, shutil._ntuple_diskusage = disk_usage, usage
    if "disk_usage" not in shutil.__all__:
        shutil.__all__.append("disk_usage")

    # hashlib.pbkdf2_hmac comes from OpenSSL, which the WASI build has not, and
    # CPython 3.12 dropped the Python fallback it had: here it is again, HMAC built
    # from the hash objects hashlib has (md5, sha1, sha2, sha3, blake2). The keyed
    # inner and outer states are made once and copied for each round, which halves
    # the work of a round. RFC 8018, section 5.2.
    from operator import index
    pad_in = bytes(b ^ 0x36 for b in range(256))
    pad_out = bytes(b ^ 0x5C for b in range(256))
    from_bytes = int.from_bytes

    def buffer(value):
        if not isinstance(value, str):
            try:
                return bytes(memoryview(value))
            except TypeError:
                pass
        raise TypeError("a bytes-like object is required, not '%s'" % type(value).__name__)

    def pbkdf2_hmac(hash_name, password, salt, iterations, dklen=None):
        """Password based key derivation function 2 (PKCS #5 v2.0) with HMAC as pseudorandom function."""
        if not isinstance(hash_name, str):
            raise TypeError("pbkdf2_hmac() argument 'hash_name' must be str, not %s" % type(hash_name).__name__)
        password, salt = buffer(password), buffer(salt)
        iterations = index(iterations)
        if iterations < 1:
            raise ValueError("iteration value must be greater than 0.")
        if iterations > 0xFFFFFFFF:
            raise OverflowError("iteration value is too great.")
        inner, outer = hashlib.new(hash_name), hashlib.new(hash_name)
        size, block = inner.digest_size, getattr(inner, "block_size", 0)
        if size < 1 or block < 1:
            raise ValueError("unsupported hash type " + hash_name)  # shake_*: no fixed digest
        dklen = size if dklen is None else index(dklen)
        if dklen < 1:
            raise ValueError("key length must be greater than 0.")
        if dklen > 0xFFFFFFFF:
            raise OverflowError("key length is too great.")
        if len(password) > block:
            password = hashlib.new(hash_name, password).digest()
        password = password.ljust(block, b"\0")
        inner.update(password.translate(pad_in))
        outer.update(password.translate(pad_out))
        inner_copy, outer_copy = inner.copy, outer.copy
        key = bytearray()
        n = 0
        while len(key) < dklen:
            n += 1
            h = inner_copy()
            h.update(salt + n.to_bytes(4, "big"))
            o = outer_copy()
            o.update(h.digest())
            u = o.digest()
            t = from_bytes(u)
            for _ in range(iterations - 1):
                h = inner_copy()
                h.update(u)
                o = outer_copy()
                o.update(h.digest())
                u = o.digest()
                t ^= from_bytes(u)
            key += t.to_bytes(size, "big")
        return bytes(key[:dklen])

    pbkdf2_hmac.__module__ = "hashlib"
    hashlib.pbkdf2_hmac = pbkdf2_hmac
    if "pbkdf2_hmac" not in hashlib.__all__:
        hashlib.__all__ += ("pbkdf2_hmac",)
    # The first use of the compiler, the evaluation loop and the common codecs costs
    # (pages of code and memory touched once): pay it in the snapshot.
    warm = compile("def f(a):\n    return '%d' % (a * 7)\nprint(f(6), end='')", "<warm-up>", "exec")
    exec(warm, {"print": lambda *a, **k: None})
    json.loads(json.dumps({"a": [1, 2.5, "x", None]}))
    re.compile(r"(\w+)=(\d+)").findall("a=1 b=2")
    "é".encode().decode()
    # The snapshot's bytes must not depend on the random source it was made with:
    # every run reseeds.
    random.seed(0)
    del builtins, warm

    # What end() calls, held here: a program may replace any of them.
    run_exitfuncs, collect, get_objects = atexit._run_exitfuncs, gc.collect, gc.get_objects
    layers = (io.TextIOBase, (io.BufferedIOBase, sqlite3.Connection), io.RawIOBase)
    stdout0, stderr0 = sys.__stdout__, sys.__stderr__
    # Everything the snapshot holds stays alive: the collector skips it from now on,
    # so a run's collections cost what the run allocated, and they write to none of
    # the snapshot's pages (each first write to one is a copy).
    gc.collect()
    gc.freeze()

    def end(status, main):
        """Ends the run as CPython's finalization would, visibly, at a fraction of its
        cost (a full Py_FinalizeEx frees the whole heap: 20 ms here): the exit
        handlers run; __main__ is cleared and cycles collected, so its objects'
        finalizers run (files flushed and closed); if the run opened a file or a
        database, every file object and connection still open is closed (buffered
        layers first); the standard streams are flushed (sys.stdout, sys.stderr,
        then the original ones if they were replaced; closed ones are skipped), and a
        failure of sys.stdout's makes the status 120. Nothing the program left
        behind stops the rest."""
        try:
            run_exitfuncs()
        except BaseException:
            pass
        try:
            for k in [k for k in main if type(k) is str and k.startswith("_") and k != "__builtins__"]:
                main[k] = None
            for k in [k for k in main if k != "__builtins__"]:
                main[k] = None
        except BaseException:
            pass
        try:
            collect()
        except BaseException:
            pass
        try:
            displays.dump(DISPLAYS)
        except BaseException:
            pass
        if opened:
            try:
                close_files()
            except BaseException:  # an audit hook of the program's may raise
                pass
        out = sys.stdout
        done = set()
        for f in (out, sys.stderr, stdout0, stderr0):
            if f is None or id(f) in done:
                continue
            done.add(id(f))
            try:
                if not getattr(f, "closed", False):
                    f.flush()
            except BaseException:
                if f is out:
                    status = 120 | (status & 0x100)
        return status

    def close_files():
        std = set()
        for f in (sys.stdin, sys.stdout, sys.stderr, sys.__stdin__, sys.__stdout__, sys.__stderr__, stdout0, stderr0):
            buffer = getattr(f, "buffer", None)
            std |= {id(f), id(buffer), id(getattr(buffer, "raw", None))}
        found = ([], [], [])
        for o in get_objects():
            try:
                for i, kinds in enumerate(layers):
                    if issubclass(type(o), kinds):
                        found[i].append(o)
                        break
            except BaseException:
                pass
        for layer in found:
            for o in layer:
                if id(o) in std:
                    continue
                try:
                    o.close()
                except BaseException as e:
                    try:
                        sys.unraisablehook(sys.UnraisableHookArgs(type(e), e, e.__traceback__, "closing a file at exit", o))
                    except BaseException:
                        pass

    read_fd = os.read  # the program's channel: a cell may replace os.read
    write_fd = os.write  # and the value's

    def run():
        def read(n):
            b = bytearray()
            while len(b) < n:
                chunk = read_fd(0, n - len(b))
                if not chunk:
                    return None
                b += chunk
            return bytes(b)

        try:
            n = read(10)
            header = n and read(int(n))
        except BaseException:
            header = None
        if header is None:
            # In a session the worker's cells cannot reach us (see
            # sandbox/worker/session.go); otherwise EX_SOFTWARE: no program came.
            return 0x1FF if cells else 70
        fields = header.decode().split("\0")
        mode, src, name, disk, nargs = fields[0], fields[1], fields[2], fields[3], int(fields[4])
        args = fields[5:5 + nargs]
        env = fields[5 + nargs:]
        settle(disk)
        for i in range(0, len(env), 2):
            os.environ[env[i]] = env[i + 1]
        g = sys.modules["__main__"].__dict__
        if mode == "cell":
            try:
                n = read(10)
                data = n and read(int(n))
            except BaseException:
                data = None
            if data is None:
                return 0x1FF
            flag = args[0] if args else ""
            return cell(src, name, data, g, flag in ("restored", "forked"), flag == "forked",
                        args[1] if len(args) > 1 else "")
        random.seed()
        os.chdir("/ws")
        if mode == "isolated":
            # -I already left the script's directory out; keep only the library's
            # entries, whatever else may have put one there.
            sys.path[:] = [p for p in sys.path if p.startswith("/usr/local/lib/") and p != SITE]
            sys.argv[:] = [name] + args
            sys.orig_argv[:] = [argv0, "-I", "-S", "-c", src] + args
            g["__file__"] = name
            mode = "code"
        elif mode == "code":
            if name == "<string>":
                sys.argv[:] = ["-c"] + args
                sys.orig_argv[:] = [argv0, "-I", "-S", "-c", src] + args
            else:
                sys.argv[:] = [name] + args
                sys.orig_argv[:] = [argv0, "-I", "-S", name] + args
                g["__file__"] = name
            # A script's source given as code (an approved path run: the file as the
            # daemon read it) imports from its directory, as the same path run would.
            sys.path.insert(0, os.path.dirname(name) if name.startswith("/ws/") else "")
        else:
            name = src
            sys.argv[:] = [name] + args
            sys.orig_argv[:] = [argv0, "-I", "-S", name] + args
            g["__file__"] = name
            sys.path.insert(0, os.path.dirname(name))
            try:
                with open(name, "rb") as f:
                    src = f.read()
            except OSError as e:
                # As CPython's own start-up says it, with its status.
                print("%s: can't open file %r: [Errno %d] %s" % (
                    os.path.basename(argv0), name, e.errno, e.strerror), file=sys.stderr)
                return end(2, g)
            opened.clear()
        return end(program(src, name, mode, g), g)

    cells = []
    seed = random.seed  # random's own generator's, as the snapshot made it

    def reseed():
        # A fork's interpreter must not draw what its source draws. CPython reseeds
        # random's generator in a forked child (os.register_at_fork, which WASI's os
        # lacks) and tempfile's name sequence notices the new pid; here the pid is
        # the same, so both are seeded afresh from WASI's random source, which is
        # the worker's own. (A generator the program seeded itself, random.Random(x),
        # stays as seeded, as in a forked CPython.) SQLite's generator (random(),
        # randomblob(), its temporary names) seeds itself again when next used.
        try:
            seed()
        except BaseException:
            pass
        reseed_sqlite()
        tempfile = sys.modules.get("tempfile")
        if tempfile is not None:
            try:
                tempfile._name_sequence = None
            except BaseException:
                pass

    def show(value, mark):
        # The value as sys.displayhook shows it (which also sets builtins._), framed
        # on fd 1 after everything the cell wrote there.
        shown, saved = io.StringIO(), sys.stdout
        sys.stdout = shown
        try:
            sys.displayhook(value)
        finally:
            sys.stdout = saved
        text = shown.getvalue()
        if text.endswith("\n"):
            text = text[:-1]  # displayhook's own line end: the text is the value's
        if not text:
            return
        for f in (sys.stdout, stdout0):
            try:
                if f is not None and not getattr(f, "closed", False):
                    f.flush()
            except BaseException:
                pass
        b = memoryview(b"\0\x1bsandcell-value " + mark.encode() + b"\0" +
                       text.encode("utf-8", "surrogateescape") + b"\0\x1bsandcell-end " + mark.encode() + b"\0")
        while len(b):
            b = b[write_fd(1, b):]

    def cell(src, name, data, g, restored, forked, mark):
        if forked:
            reseed()
        if restored:
            # The interpreter was restored (rolled back after a cell, or resumed into
            # a fresh instance, where the descriptors of the files and connections it
            # holds are gone, and a number may come back as another file). Closed,
            # they say so instead. The SQLite locks its memory lists are forgotten
            # first: closing a connection must not remove a lock directory that may
            # now be another program's.
            try:
                forget_locks()
                close_files()
            except BaseException:
                pass
        if not cells:
            random.seed()
            os.chdir("/ws")
            sys.argv[:] = [""]
            sys.orig_argv[:] = [argv0, "-I", "-S"]
            sys.path.insert(0, "")
        cells.append(name)
        # Its own stdin: the pipe's next bytes are the next cell's.
        sys.stdin = io.TextIOWrapper(io.BytesIO(data), encoding="utf-8", errors="surrogateescape")
        if restored:
            # Numbered afresh: the restored count would name a rolled-back cell's
            # files again.
            displays.prefix = None
        status = program(src, name, "cell", g, mark)
        try:
            displays.dump(DISPLAYS)
        except BaseException:
            pass
        for f in (sys.stdout, sys.stderr, stdout0, stderr0):
            try:
                if f is not None and not getattr(f, "closed", False):
                    f.flush()
            except BaseException:
                pass
        return status

    def program(src, name, mode, g, mark=""):
        if mode == "code" or mode == "cell":
            # Let tracebacks show the program's source lines, which exist only here
            # (those of exit handlers and warnings too).
            text = src.decode() if isinstance(src, bytes) else src
            linecache.cache[name] = (len(text), None, text.splitlines(True), name)
        try:
            if mode == "cell":
                # As the interactive interpreter runs a block: a last expression's
                # value goes to sys.displayhook.
                tree = compile(src, name, "exec", ast.PyCF_ONLY_AST)
                last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
                exec(compile(tree, name, "exec"), g)
                if last is not None and not mark:
                    exec(compile(ast.Interactive([last]), name, "single"), g)
                elif last is not None:
                    show(eval(compile(ast.Expression(last.value), name, "eval"), g), mark)
            else:
                exec(compile(src, name, "exec"), g)
        except SystemExit as e:
            code = e.code
            if code is None:
                return 0
            if isinstance(code, int):
                # CPython reads the status as a C long: outside its range it is -1.
                # The value itself (int.__int__), not what a subclass's operators
                # say: the status must stay within 0-255.
                code = int.__int__(code)
                return (code if -(2**63) <= code < 2**63 else -1) & 0xFF
            # A status that is not a number is printed, and the status is 1.
            try:
                print(code, file=sys.stderr)
            except BaseException:
                pass
            return 1
        except BaseException as e:
            e.__traceback__ = e.__traceback__.tb_next
            try:
                sys.excepthook(type(e), e, e.__traceback__)
            except BaseException:
                pass
            if isinstance(e, KeyboardInterrupt):
                return 130  # as a shell shows a python that SIGINT ended
            # 256 + 1 tells the worker the program ran out of memory (it reports the run
            # as memory_limit, exit status 1): a program's own status is below 256.
            return 0x100 | 1 if isinstance(e, MemoryError) else 1
        return 0

    return run


_sandcell_run = _sandcell_init()
del _sandcell_init, _sandcell_displays_source, _sandcell_tools_source
