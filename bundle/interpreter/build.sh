#!/bin/sh
# Builds the interpreter (python.wasm, python313.zip) and its site layer (site.zip)
# reproducibly from the pinned recipes (recipe.sh, site-recipe.sh) in a debootstrapped
# Debian trixie root, and copies the outputs to OUTDIR.
#
#   build.sh WASIRUN OUTDIR          reuse the cached root and cached outputs
#   build.sh WASIRUN OUTDIR --fresh  build in a new root, nothing reused (verification)
#
# WASIRUN is the host runner binary (bundle/interpreter/wasirun, linked statically).
# Needs root, debootstrap, curl and xz-utils. The cache lives in
# $SANDCELL_BUILD_CACHE (default /var/cache/sandcell-build), outside the repository.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
wasirun=$1
outdir=$2
fresh=${3:-}
. "$here/recipe.sh"
. "$here/site-recipe.sh"
cache=${SANDCELL_BUILD_CACHE:-/var/cache/sandcell-build}
mkdir -p "$cache/src"
# One build at a time per cache (two checkouts building at once would debootstrap
# into the same root): a second waits here, then finds the first's results.
exec 9>"$cache/interpreter.lock"
flock 9

# fetch URL-PREFIX LIST: each "path sha256" of LIST, fetched once from the Debian
# archive into the cache, always checked against the recipe.
fetch() {
  echo "$2" | while read -r path sum; do
    [ -n "$path" ] || continue
    f="$cache/src/$(basename "$path")"
    if ! echo "$sum  $f" | sha256sum -c --status 2>/dev/null; then
      curl -fsS -o "$f.part" "$1/$path" || { echo "interpreter: cannot fetch $1/$path" >&2; exit 1; }
      mv "$f.part" "$f"
    fi
    echo "$sum  $f" | sha256sum -c --quiet || { echo "interpreter: $path does not match the recipe" >&2; exit 1; }
  done
}
fetch "$MIRROR/pool/main" "$SOURCES"
fetch "$MIRROR" "$SITE_DEBS"

# licenses DIR: the licence texts of everything linked into python.wasm, from the
# recipe's source tarballs (the file inside each is the first LICENSE, LICENSE.md or
# COPYING.0BSD at its top level).
licenses() {
  echo "$SOURCES" | while read -r path _; do
    [ -n "$path" ] || continue
    tarball="$cache/src/$(basename "$path")"
    name=$(basename "$path" | cut -d_ -f1)
    member=$(tar -tf "$tarball" | grep -E '^[^/]+/(LICENSE|LICENSE\.md|COPYING\.0BSD)$' | head -n 1)
    tar -xOf "$tarball" "$member" >"$1/LICENSE.$name"
  done
}

rootkey=$(printf '%s\n%s\n%s\n' "$SUITE" "$MIRROR" "$PACKAGES" | sha256sum | cut -c1-16)
key=$(cat "$here/recipe.sh" "$here/build-inside.sh" "$here/sandcell.c" "$here/reactor.mk" | sha256sum | cut -c1-16)
sitekey=$(cat "$here/site-recipe.sh" "$here/build-site.sh" | sha256sum | cut -c1-16)

# finish: OUTDIR gets the interpreter's and the site layer's outputs and the licence
# texts.
finish() {
  rm -rf "$outdir"
  mkdir -p "$outdir"
  cp "$1"/* "$2"/* "$outdir/"
  licenses "$outdir"
  sha256sum "$outdir/python.wasm" "$outdir/python313.zip" "$outdir/site.zip"
}
if [ -z "$fresh" ] && [ -f "$cache/out-$key/python.wasm" ] && [ -f "$cache/site-$sitekey/site.zip" ]; then
  echo "interpreter: cached build $key, site layer $sitekey"
  finish "$cache/out-$key" "$cache/site-$sitekey"
  exit 0
fi

if [ -n "$fresh" ]; then
  root=$(mktemp -d "$cache/fresh-root.XXXXXX")
else
  root=$cache/root-$rootkey
fi

# Unmount what this script mounted; remove a fresh root only once nothing is mounted
# in it, and never beyond its own file system.
cleanup() {
  for m in "$root/proc" "$root/dev"; do
    if mountpoint -q "$m"; then umount "$m" || umount -l "$m" || true; fi
  done
  if [ -n "$fresh" ] && ! mountpoint -q "$root/proc" && ! mountpoint -q "$root/dev"; then
    rm -rf --one-file-system "$root"
  fi
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

if [ ! -f "$root/.ready" ]; then
  echo "interpreter: debootstrap $SUITE into $root"
  if [ -z "$fresh" ]; then rm -rf --one-file-system "$root"; fi
  debootstrap --variant=minbase "$SUITE" "$root" "$MIRROR" >"$cache/debootstrap.log" 2>&1 ||
    { tail -20 "$cache/debootstrap.log"; exit 1; }
  # shellcheck disable=SC2086 # PACKAGES is a list
  chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive \
    sh -c "apt-get update -qq && apt-get install -y -qq --no-install-recommends $(echo $PACKAGES)" \
    >"$cache/apt.log" 2>&1 || { tail -20 "$cache/apt.log"; exit 1; }
  touch "$root/.ready"
fi

log=$cache/build-$(basename "$root").log
mountpoint -q "$root/dev" || mount --bind /dev "$root/dev"
mountpoint -q "$root/proc" || mount -t proc proc "$root/proc"
inside() {
  chroot "$root" /usr/bin/env -i PATH=/usr/bin:/bin HOME=/root SOURCE_DATE_EPOCH="$SOURCE_DATE_EPOCH" \
    sh "$1" >>"$log" 2>&1 || { tail -40 "$log"; exit 1; }
}
: >"$log"

# cached NAME DIR: copies the root's /NAME into the cache as DIR, atomically (a
# half-copied entry would be reused forever); not for a fresh build.
cached() {
  if [ -z "$fresh" ]; then
    rm -rf "$2.tmp"
    cp -r "$root/$1" "$2.tmp"
    mv "$2.tmp" "$2"
  fi
}

if [ -n "$fresh" ] || [ ! -f "$cache/out-$key/python.wasm" ]; then
  mkdir -p "$root/src" "$root/usr/local/bin"
  rm -f "$root"/src/*
  echo "$SOURCES" | while read -r path _; do
    if [ -n "$path" ]; then cp "$cache/src/$(basename "$path")" "$root/src/"; fi
  done
  cp "$wasirun" "$root/usr/local/bin/wasirun"
  cp "$here/build-inside.sh" "$here/sandcell.c" "$here/reactor.mk" "$root/"
  echo "interpreter: building (about 10 minutes on 2 cores; log in $log)"
  inside /build-inside.sh
  cached out "$cache/out-$key"
  interp=$root/out
else
  interp=$cache/out-$key
fi

if [ -n "$fresh" ] || [ ! -f "$cache/site-$sitekey/site.zip" ]; then
  rm -rf "$root/src-site"
  mkdir -p "$root/src-site"
  echo "$SITE_DEBS" | while read -r path _; do
    if [ -n "$path" ]; then cp "$cache/src/$(basename "$path")" "$root/src-site/"; fi
  done
  cp "$here/build-site.sh" "$root/"
  echo "interpreter: building the site layer (log in $log)"
  inside /build-site.sh
  cached out-site "$cache/site-$sitekey"
  site=$root/out-site
else
  site=$cache/site-$sitekey
fi
finish "$interp" "$site"
