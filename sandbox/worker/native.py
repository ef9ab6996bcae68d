# The native backend's runner: the program Debian's python3 starts with (-I -B -c),
# in the hardened process the worker became. It reads the program as the wasm
# bootstrap does (ten digits, then a NUL-separated header, on stdin, before the
# program's own stdin: see worker.Program) and runs it as __main__ with /ws as its
# working directory. Modules in /ws load from source alone: no byte-code is written
# there (-B) and a .pyc without its source is not a module, so what an approval
# bound (the workspace's files) is what runs.
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

    fields = read(int(read(10))).decode("utf-8").split("\0")
    mode, text, name, nargs = fields[0], fields[1], fields[2], int(fields[3])
    args = fields[4:4 + nargs]

    import importlib.machinery as m
    sys.path_hooks[:] = [h for h in sys.path_hooks if getattr(h, "__name__", "") != "path_hook_for_FileFinder"]
    sys.path_hooks.append(m.FileFinder.path_hook(
        (m.ExtensionFileLoader, m.EXTENSION_SUFFIXES), (m.SourceFileLoader, m.SOURCE_SUFFIXES)))
    sys.path_importer_cache.clear()

    # matplotlib's font list, made when the root was built, so that the first figure
    # of each run does not scan the fonts again.
    cfg = os.environ.get("MPLCONFIGDIR", "")
    if cfg.startswith("/tmp/"):
        try:
            os.makedirs(cfg, exist_ok=True)
            for f in os.listdir("/usr/share/sandcell/matplotlib"):
                with open("/usr/share/sandcell/matplotlib/" + f, "rb") as src, open(cfg + "/" + f, "wb") as dst:
                    dst.write(src.read())
        except OSError:
            pass

    import types
    main = types.ModuleType("__main__")
    main.__builtins__ = __builtins__
    sys.modules["__main__"] = main
    if mode == "path":
        sys.argv = [text] + args
        sys.path.insert(0, os.path.dirname(text))
        main.__file__ = text
        with open(text, "rb") as f:
            source = f.read()
        code = compile(source, text, "exec")
    else:
        sys.argv = ["-c" if name == "<string>" else name] + args
        if mode == "code":
            sys.path.insert(0, "")
        code = compile(text, name, "exec")
    del read, fields, text, m
    try:
        exec(code, main.__dict__)
    except SystemExit:
        raise
    except BaseException as e:
        tb = e.__traceback__
        sys.excepthook(type(e), e, tb.tb_next if tb is not None else None)
        if isinstance(e, MemoryError):
            _sandcell_report('{"exit_code":1,"reason":"memory_limit"}')
        sys.exit(1)


def _sandcell_report(report):
    # One StepReport frame on the control fd (see sandbox/protocol): the parent
    # reads its reason only for a program that ended with status 1.
    import os
    body = ('{"version":8,"step":"report","report":%s}' % report).encode()
    try:
        os.write(3, len(body).to_bytes(4, "big") + body)
    except OSError:
        pass


_sandcell_run()
