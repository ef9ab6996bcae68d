# Records formatted by a handler writing to a string (the cost of logging that is on).
import io
import logging

STREAM = io.StringIO()
HANDLER = logging.StreamHandler(STREAM)
HANDLER.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
LOG = logging.getLogger("bench.format")
LOG.addHandler(HANDLER)
LOG.setLevel(logging.INFO)
LOG.propagate = False


def bench():
    for i in range(1500):
        LOG.warning("value %d of %s", i, "run")
    STREAM.seek(0)
    STREAM.truncate()
