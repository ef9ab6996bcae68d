# The interpreter recipe: every input of the build, pinned. build.sh sources this file;
# its hash (with build-inside.sh) keys the cached outputs.

# Build time recorded in the outputs (2025-07-20, the day of the source snapshot).
SOURCE_DATE_EPOCH=1753000000

# The build root: a minimal Debian trixie, with these exact packages.
SUITE=trixie
MIRROR=http://deb.debian.org/debian
PACKAGES="clang-19=1:19.1.7-3+b1 lld-19=1:19.1.7-3+b1 llvm-19=1:19.1.7-3+b1
wasi-libc=0.0~git20241209.574b88d-2 libclang-rt-19-dev-wasm32=1:19.1.7-3
gcc make pkg-config git python3 tcl zip xz-utils ca-certificates"

# Upstream sources as Debian ships them (orig tarballs from the Debian archive):
# path under $MIRROR/pool/main, then SHA-256.
SOURCES="
p/python3.13/python3.13_3.13.5.orig.tar.xz 93e583f243454e6e9e4588ca2c2662206ad961659863277afcdb96801647d640
z/zlib/zlib_1.3.dfsg+really1.3.1.orig.tar.gz 60dd315c07f616887caa029408308a018ace66e3d142726a97db164b3b8f69fb
s/sqlite3/sqlite3_3.46.1.orig.tar.xz d0cdd2ece271b29e7ce18095745d892517ee26d0f270065b3a25c2e9eb11639c
b/bzip2/bzip2_1.0.8.orig.tar.gz ab5a03176ee106d3f0fa90e381da478ddae405918153cca248e682cd0c4a2269
x/xz-utils/xz-utils_5.8.1.orig.tar.xz 0b54f79df85912504de0b14aec7971e3f964491af1812d83447005807513cd9e
"
