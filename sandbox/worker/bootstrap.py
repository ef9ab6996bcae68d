# Sandcell's guest bootstrap, run as `python -S -I -c <this>` inside python.wasm.
# It starts the interpreter's work that does not depend on the program (so that a
# warm worker has done it before its run is known; a warm guest starts with
# SANDCELL_WARM=1, its only variable, and says it is ready by opening a FIFO), then
# reads the program from its stdin: ten ASCII digits giving the length of a header, then the header, UTF-8
# fields separated by NUL (which no field may contain):
#   MODE, SOURCE-OR-PATH, NAME, N, ARG1..ARGN, KEY1, VALUE1, ...
# MODE "code": SOURCE is the program, NAME its file name ("<string>" for -c);
# MODE "path": PATH is the script (/ws/...), NAME is empty.
# MODE "isolated": as "code", for a program of the daemon's own (the SQL tool, the
# self-test): sys.path stays the read-only standard library alone, so nothing the
# workspace holds is ever imported by it.
# Whatever follows the header is the program's own stdin.
# It makes /ws the working directory and runs the program in __main__ so that it
# behaves as under `python -c CODE ARGS` or `python /ws/PATH ARGS`: same sys.argv, same
# environment, same tracebacks (the bootstrap's own frame is left out), same exit
# status. Exit statuses are reduced modulo 256 as a POSIX exit(3) would (one beyond a
# C long is 255, as native CPython's); WASI itself cannot carry statuses 126-255
# (wasmtime traps, and the run ends as a trap that says so).
def _sandcell_boot():
    import os
    import sys
    import builtins

    # -S skips site, which is what defines exit() and quit(); scripts use them.
    builtins.exit = builtins.quit = sys.exit
    # The first use of the compiler and the evaluation loop costs (pages of code
    # and memory touched once): pay it before the program is known.
    exec(compile("def f(a):\n    return '%d' % (a * 7)\nf(6)", "<warm-up>", "exec"), {})
    if os.environ.pop("SANDCELL_WARM", None) == "1":
        # A warm worker: tell it the interpreter is ready (opening this FIFO waits
        # for the worker to open its other end), then wait for the program.
        open("/ws/.sandcell-ready", "rb", buffering=0).close()

    def read(n):
        b = bytearray()
        while len(b) < n:
            chunk = os.read(0, n - len(b))
            if not chunk:
                os._exit(70)  # EX_SOFTWARE: the worker sent no program
            b += chunk
        return bytes(b)

    fields = read(int(read(10))).decode().split("\0")
    mode, src, name, nargs = fields[0], fields[1], fields[2], int(fields[3])
    args = fields[4:4 + nargs]
    env = fields[4 + nargs:]
    for i in range(0, len(env), 2):
        os.environ[env[i]] = env[i + 1]
    os.chdir("/ws")
    g = globals()
    del g["_sandcell_boot"]
    if mode == "isolated":
        # -I already left the script's directory out; keep only the library's
        # entries, whatever else may have put one there.
        sys.path[:] = [p for p in sys.path if p.startswith("/usr/local/lib/")]
        sys.argv[:] = [name] + args
        g["__file__"] = name
        mode = "code"
    elif mode == "code":
        if name == "<string>":
            sys.argv[:] = ["-c"] + args
        else:
            sys.argv[:] = [name] + args
            g["__file__"] = name
        sys.path.insert(0, "")
    else:
        name = src
        sys.argv[:] = [name] + args
        g["__file__"] = name
        sys.path.insert(0, os.path.dirname(name))
        with open(name, "rb") as f:
            src = f.read()
    try:
        exec(compile(src, name, "exec"), g)
    except SystemExit as e:
        code = e.code
        if code is None or isinstance(code, int):
            code = code or 0
            # CPython reads the status as a C long: outside its range it is -1.
            if not -(2**63) <= code < 2**63:
                code = -1
            raise SystemExit(code & 0xFF) from None
        raise
    except BaseException as e:
        if mode == "code":
            # Let tracebacks show the program's source lines, which exist only here.
            import linecache
            text = src.decode() if isinstance(src, bytes) else src
            linecache.cache[name] = (len(text), None, text.splitlines(True), name)
        e.__traceback__ = e.__traceback__.tb_next
        sys.excepthook(type(e), e, e.__traceback__)
        # 114 tells the worker the program ran out of memory (it reports the run as
        # memory_limit, exit status 1); see memoryErrorStatus in guest.go.
        sys.exit(114 if isinstance(e, MemoryError) else 1)
    # The interpreter's own finalization follows (exit handlers, every module's
    # objects released, files flushed): the worker reports before tearing the store
    # down.


_sandcell_boot()
