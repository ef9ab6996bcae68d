# Runs one module of CPython's own test suite (Lib/test, in /ws/test) with unittest
# and prints its outcome as one line of JSON on stdout: the number of tests run, the
# ids of those that failed or raised (with the last line of their traceback), those
# skipped with their reasons. TestCPythonTestSuite runs it, once per module, in a
# sandboxed run.
import io
import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, "/ws")
name = sys.argv[1]
# Modules run side by side in one workspace, and every run has pid 42 (WASI has no
# processes): each gets a directory of its own for the files its tests make.
own = "/ws/tmp/" + name
os.makedirs(own)
os.chdir(own)
tempfile.tempdir = own


def last_line(text):
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


out = {"module": name, "run": 0, "failures": [], "errors": [], "skipped": [], "load_error": ""}
try:
    from test import support
    support.verbose = 0
    suite = unittest.TestLoader().loadTestsFromName("test." + name)
except BaseException as e:  # the module does not load (SkipTest included)
    if isinstance(e, unittest.SkipTest):
        out["skipped"].append([name, str(e)[:300]])
    else:
        out["load_error"] = "%s: %s" % (type(e).__name__, str(e)[:300])
else:
    stream = io.StringIO()
    result = unittest.TextTestRunner(stream=stream, verbosity=0).run(suite)
    out["run"] = result.testsRun
    out["failures"] = [[t.id(), last_line(tb)] for t, tb in result.failures]
    out["errors"] = [[t.id(), last_line(tb)] for t, tb in result.errors]
    out["skipped"] = [[t.id(), str(r)[:300]] for t, r in result.skipped]
    out["unexpected_successes"] = [t.id() for t in result.unexpectedSuccesses]
sys.stdout.flush()
sys.__stdout__.write("\nSTDLIB-GATE " + json.dumps(out) + "\n")
