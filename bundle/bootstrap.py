# Sandcell's guest bootstrap. It runs once, in __main__, when the interpreter's
# snapshot is made (bundle/interpreter/sandcell.c, sandcell_init): it does the work
# that does not depend on any program (the modules agents use most imported, the
# compiler and evaluation loop warmed), and it defines _sandcell_run, which the C side
# takes out of __main__ and calls once in every run, in a fresh copy of that state.
#
# _sandcell_run reads the program from stdin: ten ASCII digits giving the length of a
# header, then the header, UTF-8 fields separated by NUL (which no field may contain):
#   MODE, SOURCE-OR-PATH, NAME, N, ARG1..ARGN, KEY1, VALUE1, ...
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
    from builtins import (BaseException, KeyboardInterrupt, MemoryError, SystemExit, bytearray, bytes,  # noqa: F401
                          compile, enumerate, eval, exec, getattr, id, int, isinstance, issubclass, len, memoryview, print,
                          range, set,
                          str, type)
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
    from _sandcell import forget_locks, reseed_sqlite

    # -S skips site, which is what defines exit() and quit(); scripts use them.
    builtins.exit = builtins.quit = sys.exit
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

    # Whether the run opened a file or a database: only then can a file object or a
    # connection the program left open outlive __main__ (see end()).
    opened = []

    def audit(event, args):
        if not opened and (event == "open" or event == "sqlite3.connect"):
            opened.append(event)

    sys.addaudithook(audit)
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
        mode, src, name, nargs = fields[0], fields[1], fields[2], int(fields[3])
        args = fields[4:4 + nargs]
        env = fields[4 + nargs:]
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
        status = program(src, name, "cell", g, mark)
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
del _sandcell_init
