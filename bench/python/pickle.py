# The C pickler (pickle.dumps, pickle.loads) on a list of records.
import pickle as p

DATA = [{"id": i, "name": "item%d" % i, "tags": ["red", "blue"], "price": i * 1.25,
         "when": (2024, 1 + i % 12, 1 + i % 28), "ok": i % 3 == 0} for i in range(1000)]


def bench():
    for _ in range(30):
        p.loads(p.dumps(DATA, protocol=5))
