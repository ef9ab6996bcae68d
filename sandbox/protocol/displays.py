# What both guests' display() is (the native runner begins with this file; the wasm
# bootstrap compiles it from a string under a name of its own, "<sandcell display>",
# see bundle/snapshot.go): Jupyter's display(), with each object's richest
# representations saved whole as workspace files under displays/, which the parent
# checks and reads (it trusts nothing else of this). The modules are the caller's,
# imported before any of the program's: a workspace json.py is never this one's.


def _sandcell_displays(io, json, base64):
    # What the program may replace later (builtins, json's functions) is bound now.
    open_, dumps = open, json.dumps
    MAX = 64  # the most displays of a run or cell (protocol.MaxDisplays)

    class Displays:
        """What the program displayed, as Jupyter's display() and inline figures give it:
        each object's richest representations, saved whole as workspace files under
        displays/ (the parent checks and reads them; it trusts nothing else of this)."""
        items = []  # since the last report (or dump): the run's, or the cell's
        prefix = None  # the interpreter's: its files are PREFIX-N.EXT, N counting on
        count = 0  # across a session's cells
        # (type, IPython's method for it, whether it is an image), richest first
        kinds = (("image/png", "_repr_png_", True), ("image/svg+xml", "_repr_svg_", True),
                 ("text/html", "_repr_html_", False), ("application/json", "_repr_json_", False))

        @classmethod
        def save(cls, mime, data):
            import os
            import sys
            if len(cls.items) >= MAX:
                if len(cls.items) == MAX:
                    cls.items.append(None)  # (said once)
                    print("sandcell: more than %d displays: the rest are not shown" % MAX, file=sys.stderr)
                return
            if cls.prefix is None:
                cls.prefix = os.urandom(4).hex()
            ext = {"image/png": "png", "image/svg+xml": "svg", "text/html": "html",
                   "application/json": "json", "text/plain": "txt"}[mime]
            os.makedirs("/ws/displays", exist_ok=True)
            cls.count += 1
            name = "displays/%s-%d.%s" % (cls.prefix, cls.count, ext)
            if isinstance(data, str):
                data = data.encode("utf-8")
            with open_("/ws/" + name, "wb") as f:
                f.write(data)
            cls.items.append({"type": mime, "path": name})

        @classmethod
        def bundle(cls, obj):
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

    def take():
        # The items so far, as the report names them, and none after: whatever a
        # program put in the list itself is not an item.
        items, Displays.items = Displays.items, []
        return [d for d in items if type(d) is dict and type(d.get("type")) is str and type(d.get("path")) is str]

    def dump(path):
        # The items so far, as JSON in a new file at path (where a wasm guest leaves
        # them for its worker: it has no channel of its own), then none. A failure
        # is said on stderr: the files are in displays/, unlisted.
        import os
        import sys
        try:
            items = take()
            if not items:
                return
            try:
                os.unlink(path)
            except OSError:
                pass
            with open_(path, "x") as f:
                f.write(dumps(items))
        except BaseException as e:
            try:
                print("sandcell: the displays could not be listed: %r" % (e,), file=sys.stderr)
            except BaseException:
                pass

    Displays.take, Displays.dump = staticmethod(take), staticmethod(dump)
    return Displays
