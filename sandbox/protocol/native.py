# The native backend's runner: the program Debian's python3 starts with (-I -B -c),
# in the hardened process the worker became. It reads the program as the wasm
# bootstrap does (ten digits, then a NUL-separated header, on stdin, before the
# program's own stdin: see worker.Program) and runs it as __main__ with /ws as its
# working directory. Modules in /ws load from source alone: no byte-code is written
# there (-B) and a .pyc without its source is not a module, so what an approval
# bound (the workspace's files) is what runs. The standard modules the runner uses
# after the program has started are imported first, while sys.path holds no entry of
# the workspace's, so that a json.py there is the program's module, never the runner's.
import sys as _sys  # noqa: E402
_sandcell_startup = set(_sys.modules)  # what the interpreter imported to start
import base64 as _b64, io as _io, json as _json, linecache as _lc  # noqa: E401,E402
_sandcell_stdlib = {"base64": _b64, "io": _io, "json": _json, "linecache": _lc}
_sandcell_globals = globals()  # the runner's, never a program's (see _sandcell_print_exception)
del _b64, _io, _json, _lc


def _sandcell_run():
    import os
    import sys

    def read(n):
        b = b""
        while len(b) < n:
            c = os.read(0, n - len(b))
            if not c:
                raise SystemExit("sandcell: the program header ended early")
            b += c
        return b

    # MODE, SOURCE-OR-PATH, NAME, DISK, N, ARG1..ARGN, then the environment (which
    # the worker gave the process itself). DISK is what the wasm guest's
    # shutil.disk_usage reports; this guest has os.statvfs, the kernel's figures.
    fields = read(int(read(10))).decode("utf-8").split("\0")
    if fields[0] == "session":
        # A warm worker claimed for a session (protocol.SessionProgram): its cells
        # come on the control fd, as a cold session's do.
        os.chdir("/ws")
        _sandcell_session()
    mode, text, name, nargs = fields[0], fields[1], fields[2], int(fields[4])
    args = fields[5:5 + nargs]
    if _sandcell_control_env:
        # Under gVisor the caller's environment comes now, after the contract, not
        # before the interpreter: what only the dynamic loader reads (LD_PRELOAD)
        # takes no part, and no code of the caller's ran before the contract.
        env = fields[5 + nargs:]
        for k, v in zip(env[0::2], env[1::2]):
            os.environ[k] = v
    os.chdir("/ws")  # (a warm worker imported from "/": see _sandcell_preimport)

    _sandcell_setup()
    import types
    main = types.ModuleType("__main__")
    main.__builtins__ = __builtins__
    sys.modules["__main__"] = main
    if mode == "path":
        sys.argv = [text] + args
        sys.path.insert(0, os.path.dirname(text))
        main.__file__ = text
    else:
        sys.argv = ["-c" if name == "<string>" else name] + args
        if mode == "code":
            sys.path.insert(0, "")
    del read, fields
    if mode != "isolated":
        _sandcell_unshadow(sys.path[0] or ".")
    _sandcell_install_tools()
    import builtins
    builtins.display = _Displays.display
    reason = "exited"
    try:
        # Compiled here, so that a SyntaxError is reported as the program's.
        if mode == "path":
            with open(text, "rb") as f:
                code = compile(f.read(), text, "exec")
        else:
            code = compile(text, name, "exec")
            # Tracebacks show the program's lines, as python3 -c's do: -c
            # registers source by code object (filename, name, first line), and the
            # runner's own is "<string>" too.
            linecache = _sandcell_stdlib["linecache"]
            getattr(linecache, "_register_code", lambda *a: None)(code, text, name)
        del text
        exec(code, main.__dict__)
    except SystemExit:
        raise
    except BaseException as e:
        _sandcell_print_exception(e)
        if isinstance(e, MemoryError):
            reason = "memory_limit"
        sys.exit(1)
    finally:
        try:
            _Displays.figures()
        except BaseException as e:
            print("sandcell: the open figures could not be shown: %r" % e, file=sys.stderr)
        _sandcell_report(reason)


