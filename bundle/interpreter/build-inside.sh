#!/bin/sh
# Builds python.wasm and python313.zip inside the debootstrapped trixie root made by
# build.sh. Inputs: the pinned source tarballs in /src (checked by build.sh), the
# compilers from Debian's packages, /usr/local/bin/wasirun (the host runner), and
# /sandcell.c and /reactor.mk (the reactor's entry points and its link).
# Output: /out/python.wasm, /out/python313.zip, /out/BUILDINFO.
set -eu
# File modes end up in the zip, and hash seeds in frozen code: fix both.
umask 022
export LC_ALL=C.UTF-8 TZ=UTC PYTHONHASHSEED=0
: "${SOURCE_DATE_EPOCH:?}"
export SOURCE_DATE_EPOCH
JOBS=$(nproc)
SDK=/opt/wasi-sdk
SYSROOT=$SDK/share/wasi-sysroot
B=/build
rm -rf "$B" /out "$SDK"
mkdir -p "$B" /out "$SDK/bin" "$SYSROOT/include" "$SYSROOT/lib"

# --- A WASI SDK made of wrappers around Debian's clang-19 -------------------------
# A dedicated sysroot holding only wasi-libc keeps the host's glibc headers out.
# --target=wasm32-wasi (not -wasip1) is what finds Debian's compiler-rt builtins.
cp -a /usr/include/wasm32-wasi "$SYSROOT/include/wasm32-wasi"
cp -a /usr/lib/wasm32-wasi "$SYSROOT/lib/wasm32-wasi"
for tool in clang clang++ clang-cpp; do
  real=$tool-19
  [ "$tool" = clang-cpp ] && real=clang-cpp-19
  cat >"$SDK/bin/$tool" <<EOF
#!/bin/sh
exec /usr/bin/$real --target=wasm32-wasi --sysroot=$SYSROOT "\$@"
EOF
  chmod +x "$SDK/bin/$tool"
done
ln -s /usr/bin/llvm-ar-19 "$SDK/bin/llvm-ar"
ln -s /usr/bin/llvm-ranlib-19 "$SDK/bin/ranlib"
ln -s /usr/bin/llvm-ranlib-19 "$SDK/bin/llvm-ranlib"
ln -s /usr/bin/wasm-ld-19 "$SDK/bin/wasm-ld"
export PATH="$SDK/bin:$PATH"

WCC="$SDK/bin/clang"
WCFLAGS="-O2 -DNDEBUG -ffile-prefix-map=$B=."
PC="$SYSROOT/lib/pkgconfig"
mkdir -p "$PC"

# --- Static libraries the stdlib modules need, from Debian's source tarballs -------
cd "$B"
tar -xzf /src/zlib_*.orig.tar.gz
cd zlib-*/
CC="$WCC" CFLAGS="$WCFLAGS" AR=llvm-ar RANLIB=llvm-ranlib CHOST=wasm32 \
  ./configure --static --prefix="$SYSROOT" >/dev/null
make -j"$JOBS" libz.a >/dev/null
make install-libs install-headers install-pkgconfig 2>/dev/null || {
  cp libz.a "$SYSROOT/lib/"; cp zlib.h zconf.h "$SYSROOT/include/"; cp zlib.pc "$PC/"; }

cd "$B"
tar -xzf /src/bzip2_*.orig.tar.gz
cd bzip2-*/
make -j"$JOBS" libbz2.a CC="$WCC" AR=llvm-ar RANLIB=llvm-ranlib CFLAGS="$WCFLAGS -D_FILE_OFFSET_BITS=64" >/dev/null
cp libbz2.a "$SYSROOT/lib/"
cp bzlib.h "$SYSROOT/include/"
cat >"$PC/bzip2.pc" <<EOF
prefix=$SYSROOT
Name: bzip2
Description: bzip2 compression library
Version: 1.0.8
Libs: -L\${prefix}/lib -lbz2
Cflags: -I\${prefix}/include
EOF

