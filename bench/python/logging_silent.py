# Calls of a logger whose level drops them (the cost of logging that is off).
import logging

LOG = logging.getLogger("bench.silent")
LOG.setLevel(logging.WARNING)
LOG.propagate = False


def bench():
    for i in range(20000):
        LOG.debug("value %d", i)
        LOG.info("value %d", i)
