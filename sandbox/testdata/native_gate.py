# The native gate's harness (see TestNativeStackSuites in ../native_gate_test.go): it
# runs one suite with pytest inside a native run and writes every test's outcome to
# /ws/native-gate.json. Arguments: a JSON object {"deselect": [[id, cause], ...]}
# (an id deselects every test it equals or is a prefix of, at "::" or "["; its
# cause is counted), then pytest's own arguments.
#
# The root is read-only and pytest must write nothing to it: no cache (-p
# no:cacheprovider), no byte-code (the runner's -B: pytest's assertion rewriting
# then keeps its rewritten modules in memory only), temporary files in the run's
# /tmp, and the working directory (matplotlib's result_images, hypothesis' home) is
# the workspace.
import json
import os
import sys
import time

import pytest

# Hypothesis keeps its example database in the workspace; numpy's conftest.py moves
# its home to /tmp. Both suites load their own deterministic or CI profile.
os.environ.setdefault("HYPOTHESIS_STORAGE_DIRECTORY", "/ws/.hypothesis")

spec = json.loads(sys.argv[1])
args = sys.argv[2:]


def message(report):
    """The one line saying why a test failed, errored or skipped."""
    lr = report.longrepr
    if lr is None:
        return ""
    if isinstance(lr, tuple) and len(lr) == 3:  # a skip: (file, line, reason)
        return str(lr[2])
    crash = getattr(lr, "reprcrash", None)
    if crash is not None:
        text = crash.message
    else:
        text = str(lr).strip().splitlines()[-1] if str(lr).strip() else ""
    text = " ".join(text.split())
    return text[:400]


class Gate:
    def __init__(self, deselect):
        self.deselect = deselect
        self.deselected = {}
        self.outcomes = {}  # nodeid -> [outcome, message]
        self.durations = {}
        self.collect_errors = {}

    def matches(self, nodeid, prefix):
        return nodeid == prefix or (nodeid.startswith(prefix) and nodeid[len(prefix):len(prefix) + 1] in (":", "["))

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config, items):
        keep, drop = [], []
        for item in items:
            why = next((c for p, c in self.deselect if self.matches(item.nodeid, p)), None)
            if why is None:
                keep.append(item)
            else:
                drop.append(item)
                self.deselected[why] = self.deselected.get(why, 0) + 1
        if drop:
            config.hook.pytest_deselected(items=drop)
            items[:] = keep

    def pytest_collectreport(self, report):
        if report.failed:
            self.collect_errors[report.nodeid] = message(report)
        elif report.skipped:  # a whole module skipped (importorskip, a module-level skip)
            self.set(report.nodeid, "skipped", message(report))

    def set(self, nodeid, outcome, why):
        # The worst outcome of a test's phases wins: error, failed, xpassed, then
        # skipped, xfailed, passed.
        rank = {"passed": 0, "xfailed": 1, "skipped": 2, "xpassed": 3, "failed": 4, "error": 5}
        old = self.outcomes.get(nodeid)
        if old is None or rank[outcome] > rank[old[0]]:
            self.outcomes[nodeid] = [outcome, why]

    def pytest_runtest_logreport(self, report):
        xfail = hasattr(report, "wasxfail")
        if report.when == "call":
            self.durations[report.nodeid] = report.duration
            if report.passed:
                self.set(report.nodeid, "xpassed" if xfail else "passed", "")
            elif report.failed:
                self.set(report.nodeid, "failed", message(report))
            else:
                self.set(report.nodeid, "xfailed" if xfail else "skipped",
                         report.wasxfail if xfail else message(report))
        elif report.failed:
            self.set(report.nodeid, "error", "%s: %s" % (report.when, message(report)))
        elif report.skipped:
            self.set(report.nodeid, "xfailed" if xfail else "skipped",
                     report.wasxfail if xfail else message(report))
        elif report.when == "setup":
            self.set(report.nodeid, "passed", "")


gate = Gate(spec.get("deselect", []))
cpu0, start = os.times(), time.monotonic()
status = pytest.main(args, plugins=[gate])
cpu1 = os.times()
files = {}
for k, v in gate.durations.items():
    f = k.split("::")[0]
    files[f] = files.get(f, 0) + v
slowest = sorted(gate.durations.items(), key=lambda kv: -kv[1])[:15]
with open("/ws/native-gate.json", "w") as f:
    json.dump({
        "status": int(status),
        "wall_s": round(time.monotonic() - start, 1),
        "cpu_s": round((cpu1.user - cpu0.user) + (cpu1.system - cpu0.system), 1),
        "outcomes": gate.outcomes,
        "collect_errors": gate.collect_errors,
        "deselected": gate.deselected,
        "slowest": [[k, round(v, 2)] for k, v in slowest],
        "files": {k: round(v, 1) for k, v in sorted(files.items())},
    }, f)
print("NATIVE-GATE done", int(status))