def _sandcell_print_exception(e):
    # An uncaught exception as python3 shows it: the program's frames, without the
    # runner's that lead to them (the runner's globals are not the program's).
    import sys
    tb = e.__traceback__
    while tb is not None and tb.tb_frame.f_globals is _sandcell_globals:
        tb = tb.tb_next
    e.__traceback__ = tb
    sys.excepthook(type(e), e, tb)


def _sandcell_setup():
    # What every guest's interpreter gets before its program: modules load from
    # source or from the root's extension modules alone (a .pyc without its source,
    # which an approval of the workspace's files would not show, is not a module),
    # and matplotlib's font list, made when the root was built, so that the first
    # figure does not scan the fonts again.
    import importlib.machinery as m
    import os
    import sys
    sys.path_hooks[:] = [h for h in sys.path_hooks if getattr(h, "__name__", "") != "path_hook_for_FileFinder"]
    sys.path_hooks.append(m.FileFinder.path_hook(
        (m.ExtensionFileLoader, m.EXTENSION_SUFFIXES), (m.SourceFileLoader, m.SOURCE_SUFFIXES)))
    sys.path_importer_cache.clear()
    cfg = os.environ.get("MPLCONFIGDIR", "")
    if cfg.startswith("/tmp/"):
        try:
            os.makedirs(cfg, exist_ok=True)
            for f in os.listdir("/usr/share/sandcell/matplotlib"):
                with open("/usr/share/sandcell/matplotlib/" + f, "rb") as src, open(cfg + "/" + f, "wb") as dst:
                    dst.write(src.read())
        except OSError:
            pass


def _sandcell_preimport(names):
    # A warm worker's imports, done before its run is known (the parent fills stdin
    # with the program once it is). Nothing of the workspace's may take part: no
    # caller's code may run before the claim. sys.path holds no workspace entry
    # (-I), the working directory is "/" of the read-only root until the program
    # comes (matplotlib reads a matplotlibrc from it; a workspace with one gets a
    # cold worker), the environment is the runner's own (a run with an environment
    # of its own gets a cold worker), HOME and MPLCONFIGDIR are in this worker's new
    # /tmp. The imports' output is discarded, and their warnings while they run, so
    # that none of it is taken for the program's; the filters they install stay. A
    # module that fails is left for the program to import itself.
    import importlib
    import os
    import sys
    import warnings
    os.chdir("/")
    null = os.open("/dev/null", os.O_WRONLY)
    saved = os.dup(1), os.dup(2)
    os.dup2(null, 1)
    os.dup2(null, 2)
    warnings.simplefilter("ignore")
    quiet = warnings.filters[0]
    try:
        for name in names:
            try:
                importlib.import_module(name)
            except Exception:
                pass
        # What the imports made lives as long as the interpreter: the collector
        # leaves it alone from now on, so that neither the program's collections
        # nor the interpreter's finalization at its end walk it (a run's end after
        # numpy, pandas and matplotlib.pyplot: about 190 ms of finalization without
        # this, 35 with). Only the imports' objects are frozen: the program's are
        # collected as ever. Collected here, while the imports' output is still
        # discarded. (gc.get_objects() and gc.get_referrers() no longer see the
        # frozen ones, as in the wasm snapshot: docs/operator.md says so.)
        import gc
        gc.collect()
        gc.freeze()
    finally:
        try:
            warnings.filters.remove(quiet)
            getattr(warnings, "_filters_mutated", lambda: None)()
        except ValueError:
            pass
        for f in (sys.stdout, sys.stderr):
            try:
                f.flush()
            except Exception:
                pass
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (null,) + saved:
            os.close(fd)
    _sandcell_flush_at_exit()