cd "$B"
tar -xJf /src/xz-utils_*.orig.tar.xz
cd xz-*/
CC="$WCC" CFLAGS="$WCFLAGS" AR=llvm-ar RANLIB=llvm-ranlib \
  ./configure --host=wasm32-wasi --prefix="$SYSROOT" --disable-shared --enable-static \
  --disable-threads --disable-xz --disable-xzdec --disable-lzmadec --disable-lzmainfo \
  --disable-scripts --disable-doc --disable-nls >/dev/null
make -j"$JOBS" -C src/liblzma >/dev/null
make -C src/liblzma install >/dev/null

cd "$B"
tar -xJf /src/sqlite3_*.orig.tar.xz
cd sqlite*/
# SQLITE_DISABLE_DIRSYNC: WASI cannot fsync a directory, which SQLite asks for after
# deleting a transaction's super-journal (a commit across attached databases), and
# would report as an I/O error of a commit that landed.
CC="$WCC" CFLAGS="$WCFLAGS -DSQLITE_OMIT_LOAD_EXTENSION -DSQLITE_THREADSAFE=0 -DSQLITE_DEFAULT_MEMSTATUS=0 -DSQLITE_DISABLE_DIRSYNC" \
  AR=llvm-ar RANLIB=llvm-ranlib \
  ./configure --host=wasm32-wasi --prefix="$SYSROOT" --disable-shared --enable-static \
  --disable-threadsafe --disable-load-extension --disable-readline --disable-tcl \
  --disable-math >/dev/null
make -j"$JOBS" sqlite3.h libsqlite3.la sqlite3.pc >/dev/null
cp .libs/libsqlite3.a "$SYSROOT/lib/"
cp sqlite3.h src/sqlite3ext.h "$SYSROOT/include/"
cp sqlite3.pc "$PC/"

# --- CPython: a native build Python, then the wasm32-wasi host build ----------------
cd "$B"
tar -xJf /src/python3.13_*.orig.tar.xz
cd Python-*/
# Freeze the start-up modules and the common ones into python.wasm: importing them
# then reads no file. A frozen package is frozen with all its submodules, or imports
# of the rest (from the zip) break. Tools/build/freeze_modules.py regenerates the
# lists in Makefile.pre.in and Python/frozen.c from FROZEN.
python3 - <<'PY'
import re
path = "Tools/build/freeze_modules.py"
src = open(path).read()
extra = """    ('sandcell - start-up and common modules', [
        '<encodings.*>', '<collections.*>', '<json.*>', '<re.*>', '<sqlite3.*>',
        '<pathlib.*>', '<zipfile.**.*>',
        'typing', 'dataclasses', 'datetime', 'decimal', 'enum', 'functools', 'operator',
        'keyword', 'reprlib', 'heapq', 'bisect', 'random', 'statistics', 'fractions',
        'numbers', 'string', 'textwrap', 'copy', 'copyreg', 'types', 'weakref',
        '_weakrefset', 'contextlib', 'warnings', 'traceback', 'linecache', 'tokenize',
        'token', 'csv', 'struct', 'base64', 'hashlib', 'fnmatch', 'glob', 'shutil',
        'tempfile', 'gzip', 'bz2', 'lzma', '_compression', 'locale', 'ast', 'inspect',
        'dis', 'opcode', '_opcode_metadata', 'pprint', 'calendar', 'argparse', 'gettext',
        'signal', 'selectors', 'threading', 'queue', 'difflib', 'hmac', 'secrets',
        'uuid', '_strptime',
        ]),
"""
anchor = "    ('stdlib - startup, with site', ["
assert anchor in src
src = src.replace(anchor, extra + anchor, 1)
open(path, "w").write(src)
PY
python3 Tools/build/freeze_modules.py >/dev/null
# logging in 3.13.5 guards Logger.handle against recursion with a threading.local,
# which a CPython without threads (WASI) makes of pure Python: every logging call,
# even one its level drops, paid for it (a silent logger.debug 18x native). Debian's
# python3.13 3.13.5-2 ships the file without that guard: so does this build, the file
# byte for byte as Debian ships it.
python3 - <<'PY'
path = "Lib/logging/__init__.py"
src = open(path).read()
edits = [
    ("    _tls = threading.local()\n\n", ""),
    ("        if self._is_disabled():\n            return\n\n"
     "        self._tls.in_progress = True\n        try:\n"
     "            maybe_record = self.filter(record)\n            if not maybe_record:\n                return\n"
     "            if isinstance(maybe_record, LogRecord):\n                record = maybe_record\n"
     "            self.callHandlers(record)\n        finally:\n            self._tls.in_progress = False\n",
     "        if self.disabled:\n            return\n"
     "        maybe_record = self.filter(record)\n        if not maybe_record:\n            return\n"
     "        if isinstance(maybe_record, LogRecord):\n            record = maybe_record\n"
     "        self.callHandlers(record)\n"),
    ("        if self._is_disabled():\n", "        if self.disabled:\n"),
    ("\n    def _is_disabled(self):\n        # We need to use getattr as it will only be set the first time a log\n"
     "        # message is recorded on any given thread\n"
     "        return self.disabled or getattr(self._tls, 'in_progress', False)\n", ""),
]
for old, new in edits:
    assert src.count(old) == 1, old
    src = src.replace(old, new)
