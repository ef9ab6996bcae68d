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
    import builtins
    builtins.display = _Displays.display
    reason = "exited"
    try:
        exec(code, main.__dict__)
    except SystemExit:
        raise
    except BaseException as e:
        tb = e.__traceback__
        sys.excepthook(type(e), e, tb.tb_next if tb is not None else None)
        if isinstance(e, MemoryError):
            reason = "memory_limit"
        sys.exit(1)
    finally:
        try:
            _Displays.figures()
        except BaseException as e:
            print("sandcell: the open figures could not be shown: %r" % e, file=sys.stderr)
        _sandcell_report(reason)


class _Displays:
    """What the program displayed, as Jupyter's display() and inline figures give it:
    each object's richest representations, saved whole as workspace files under
    displays/ (the parent checks and reads them; it trusts nothing else of this)."""
    items = []
    prefix = None
    # (type, IPython's method for it, whether it is an image), richest first
    kinds = (("image/png", "_repr_png_", True), ("image/svg+xml", "_repr_svg_", True),
             ("text/html", "_repr_html_", False), ("application/json", "_repr_json_", False))

    @classmethod
    def save(cls, mime, data):
        import os
        if cls.prefix is None:
            cls.prefix = os.urandom(4).hex()
        ext = {"image/png": "png", "image/svg+xml": "svg", "text/html": "html",
               "application/json": "json", "text/plain": "txt"}[mime]
        os.makedirs("/ws/displays", exist_ok=True)
        name = "displays/%s-%d.%s" % (cls.prefix, len(cls.items) + 1, ext)
        if isinstance(data, str):
            data = data.encode("utf-8")
        with open("/ws/" + name, "wb") as f:
            f.write(data)
        cls.items.append({"type": mime, "path": name})

    @classmethod
    def bundle(cls, obj):
        import json
        out = {}
        if hasattr(obj, "_repr_mimebundle_"):
            b = obj._repr_mimebundle_()
            out = dict(b[0] if isinstance(b, tuple) else b or {})
        for mime, method, _ in cls.kinds:
            if mime not in out and hasattr(obj, method):
                v = getattr(obj, method)()
                if isinstance(v, tuple):
                    v = v[0]
                if v is not None:
                    out[mime] = v
        if "application/json" in out and not isinstance(out["application/json"], (str, bytes)):
            out["application/json"] = json.dumps(out["application/json"])
        if "image/png" in out and isinstance(out["image/png"], str):
            import base64
            out["image/png"] = base64.b64decode(out["image/png"])
        out.setdefault("text/plain", repr(obj))
        return out

    @classmethod
    def display(cls, *objs):
        """Show each object as Jupyter's display() does: its richest representation
        (PNG, SVG, HTML, JSON, else its repr), returned with the run's result."""
        for obj in objs:
            mod = type(obj).__module__ or ""
            if mod.startswith("matplotlib.figure"):
                cls.figure(obj)
                continue
            b = cls.bundle(obj)
            for mime, _, image in cls.kinds:
                if mime in b:
                    cls.save(mime, b[mime])
                    if not image:
                        cls.save("text/plain", b["text/plain"])
                    break
            else:
                cls.save("text/plain", b["text/plain"])

    @classmethod
    def figure(cls, fig):
        import io
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
        cls.save("image/png", buf.getvalue())

    @classmethod
    def figures(cls):
        # Every figure still open when the program ends, as the inline backend
        # shows them at the end of a cell.
        import sys
        plt = sys.modules.get("matplotlib.pyplot")
        if plt is None:
            return
        for n in plt.get_fignums():
            cls.figure(plt.figure(n))
        plt.close("all")


def _sandcell_report(reason):
    # One StepReport frame on the control fd (see sandbox/protocol): the parent
    # reads its reason (memory_limit) only for a program that ended with status 1,
    # and its displays only as files it finds and checks itself.
    import json
    import os
    report = json.dumps({"exit_code": 0, "reason": reason, "displays": _Displays.items})
    body = ('{"version":8,"step":"report","report":%s}' % report).encode()
    try:
        os.write(3, len(body).to_bytes(4, "big") + body)
    except OSError:
        pass


_sandcell_run()
