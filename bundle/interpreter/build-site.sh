#!/bin/sh
# Builds site.zip, the site layer, inside the trixie root made by build.sh: the pinned
# Debian packages of site-recipe.sh (in /src-site, checked by build.sh) unpacked;
# their libraries as site-packages, byte-compiled by the root's python3.13 (the
# interpreter's version: the same bytecode) to unchecked-hash .pyc beside their
# sources (kept, so that tracebacks show the lines); the IANA zone data as zoneinfo;
# links made copies; all in one stored zip, sorted, with fixed times and modes.
# Output: /out-site/site.zip, and /out-site/LICENSE.<package>, each package's
# Debian copyright file.
set -eu
umask 022
export LC_ALL=C.UTF-8 TZ=UTC PYTHONHASHSEED=0
: "${SOURCE_DATE_EPOCH:?}"
X=/build-site/debs
L=/build-site/layer
SP=$L/python3.13/site-packages
rm -rf /build-site /out-site
mkdir -p "$X" "$SP" "$L/zoneinfo" /out-site

for deb in /src-site/*.deb; do
  dpkg-deb -x "$deb" "$X"
  pkg=$(dpkg-deb -f "$deb" Package)
  cp "$X/usr/share/doc/$pkg/copyright" "/out-site/LICENSE.$pkg"
done

# The libraries, links followed: babel's locale data is a link into /usr/share.
cp -rL "$X/usr/lib/python3/dist-packages/." "$SP/"
# The zone data (tzdata-legacy's backward names, US/Eastern and the like, included),
# links made copies; "localtime" (a link to the host's /etc/localtime) is left out (the
# guest's local time is UTC), and so are the right/ and posix/ trees (the zones again,
# with and without leap seconds), which zoneinfo does not list.
( cd "$X/usr/share/zoneinfo" && find . \( -path ./right -o -path ./posix \) -prune -o ! -name localtime \( -type f -o -type l \) -print | while read -r f; do
    mkdir -p "$L/zoneinfo/$(dirname "$f")"; cp -L "$f" "$L/zoneinfo/$f"; done )

# What WASI lacks, made optional where a library assumed it: xlrd imports mmap (which
# CPython does not build for WASI) unconditionally; without it, it reads the file.
python3.13 - "$SP" <<'PY'
import sys
path = sys.argv[1] + "/xlrd/book.py"
src = open(path).read()
for old, new in [("\nimport mmap\n", "\ntry:\n    import mmap\nexcept ImportError:  # WASI has no mmap\n    mmap = None\n"),
                 ("if self.use_mmap:", "if self.use_mmap and mmap is not None:")]:
    assert src.count(old) == 1, old
    src = src.replace(old, new)
open(path, "w").write(src)
PY

# Code objects name the files where the guest sees them.
python3.13 -E -m compileall -q -j1 --invalidation-mode unchecked-hash -s "$L" -p /usr/local/lib "$SP" >/dev/null
chmod -R u=rwX,go=rX "$L"
find "$L" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
( cd "$L" && find . -type f | LC_ALL=C sort | zip -q -X -0 -D /out-site/site.zip -@ )
sha256sum /out-site/site.zip
