#!/bin/sh
# Builds the interpreter (python.wasm, python313.zip) reproducibly from the pinned
# recipe in a debootstrapped Debian trixie root, and copies the outputs to OUTDIR.
#
#   build.sh WASIRUN OUTDIR          reuse the cached root and cached outputs
#   build.sh WASIRUN OUTDIR --fresh  build in a new root, nothing reused (verification)
#
# WASIRUN is the host runner binary (bundle/interpreter/wasirun). Needs root,
# debootstrap and curl. The cache lives in $SANDCELL_BUILD_CACHE
# (default /var/cache/sandcell-build), outside the repository.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
wasirun=$1
outdir=$2
fresh=${3:-}
. "$here/recipe.sh"
cache=${SANDCELL_BUILD_CACHE:-/var/cache/sandcell-build}
mkdir -p "$cache/src"

rootkey=$(printf '%s\n%s\n%s\n' "$SUITE" "$MIRROR" "$PACKAGES" | sha256sum | cut -c1-16)
key=$(cat "$here/recipe.sh" "$here/build-inside.sh" | sha256sum | cut -c1-16)
# licenses DIR: the licence texts of everything linked into python.wasm, taken from
# the pinned source tarballs.
licenses() {
  s=$cache/src
  tar -xOf "$s"/python3.13_*.orig.tar.xz Python-3.13.5/LICENSE >"$1/LICENSE.python"
  tar -xOf "$s"/zlib_*.orig.tar.gz zlib-1.3.1/LICENSE >"$1/LICENSE.zlib"
  tar -xOf "$s"/sqlite3_*.orig.tar.xz sqlite3-3.46.1/LICENSE.md >"$1/LICENSE.sqlite"
  tar -xOf "$s"/bzip2_*.orig.tar.gz bzip2-1.0.8/LICENSE >"$1/LICENSE.bzip2"
  tar -xOf "$s"/xz-utils_*.orig.tar.xz xz-5.8.1/COPYING.0BSD >"$1/LICENSE.liblzma"
}

if [ -z "$fresh" ] && [ -f "$cache/out-$key/python.wasm" ]; then
  echo "interpreter: cached build $key"
  mkdir -p "$outdir"
  cp "$cache/out-$key"/* "$outdir/"
  licenses "$outdir"
  exit 0
fi

# Sources: fetched once from the Debian archive, always checked against the recipe.
echo "$SOURCES" | while read -r path sum; do
  [ -n "$path" ] || continue
  f="$cache/src/$(basename "$path")"
  if ! echo "$sum  $f" | sha256sum -c --status 2>/dev/null; then
    curl -fsS -o "$f.part" "$MIRROR/pool/main/$path"
    mv "$f.part" "$f"
  fi
  echo "$sum  $f" | sha256sum -c --quiet || { echo "interpreter: $path does not match the recipe" >&2; exit 1; }
done

if [ -n "$fresh" ]; then
  root=$(mktemp -d "$cache/fresh-root.XXXXXX")
else
  root=$cache/root-$rootkey
fi
if [ ! -f "$root/.ready" ]; then
  echo "interpreter: debootstrap $SUITE into $root"
  rm -rf "$root"
  debootstrap --variant=minbase "$SUITE" "$root" "$MIRROR" >"$cache/debootstrap.log" 2>&1 ||
    { tail -20 "$cache/debootstrap.log"; exit 1; }
  # shellcheck disable=SC2086 # PACKAGES is a list
  chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive \
    sh -c "apt-get update -qq && apt-get install -y -qq --no-install-recommends $(echo $PACKAGES)" \
    >"$cache/apt.log" 2>&1 || { tail -20 "$cache/apt.log"; exit 1; }
  touch "$root/.ready"
fi

mkdir -p "$root/src" "$root/usr/local/bin"
rm -f "$root"/src/*
echo "$SOURCES" | while read -r path _; do
  if [ -n "$path" ]; then cp "$cache/src/$(basename "$path")" "$root/src/"; fi
done
cp "$wasirun" "$root/usr/local/bin/wasirun"
cp "$here/build-inside.sh" "$root/build-inside.sh"

mount --bind /dev "$root/dev"
mount -t proc proc "$root/proc"
cleanup() {
  umount "$root/proc" 2>/dev/null || true
  umount "$root/dev" 2>/dev/null || true
  if [ -n "$fresh" ]; then rm -rf "$root"; fi
}
trap cleanup EXIT
echo "interpreter: building (about 10 minutes on 2 cores; log in $cache/build.log)"
chroot "$root" /usr/bin/env -i PATH=/usr/bin:/bin HOME=/root SOURCE_DATE_EPOCH="$SOURCE_DATE_EPOCH" \
  sh /build-inside.sh >"$cache/build.log" 2>&1 || { tail -40 "$cache/build.log"; exit 1; }

if [ -z "$fresh" ]; then
  rm -rf "$cache/out-$key"
  cp -r "$root/out" "$cache/out-$key"
fi
mkdir -p "$outdir"
cp "$root/out"/* "$outdir/"
licenses "$outdir"
sha256sum "$outdir/python.wasm" "$outdir/python313.zip"
