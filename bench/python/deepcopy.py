# copy.deepcopy of a nested document (dicts, lists, tuples, strings, floats) and of
# a list of small instances.
import copy

DOC = {
    "rows": [{"id": i, "name": "row%d" % i, "tags": ["a", "b", "c"], "score": i * 0.5,
              "span": (i, i + 1)} for i in range(60)],
    "meta": {"title": "report", "owners": ["x", "y"], "limits": {"cpu": 1.5, "mem": 512}},
}


class Point:
    def __init__(self, x, y):
        self.x, self.y = x, y


POINTS = [Point(i, -i) for i in range(120)]


def bench():
    for _ in range(25):
        copy.deepcopy(DOC)
        copy.deepcopy(POINTS)