def _sandcell_flush_at_exit():
    # A file the program leaves open is flushed when the interpreter ends, as under
    # a plain python3, even where only a frozen object (an imported class, a cache
    # of a library's) still holds it: the collector never frees those, so the file
    # would be lost unflushed. This handler is registered before the program runs,
    # so it runs after the program's own. It flushes the standard streams first
    # (they are frozen, and flushed by the interpreter only after the exit
    # handlers: a program that makes this handler hang keeps its output), then the
    # files open() made (text layers first: they write into the buffers), matched
    # by exact type with functions bound now, so no method or class of the
    # program's runs here. It closes nothing; what a finalizer writes later to a
    # file only a frozen object holds is lost (docs/operator.md). gc.get_objects()
    # lists no frozen object: this walks what the program made.
    import atexit
    import gc
    import io
    import sys
    get_objects, exact, streams = gc.get_objects, type, (sys.__stdout__, sys.__stderr__)
    layers = ((io.TextIOWrapper,), (io.BufferedWriter, io.BufferedRandom))

    def flush_files():
        for f in streams:
            try:
                f.flush()
            except BaseException:
                pass
        try:
            found = ([], [])
            for o in get_objects():
                t = exact(o)
                for i, kinds in enumerate(layers):
                    if t in kinds:
                        found[i].append(o)
                        break
            for layer in found:
                for f in layer:
                    try:
                        if not f.closed:
                            f.flush()
                    except BaseException:
                        pass
        except BaseException:
            pass
    atexit.register(flush_files)


def _sandcell_unshadow(entry):
    # The program's first sys.path entry (the workspace, or its script's directory)
    # may hold a module of its own named as one the runner (or a warm worker's
    # preimports) imported after the interpreter started: a json.py, say. The
    # program's imports find its own, as under a plain python3, and what was
    # imported keeps what it imported.
    import os
    import sys
    names = sorted({k.partition(".")[0] for k in set(sys.modules) - _sandcell_startup})
    try:
        here = set(os.listdir(entry))
    except OSError:
        return
    for top in names:
        if top + ".py" in here or (top in here and os.path.exists(os.path.join(entry, top, "__init__.py"))):
            for k in [k for k in sys.modules if k == top or k.startswith(top + ".")]:
                del sys.modules[k]


_Displays = _sandcell_displays(_sandcell_stdlib["io"], _sandcell_stdlib["json"], _sandcell_stdlib["base64"])
del _sandcell_displays


def _sandcell_tools_restored():
    pass  # (until _sandcell_install_tools)


def _sandcell_install_tools():
    # sandcell.tools (tools.py) over the tools channel (protocol.ToolsFD, 6): the
    # runner keeps its own close-on-exec descriptor of it (a program that closes 6
    # loses nothing of the runner's), and sends each call as a frame, reading the
    # answer's, one at a time. Installed after _sandcell_unshadow: a workspace
    # sandcell.py is not this module.
    import fcntl
    import os
    import sys
    import types
    json = _sandcell_stdlib["json"]
    fd = -1
    if not _sandcell_control_env:  # (under gVisor the runner has its stdio alone)
        try:
            fd = fcntl.fcntl(6, fcntl.F_DUPFD_CLOEXEC, 10)
            os.close(6)
        except OSError:
            pass

    def read(n):
        b = b""
        while len(b) < n:
            c = os.read(fd, n - len(b))
            if not c:
                raise OSError("the channel ended")
            b += c
        return b

    ids = [0]

    owner = [os.getpid()]

    def restored():
        # This process is a checkpoint carrying on as the interpreter: calls are
        # its own now, and what its ended interpreter left unread on the channel
        # (an answer cut short; the parent has stopped writing, see the parent's
        # toolServer.Reset) is discarded.
        owner[0] = os.getpid()
        if fd < 0:
            return
        os.set_blocking(fd, False)
        try:
            while os.read(fd, 1 << 16):
                pass
        except OSError:
            pass
        finally:
            os.set_blocking(fd, True)

    global _sandcell_tools_restored
    _sandcell_tools_restored = restored

    def call(msg):
        # Each call has a number its answer carries back: an answer of another
        # (an earlier cell's call, ended as the cell was rolled back to its
        # checkpoint, which shares this channel) is passed over; one without a
        # number answers a frame the parent could not read, which is this one.
        # Drawn at random: a checkpoint that carries on would count from where it
        # was forked. Calls come from the program's own process: a forked one
        # would share the channel with it (and take its answers).
        if fd < 0:
            return {"error": {"class": "ToolDenied", "message": "no tools are offered to this run"
                              " (under gVisor a native run has no tools channel)"}}
        if os.getpid() != owner[0]:
            return {"error": {"class": "ToolError", "message": "tools are called from the program's own "
                              "process, not from a process it forked"}}
        ids[0] = 1 + int.from_bytes(os.urandom(6), "big")
        msg = dict(msg, id=ids[0])
        body = ('{"version":%d,"step":"tool_call","call":%s}' % (_sandcell_version, json.dumps(msg))).encode()
        b = memoryview(len(body).to_bytes(4, "big") + body)
        while len(b):
            b = b[os.write(fd, b):]
        while True:
            answer = json.loads(read(int.from_bytes(read(4), "big"))).get("answer") or {}
            if answer.get("id") in (ids[0], None):
                return answer

    pkg, mod = _sandcell_tools(call, json, types)
    sys.modules["sandcell"], sys.modules["sandcell.tools"] = pkg, mod