open(path, "w").write(src)
PY
export WASI_SDK_PATH="$SDK"
RUNNER="/usr/local/bin/wasirun --dir {HOST_DIR}::{GUEST_DIR} --env {ENV_VAR_NAME}={ENV_VAR_VALUE}"
python3 Tools/wasm/wasi.py configure-build-python -- --quiet >/dev/null
python3 Tools/wasm/wasi.py make-build-python >/dev/null
OPT="-DNDEBUG -O3" LDFLAGS="-Wl,--strip-debug" \
  python3 Tools/wasm/wasi.py configure-host --host-runner "$RUNNER" -- --quiet \
  --disable-test-modules >/dev/null
python3 Tools/wasm/wasi.py make-host >/dev/null
HOST=cross-build/wasm32-wasip1
# python.wasm is the same objects linked as a WASI reactor around sandcell.c, whose
# exports the product calls to make its snapshot and to run programs.
make -C "$HOST" -f Makefile -f /reactor.mk SANDCELL_C=/sandcell.c python-reactor.wasm >/dev/null
cp "$HOST/python-reactor.wasm" /out/python.wasm

# --- The standard library as one stored zip, with unchecked-hash .pyc ---------------
LIB=$B/stdlib
rm -rf "$LIB"
mkdir -p "$LIB"
( cd Lib && find . -name test -prune -o -name tests -prune -o -name idlelib -prune \
    -o -name tkinter -prune -o -name turtledemo -prune -o -name ensurepip -prune \
    -o -name '*.py' -print | while read -r f; do
      mkdir -p "$LIB/$(dirname "$f")"; cp "$f" "$LIB/$f"; done )
cp "$HOST"/build/lib.wasi-wasm32-3.13/_sysconfigdata_*.py "$LIB/"
BUILDPY=$(pwd)/cross-build/build/python
# Code objects name the files as an installed CPython would (/usr/local/lib/python3.13).
"$BUILDPY" -E -m compileall -q -j1 --invalidation-mode unchecked-hash \
  -d /usr/local/lib/python3.13 -b "$LIB" >/dev/null
find "$LIB" -name '*.py' -delete
find "$LIB" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
( cd "$LIB" && find . -type f | LC_ALL=C sort | zip -q -X -0 -D /out/python313.zip -@ )

{
  echo "interpreter: CPython $(basename "$(pwd)" | cut -d- -f2) for wasm32-wasip1"
  echo "cflags: -DNDEBUG -O3"
  echo "source_date_epoch: $SOURCE_DATE_EPOCH"
  echo "packages:"
  dpkg-query -W -f '  ${Package}=${Version}\n'
} >/out/BUILDINFO
sha256sum /out/python.wasm /out/python313.zip
