# list.sort and sorted of numbers, strings and tuples, with and without a key.
import random

RNG = random.Random(7)
NUMS = [RNG.random() for _ in range(20000)]
STRS = ["%08x" % RNG.getrandbits(32) for _ in range(10000)]
TUPLES = [(RNG.randrange(100), s) for s in STRS]


def bench():
    for _ in range(3):
        sorted(NUMS)
        sorted(STRS)
        sorted(TUPLES)
        sorted(STRS, key=str.lower, reverse=True)
