# pathlib over a directory of 1,000 files in the workspace: iterdir, suffixes and
# names, glob, stat (the files are made before the timing and removed after it).
import os
import pathlib
import shutil

DIR = pathlib.Path("pathlib-bench")
shutil.rmtree(DIR, ignore_errors=True)
DIR.mkdir()
for i in range(1000):
    (DIR / ("f%04d.%s" % (i, "py" if i % 2 else "txt"))).write_bytes(b"x")


def bench():
    for p in DIR.iterdir():
        p.suffix, p.stem, p.name
    len(list(DIR.glob("*.py")))
    for p in sorted(DIR.glob("f00*")):
        p.stat().st_size


def teardown():
    shutil.rmtree(DIR)
