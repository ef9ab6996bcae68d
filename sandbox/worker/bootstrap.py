# Sandcell's guest bootstrap, run as `python -I -c <this> MODE ...` inside python.wasm.
# It makes /ws the working directory, then runs the program in __main__ so that it
# behaves as under `python -c CODE ARGS` or `python /ws/PATH ARGS`: same sys.argv, same
# tracebacks (the bootstrap's own frame is left out), same exit status.
#   MODE "code": argv = [-c, code, filename, *args]
#   MODE "path": argv = [-c, path, *args]
# Exit statuses are reduced modulo 256 as a POSIX exit(3) would (one beyond a C long
# is 255, as native CPython's); WASI itself cannot
# carry statuses 126-255 (wasmtime traps, and the run ends as a trap that says so).
def _sandcell_boot():
    import os
    import sys

    mode = sys.argv.pop(1)
    os.chdir("/ws")
    # -S skips site, which is what defines exit() and quit(); scripts use them.
    import builtins
    builtins.exit = builtins.quit = sys.exit
    g = globals()
    del g["_sandcell_boot"]
    if mode == "code":
        src = sys.argv.pop(1)
        name = sys.argv.pop(1)
        if name == "<string>":
            sys.argv[0] = "-c"
        else:
            sys.argv[0] = g["__file__"] = name
        sys.path.insert(0, "")
    else:
        name = sys.argv.pop(1)
        sys.argv[0] = name
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
        sys.exit(1)


_sandcell_boot()
