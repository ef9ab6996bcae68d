# json.loads of a document of records, with escapes and non-ASCII text.
import json

TEXT = json.dumps({"items": [{"id": i, "name": "item \u00e9\u4e2d %d \"q\"" % i, "price": i * 1.25,
                              "tags": ["a", "b"], "nested": {"ok": True, "none": None}}
                             for i in range(500)]})


def bench():
    for _ in range(25):
        json.loads(TEXT)
