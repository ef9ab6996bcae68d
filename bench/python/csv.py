# csv: writing and reading rows through DictWriter and DictReader.
import csv as c
import io

ROWS = [{"id": i, "name": "name, %d" % i, "price": i * 0.5, "note": 'say "hi"'} for i in range(2000)]


def bench():
    buf = io.StringIO()
    w = c.DictWriter(buf, fieldnames=["id", "name", "price", "note"])
    w.writeheader()
    w.writerows(ROWS)
    buf.seek(0)
    sum(1 for _ in c.DictReader(buf))
