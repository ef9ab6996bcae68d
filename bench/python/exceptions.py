# Raising and catching exceptions, with try/finally and context managers.
import contextlib


class Failure(Exception):
    pass


def fail(i):
    if i % 2:
        raise Failure(i)
    return i


def bench():
    n = 0
    for i in range(30000):
        try:
            n += fail(i)
        except Failure:
            n -= 1
        finally:
            n += 1
    for i in range(3000):
        with contextlib.suppress(KeyError):
            {}[i]
