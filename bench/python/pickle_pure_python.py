# pickle's pure-Python pickler and unpickler (pickle._Pickler, pickle._Unpickler)
# on a list of records.
import io
import pickle

DATA = [{"id": i, "name": "item%d" % i, "tags": ["red", "blue"], "price": i * 1.25,
         "when": (2024, 1 + i % 12, 1 + i % 28), "ok": i % 3 == 0} for i in range(150)]


def bench():
    for _ in range(4):
        buf = io.BytesIO()
        pickle._Pickler(buf, protocol=4).dump(DATA)
        buf.seek(0)
        pickle._Unpickler(buf).load()