def _sandcell_report(reason):
    # The run's report: the parent reads its reason (memory_limit) only for a
    # program that ended with status 1, and its displays only as files it finds and
    # checks itself.
    try:
        _sandcell_send({"exit_code": 0, "reason": reason, "displays": _Displays.take()}, "report")
    except OSError:
        pass


def _sandcell_session():
    # A session: the interpreter stays, and runs the cells the parent sends on the
    # control fd (protocol.StepCell) one at a time in one namespace, as the wasm
    # bootstrap does: a last expression's value goes between the cell's value marks
    # on stdout (and, where it has a rich representation, to the displays), the
    # figures left open are displays, and the cell's end marker follows its output on
    # both streams before its report.
    #
    # With checkpoints, this process (pid 1 of the session's pid namespace) forks the
    # interpreter and stays as its reaper, running no cell; before each cell the
    # interpreter forks a checkpoint of itself (only the fork the parent allows
    # passes the filter: seccomp.WithCheckpoints), which stops itself at once and
    # then waits on a pipe only the interpreter writes to. The parent ends it
    # between cells once the cell has ended by itself; a cell that does not is
    # ended by the parent killing the interpreter and continuing the checkpoint,
    # which reads the pipe's end and carries on as the interpreter, from the state
    # before the cell (its only thread the one that forked: a cell's threads are not
    # in it). Without checkpoints the parent ends the session when a cell does not
    # end by itself.
    import ast
    import base64
    import io
    import json
    import linecache
    import os
    import sys
    import types

    def recv():
        head = os.read(_sandcell_ctl, 4)
        if len(head) < 4:
            return None
        n, body = int.from_bytes(head, "big"), b""
        while len(body) < n:
            c = os.read(_sandcell_ctl, n - len(body))
            if not c:
                return None
            body += c
        return json.loads(body)

    def write_all(fd, b):
        b = memoryview(b)
        while len(b):
            b = b[os.write(fd, b):]

    def flush():
        for f in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            try:
                if f is not None and not f.closed:
                    f.flush()
            except BaseException:
                pass

    def show(value, mark):
        if value is None:
            return
        if type(value).__module__.startswith("matplotlib") or any(
                hasattr(value, m) for m in ("_repr_mimebundle_", "_repr_png_", "_repr_svg_", "_repr_html_", "_repr_json_")):
            try:
                _Displays.display(value)
            except BaseException as e:
                print("sandcell: the value could not be displayed: %r" % e, file=sys.stderr)
        shown, saved = io.StringIO(), sys.stdout
        sys.stdout = shown
        try:
            sys.displayhook(value)
        finally:
            sys.stdout = saved
        text = shown.getvalue()
        if text.endswith("\n"):
            text = text[:-1]
        if text:
            flush()
            write_all(out, b"\0\x1bsandcell-value " + mark.encode() + b"\0" + text.encode("utf-8", "surrogateescape") +
                      b"\0\x1bsandcell-end " + mark.encode() + b"\0")

    def run(src, name, g, mark):
        linecache.cache[name] = (len(src), None, src.splitlines(True), name)
        try:
            tree = compile(src, name, "exec", ast.PyCF_ONLY_AST)
            last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
            exec(compile(tree, name, "exec"), g)
            if last is not None:
                show(eval(compile(ast.Expression(last.value), name, "eval"), g), mark)
        except SystemExit as e:
            code = e.code
            if code is None:
                return 0
            if isinstance(code, int):
                code = int.__int__(code)
                return (code if -(2**63) <= code < 2**63 else -1) & 0xFF
            print(code, file=sys.stderr)
            return 1
        except BaseException as e:
            _sandcell_print_exception(e)
            return 130 if isinstance(e, KeyboardInterrupt) else 1
        return 0

    def wait_for(pid):
        while True:
            try:
                return os.waitpid(pid, 0)
            except InterruptedError:
                pass
            except ChildProcessError:
                return None

    def reap_forever():
        # pid 1: reap the interpreters the checkpoints replace, until none is left.
        # A signal from inside the namespace reaches pid 1 only where it has a
        # handler: it keeps none (Python's for SIGINT would end it, and the session).
        import signal
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        for fd in (0, 1, 2, 3):
            os.close(fd)
        while True:
            try:
                os.wait()
            except InterruptedError:
                pass
            except ChildProcessError:
                os._exit(0)

    def checkpoint():
        # (pid, pipe) in the interpreter; None when the fork was refused; "restored"
        # in the checkpoint, once the interpreter it was taken from is gone.
        import signal
        import warnings
        flush()
        r, w = os.pipe()
        # The interpreter's end, w, is kept apart from the cell's descriptors (as
        # the streams' and the control channel's are): a cell that closes low
        # descriptors and opens files of its own is never given w's number.
        high = fcntl.fcntl(w, fcntl.F_DUPFD_CLOEXEC, 10)
        os.close(w)
        w = high
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # forking a process with threads
                pid = os.fork()
        except OSError:
            os.close(r)
            os.close(w)
            return None
        if pid:
            os.close(r)
            return pid, w
        # The checkpoint stops at once: the parent keeps it only stopped, and
        # continues it only to carry on as the interpreter.
        os.kill(os.getpid(), signal.SIGSTOP)
        os.close(w)
        while True:
            try:
                b = os.read(r, 1)
                break
            except InterruptedError:
                pass
        if b:
            os._exit(0)  # the cell it stood for ended by itself
        os.close(r)
        _sandcell_tools_restored()
        return "restored"

    def release(kept):
        # The last cell ended by itself: its checkpoint is not needed.
        if isinstance(kept, tuple):
            pid, w = kept
            try:
                os.write(w, b"x")
            except OSError:
                pass  # ended already: the parent ends what a cell left
            try:
                os.close(w)
            except OSError:
                pass  # the cell closed it
            wait_for(pid)

    checkpoints = _sandcell_checkpoints
    if checkpoints and os.fork():
        reap_forever()
    # The runner's own descriptors of the streams and the control channel, apart
    # from 1, 2 and 3: a cell that closes or redirects those (os.dup2 of
    # /dev/null over stdout) changes where its own output goes, not where the
    # markers and reports that end it go. A cell that closes these too breaks its
    # runner: the interpreter ends, and the cell is rolled back (its checkpoint's
    # are intact), or, without a checkpoint, the session is lost.
    import fcntl
    out, err, ctl = (fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in (1, 2, 3))
    global _sandcell_ctl
    _sandcell_ctl = ctl
    _sandcell_setup()
    main = types.ModuleType("__main__")
    main.__builtins__ = __builtins__
    sys.modules["__main__"] = main
    sys.argv[:] = [""]
    sys.path.insert(0, "")
    _sandcell_unshadow(".")
    _sandcell_install_tools()
    import builtins
    builtins.display = _Displays.display
    _sandcell_send({"exit_code": 0, "reason": "exited"}, "report")  # open
    kept = None
    while True:
        f = recv()
        if f is None or f.get("step") != "cell":
            os._exit(0)
        req = f["request"]
        if checkpoints:
            release(kept)
            kept = checkpoint()
            if kept == "restored":
                # The cell's output ends with the checkpoint's marker (the end
                # marker, its last byte inverted), after all the ended one wrote.
                kept = None
                end = base64.b64decode(req.get("cell_end") or "")
                if end:
                    mark = end[:-1] + bytes([end[-1] ^ 0xFF])
                    write_all(out, mark)
                    write_all(err, mark)
                _sandcell_send({"exit_code": 0, "reason": "exited", "rolled_back": True}, "report")
                continue
        _sandcell_send(None, "ack")
        os.environ.update(req.get("env") or {})
        sys.stdin = io.TextIOWrapper(io.BytesIO(base64.b64decode(req.get("stdin") or "")), encoding="utf-8",
                                     errors="surrogateescape")
        status = run(req.get("code", ""), req.get("filename") or "<cell>", main.__dict__, req.get("value_mark", ""))
        try:
            _Displays.figures()
        except BaseException as e:
            print("sandcell: the open figures could not be shown: %r" % e, file=sys.stderr)
        flush()
        end = base64.b64decode(req.get("cell_end") or "")
        write_all(out, end)
        write_all(err, end)
        _sandcell_send({"exit_code": status, "reason": "exited", "displays": _Displays.take()}, "report")


