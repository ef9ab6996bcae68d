# json.dumps of a document of records, compact and indented.
import json

DOC = {"items": [{"id": i, "name": "item %d" % i, "price": i * 1.25, "tags": ["a", "b"],
                  "nested": {"ok": True, "none": None}} for i in range(500)]}


def bench():
    for _ in range(10):
        json.dumps(DOC)
        json.dumps(DOC, indent=2, sort_keys=True)
