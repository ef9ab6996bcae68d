# Sandcell's guest bootstrap, run as `python -I -c <this> MODE ...` inside python.wasm.
# It makes /ws the working directory, then runs the program in __main__ so that it
# behaves as under `python -c CODE ARGS` or `python /ws/PATH ARGS`: same sys.argv, same
# tracebacks (the bootstrap's own frame is left out), same exit status.
#   MODE "code": argv = [-c, code, filename, *args]
#   MODE "path": argv = [-c, path, *args]
def _sandcell_boot():
    import os
    import sys

    mode = sys.argv.pop(1)
    os.chdir("/ws")
    g = globals()
    del g["_sandcell_boot"]
    if mode == "code":
        src = sys.argv.pop(1)
        name = sys.argv.pop(1)
        sys.argv[0] = "-c" if name == "<string>" else name
        sys.path.insert(0, "")
    else:
        name = sys.argv.pop(1)
        sys.argv[0] = name
        g["__file__"] = name
        sys.path.insert(0, os.path.dirname(name))
        with open(name, "rb") as f:
            src = f.read()
    try:
        code = compile(src, name, "exec")
        del src
        exec(code, g)
    except SystemExit:
        raise
    except BaseException as e:
        e.__traceback__ = e.__traceback__.tb_next
        sys.excepthook(type(e), e, e.__traceback__)
        sys.exit(1)


_sandcell_boot()
