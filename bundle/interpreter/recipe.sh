# The interpreter recipe: every input of the build, pinned. build.sh sources this file;
# its hash (with build-inside.sh) keys the cached outputs.

# Build time recorded in the outputs (2025-07-20, the day of the source snapshot).
SOURCE_DATE_EPOCH=1753000000

# The build root: a minimal Debian trixie, with these exact versions of every package
# the build calls. Their dependencies come from the same suite; BUILDINFO lists every
# package of the root as built. When the mirror drops one of these versions (a point
# release), the build stops at apt-get rather than drifting: update the pin and check
# `make interpreter-verify`.
SUITE=trixie
MIRROR=http://deb.debian.org/debian
PACKAGES="clang-19=1:19.1.7-3+b1 lld-19=1:19.1.7-3+b1 llvm-19=1:19.1.7-3+b1
wasi-libc=0.0~git20241209.574b88d-2 libclang-rt-19-dev-wasm32=1:19.1.7-3
gcc=4:14.2.0-1 gcc-14=14.2.0-19 make=4.4.1-2 pkg-config=1.8.1-4 git=1:2.47.3-0+deb13u1
python3=3.13.5-1 python3.13=3.13.5-2+deb13u5 tcl=8.6.16 tcl8.6=8.6.16+dfsg-1
zip=3.0-15+deb13u1 xz-utils=5.8.1-1+deb13u2 ca-certificates=20250419+deb13u1"

# Upstream sources as Debian ships them (orig tarballs from the Debian archive):
# path under $MIRROR/pool/main, then SHA-256.
SOURCES="
p/python3.13/python3.13_3.13.5.orig.tar.xz 93e583f243454e6e9e4588ca2c2662206ad961659863277afcdb96801647d640
z/zlib/zlib_1.3.dfsg+really1.3.1.orig.tar.gz 60dd315c07f616887caa029408308a018ace66e3d142726a97db164b3b8f69fb
s/sqlite3/sqlite3_3.46.1.orig.tar.xz d0cdd2ece271b29e7ce18095745d892517ee26d0f270065b3a25c2e9eb11639c
b/bzip2/bzip2_1.0.8.orig.tar.gz ab5a03176ee106d3f0fa90e381da478ddae405918153cca248e682cd0c4a2269
x/xz-utils/xz-utils_5.8.1.orig.tar.xz 0b54f79df85912504de0b14aec7971e3f964491af1812d83447005807513cd9e
"
