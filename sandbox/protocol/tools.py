# What both guests' sandcell.tools is (the native runner and the wasm bootstrap begin
# with this file, as with displays.py): the tools the daemon offers this run or cell,
# as Python functions. Each call goes over the tools channel (see tools.go) to the
# daemon, which checks it (who may call what, the run's limits), asks a person where
# it writes, calls the tool and records the call; the guest holds nothing but its
# own end of the channel. call(dict) -> dict is that end: the wasm interpreter's
# host function, or the native runner's frames on its descriptor.


def _sandcell_tools(call, json, types):
    MAX = 8 << 20  # the largest frame the channel carries (protocol.MaxToolFrame)
    ENVELOPE = 4 << 10  # what a frame holds besides a call's own JSON

    class ToolError(Exception):
        """A tool call failed: the tool ran and failed, or could not be reached. The
        other classes are kinds of it."""

    class ToolDenied(ToolError):
        """The caller may not call this tool (or no such tool is offered)."""

    class ApprovalDeclined(ToolError):
        """The call needed a person's approval, and it was declined (or not given in
        time)."""

    class ToolLimit(ToolError):
        """A limit of this run's tool calls was reached (calls, bytes, time)."""

    classes = {c.__name__: c for c in (ToolError, ToolDenied, ApprovalDeclined, ToolLimit)}
    busy = []  # a call in progress: calls are made one at a time
    missing = type("NotGiven", (), {"__repr__": lambda self: "<not given>"})()  # an optional argument left out
    mod = types.ModuleType("sandcell.tools", "The tools this run may call (help() lists them).")
    pkg = types.ModuleType("sandcell", "Sandcell's guest modules: sandcell.tools.")
    pkg.__path__ = []
    pkg.tools = mod
    state = {"specs": None}

    def exchange(msg):
        if busy:
            raise ToolError("a tool call is already in progress in this program: "
                            "calls are made one at a time (not from another thread or from within a call)")
        busy.append(1)
        try:
            answer = call(msg)
        except (OSError, ValueError, RuntimeError) as e:
            raise ToolError("the tools channel failed: %s" % e) from None
        finally:
            busy.clear()
        err = answer.get("error")
        if err:
            raise classes.get(err.get("class"), ToolError)(err.get("message", "the call failed"))
        return answer

    def invoke(name, args):
        payload = json.dumps({"tool": name, "arguments": args}, allow_nan=False)
        if len(payload.encode("utf-8")) > MAX - ENVELOPE:
            raise ToolLimit("the arguments of %s are %d bytes, more than a call carries (%d)"
                            % (name, len(payload.encode("utf-8")), MAX - ENVELOPE))
        return exchange({"tool": name, "arguments": args}).get("result")

    def doc(spec):
        lines = [spec.get("description") or "(no description)"]
        props = (spec.get("input_schema") or {}).get("properties") or {}
        if props:
            lines.append("")
            lines.append("Arguments:")
            for k, v in props.items():
                v = v if isinstance(v, dict) else {}
                t = v.get("type", "any")
                lines.append("  %s (%s): %s" % (k, t if isinstance(t, str) else "/".join(map(str, t)),
                                                 v.get("description", "")))
        if spec.get("writes"):
            lines.append("")
            lines.append("Writes: a call may wait for a person's approval (ApprovalDeclined if declined).")
        return "\n".join(lines)

    def function(spec):
        group, _, short = spec["name"].partition(".")
        schema = spec.get("input_schema") or {}
        props = schema.get("properties") or {}
        required = [k for k in schema.get("required") or [] if k in props]
        names = list(props)
        f = None
        if props and short.isidentifier() and all(isinstance(k, str) and k.isidentifier() and not k.startswith("_") for k in names):
            # A signature of the schema's own names: required ones first (positional
            # or keyword), the rest keyword-only and left out when not given. A name
            # that is a Python keyword does not compile, and a schema that names no
            # properties takes any: then keywords alone.
            opt = [k for k in names if k not in required]
            params = required + (["*"] + ["%s=_missing" % k for k in opt] if opt else [])
            body = "{%s}" % ", ".join("%r: %s" % (k, k) for k in names)
            src = ("def %s(%s):\n    args = %s\n    return _invoke(%r, {k: v for k, v in args.items() if v is not _missing})\n"
                   % (short, ", ".join(params), body, spec["name"]))
            ns = {"_invoke": invoke, "_missing": missing}
            try:
                exec(compile(src, "<sandcell tool %s>" % spec["name"], "exec"), ns)
                f = ns[short]
            except SyntaxError:
                pass
        if f is None:
            def f(**kwargs):
                return invoke(spec["name"], kwargs)
            f.__name__ = short if short.isidentifier() else "tool"
        f.__qualname__ = spec["name"]
        f.__module__ = "sandcell.tools"
        f.__doc__ = doc(spec)
        return group, short, f

    def load():
        if state["specs"] is None:
            specs = exchange({"list": True}).get("tools") or []
            groups = {}
            for spec in specs:
                try:
                    group, short, f = function(spec)
                    ns = groups.get(group)
                    if ns is None:
                        ns = groups[group] = types.SimpleNamespace()
                    setattr(ns, short, f)
                except Exception:
                    continue  # a name no namespace can hold: that tool alone is left out
            for group, ns in groups.items():
                setattr(mod, group, ns)
            state["specs"] = specs
        return state["specs"]

    def help():
        """Print the tools this run may call, one line each."""
        specs = load()
        if not specs:
            print("No tools are offered to this run.")
            return
        for spec in specs:
            first = (spec.get("description") or "").strip().split("\n")[0]
            print("%s%s  %s" % (spec["name"], " [writes]" if spec.get("writes") else "", first))
        print("help(sandcell.tools.GROUP.NAME) shows one tool's arguments.")

    def tools():
        """The tools this run may call: a list of {name, description, input_schema, writes}."""
        return [dict(s) for s in load()]

    def getattr_(name):
        if name.startswith("__"):
            raise AttributeError(name)
        load()
        try:
            return mod.__dict__[name]
        except KeyError:
            raise AttributeError("sandcell.tools offers no %r (help() lists what it offers)" % name) from None

    def dir_():
        load()
        return sorted(mod.__dict__)

    for c in classes.values():
        c.__module__ = "sandcell.tools"
        setattr(mod, c.__name__, c)
    mod.help, mod.list = help, tools
    mod.__getattr__, mod.__dir__ = getattr_, dir_
    return pkg, mod
