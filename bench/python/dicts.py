# Word counting with dict, set and collections.Counter.
import collections

TEXT = ("the quick brown fox jumps over the lazy dog and the dog sleeps while a fox runs " * 200).split()


def bench():
    for _ in range(10):
        counts = {}
        for w in TEXT:
            counts[w] = counts.get(w, 0) + 1
        collections.Counter(TEXT).most_common(5)
        seen = set()
        for w in TEXT:
            seen.add(w[::-1])
        {w: len(w) for w in TEXT}