_sandcell_ctl = 3  # the control channel's descriptor (a session's runner keeps its own)


def _sandcell_send(report, step):
    # One frame on the control channel (see sandbox/protocol).
    json = _sandcell_stdlib["json"]
    import os
    body = ('{"version":%d,"step":"%s"%s}' % (_sandcell_version, step, "" if report is None else ',"report":' + json.dumps(report))).encode()
    b = memoryview(len(body).to_bytes(4, "big") + body)
    while len(b):
        b = b[os.write(_sandcell_ctl, b):]


_sandcell_control_env = False  # the caller's environment is in the header (see below)


def _sandcell_control():
    # A run under gVisor (runsc passes its container no descriptor but its stdio):
    # stdin is a socket, the parent's, and the control channel too (fd 3, which
    # the program's closing stdin leaves open). Before the program is read (the
    # parent writes it only once it has checked this), the runner says what the
    # kernel it runs on (gVisor's) has in force for it, as a hardened worker does
    # before its exec: the seccomp mode, no_new_privs, the capability sets, the
    # resource limits. Nothing of the caller's has run yet.
    global _sandcell_control_env
    _sandcell_control_env = True
    import ctypes
    import os
    import resource
    os.dup2(0, 3, inheritable=False)
    status = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            status[k] = v.strip()
    # (A kernel without ambient capabilities, gVisor's, has no CapAmb line.)
    caps = [int(status.get(k, "1"), 16) for k in ("CapInh", "CapPrm", "CapEff", "CapBnd")]
    caps.append(int(status.get("CapAmb", "0"), 16))
    libc = ctypes.CDLL(None, use_errno=True)
    nnp = libc.prctl(39, 0, 0, 0, 0)  # PR_GET_NO_NEW_PRIVS
    limits = {}
    for name in ("CORE", "CPU", "DATA", "FSIZE", "NOFILE", "NPROC", "AS"):
        soft = resource.getrlimit(getattr(resource, "RLIMIT_" + name))[0]
        if soft != resource.RLIM_INFINITY:
            limits[name] = soft
    seccomp = status.get("Seccomp") == "2"
    # The filter lets clone3 through to this kernel, which must not have it
    # (ENOSYS): its flags, unlike clone's, are out of a filter's reach.
    if libc.syscall(435, None, 0) != -1 or ctypes.get_errno() != 38:  # clone3, ENOSYS
        seccomp = False
    _sandcell_send({"exit_code": 0, "reason": "", "enforcement": {
        "backend": "native",
        "seccomp": {"active": seccomp, "mode": "filter" if seccomp else "disabled"},
        "landlock": {"active": False, "abi": 0},
        "namespaces": {},
        "rlimits": limits,
        "no_new_privs": nnp == 1,
        "capabilities": "=" if not any(caps) else "caps " + " ".join("%x" % c for c in caps)}}, "exec")


import sys as _sys  # noqa: E402
_sandcell_checkpoints = _sys.argv[1:2] == ["checkpoints"]  # a session's, if it becomes one
if _sandcell_checkpoints:
    del _sys.argv[1]
if _sys.argv[1:] == ["control"]:
    _sandcell_control()
    del _sys
    _sandcell_run()
elif _sys.argv[1:] == ["session"]:
    del _sys
    _sandcell_session()
else:
    if _sys.argv[1:2] == ["preimport"]:
        _sandcell_setup()
        _sandcell_preimport(_sys.argv[2:])
        _sandcell_send(None, "ready")  # (protocol.StepReady: the imports are done)
    del _sys
    _sandcell_run()
