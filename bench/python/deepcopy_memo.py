# copy.deepcopy of a list whose items share a few objects: the memo dict is consulted
# for almost every item.
import copy

SHARED = [list(range(8)) for _ in range(16)]
DATA = [SHARED[i % 16] for i in range(4000)]


def bench():
    for _ in range(10):
        copy.deepcopy(DATA)
