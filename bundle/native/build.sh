#!/bin/sh
# Builds the native backend's root file system reproducibly from the pinned Debian
# packages of recipe.sh, into OUTDIR:
#   OUTDIR/rootfs    the root: the packages' files (no maintainer script ever runs),
#                    byte-compiled, with matplotlib's font list, normalised
#   OUTDIR/MANIFEST  one line per entry of the root, sorted by path (bytewise):
#                    path, type (d f l), mode, size, SHA-256 (f) or target (l) or "-"
#   OUTDIR/PACKAGES  the packages used: name, version, SHA-256 of the .deb
#
#   build.sh OUTDIR           reuse the cached root (keyed by recipe.sh and build.sh)
#   build.sh OUTDIR --fresh   build it again in a new directory, nothing reused but
#                             the downloaded packages (checked by hash): verification
#
# Needs root (chroot, file owners), curl, dpkg-deb. The cache lives in
# $SANDCELL_BUILD_CACHE (default /var/cache/sandcell-build), outside the repository:
# native-debs/ (the packages) and native-<key>/ (the built root).
set -eu
umask 022
export LC_ALL=C
here=$(cd "$(dirname "$0")" && pwd)
usage() { echo "usage: build.sh OUTDIR [--fresh]" >&2; exit 2; }
if [ $# -lt 1 ] || [ $# -gt 2 ]; then usage; fi
outdir=$(realpath -m "$1")
fresh=${2:-}
case "$fresh" in '' | --fresh) ;; *) usage ;; esac
. "$here/recipe.sh"
[ "$(id -u)" = 0 ] || { echo "native: needs root (chroot, files owned by root)" >&2; exit 1; }
for tool in curl dpkg-deb chroot sha256sum; do
  command -v "$tool" >/dev/null || { echo "native: needs $tool" >&2; exit 1; }
done
chroot=$(command -v chroot)
cache=$(realpath -m "${SANDCELL_BUILD_CACHE:-/var/cache/sandcell-build}")
debs=$cache/native-debs
mkdir -p "$debs"
# One build at a time per cache (two checkouts building at once would write the same
# files): a second waits here, then finds the first's results.
exec 9>"$cache/native.lock"
flock 9
tab=$(printf '\t')

# The packages, fetched once into the cache from the Debian archive, always checked
# against the recipe's SHA-256.
echo "$NATIVE_DEBS" | while read -r name version path sum; do
  [ -n "$name" ] || continue
  f=$debs/$(basename "$path")
  if ! echo "$sum  $f" | sha256sum -c --status 2>/dev/null; then
    curl -fsS -o "$f.part" "$MIRROR/$path" || { echo "native: cannot fetch $MIRROR/$path" >&2; exit 1; }
    echo "$sum  $f.part" | sha256sum -c --status ||
      { echo "native: $MIRROR/$path does not match the recipe's SHA-256" >&2; rm -f "$f.part"; exit 1; }
    mv "$f.part" "$f"
  fi
done
download=$(echo "$NATIVE_DEBS" | awk 'NF { print $3 }' | while read -r path; do
  printf '%s\0' "$debs/$(basename "$path")"; done | du -cb --files0-from=- | tail -n 1 | cut -f1)

# manifest ROOT: the MANIFEST of ROOT on stdout; fails on any entry that is not a
# directory, a regular file or a symbolic link, and on names a line cannot hold.
manifest() (
  cd "$1"
  odd=$(find . ! -type d ! -type f ! -type l -print | head -n 5)
  [ -z "$odd" ] || { echo "native: not a file, directory or link: $odd" >&2; exit 1; }
  odd=$(find . \( -name "$(printf '*[\t\n\\\\]*')" -o -lname "$(printf '*[\t\n]*')" \) -print | head -n 5)
  [ -z "$odd" ] || { echo "native: a name or link holds a tab, newline or backslash: $odd" >&2; exit 1; }
  find . -type f -print0 | xargs -0 -r sha256sum >"$2"
  find . -printf '%p\t%y\t%m\t%s\t%l\n' |
    awk -F'\t' -v OFS='\t' -v sums="$2" '
      BEGIN { while ((getline line < sums) > 0) sha[substr(line, 67)] = substr(line, 1, 64) }
      {
        mode = substr("0000" $3, length($3) + 1)
        if ($2 == "f") print $1, "f", mode, $4, sha[$1]
        else if ($2 == "l") print $1, "l", mode, 0, $5
        else print $1, "d", mode, 0, "-"
      }' |
    sort -t "$tab" -k1,1
  rm -f "$2"
)

# build DIR: the root in DIR/rootfs, with DIR/MANIFEST and DIR/PACKAGES.
build() {
  r=$1/rootfs
  mkdir -p "$r"
  # Every package's files, in the order of their names; nothing is configured.
  echo "$NATIVE_DEBS" | awk 'NF' | sort -k1,1 | while read -r name version path sum; do
    f=$debs/$(basename "$path")
    [ "$(dpkg-deb -f "$f" Package Version | tr '\n' ' ')" = "Package: $name Version: $version " ] ||
      { echo "native: $f is not $name $version" >&2; exit 1; }
    dpkg-deb -x "$f" "$r"
    echo "$name $version $sum" >>"$1/PACKAGES"
  done

  # Merged /usr, as trixie's base-files would make it (no package here ships files
  # outside /usr: the links are the only way in).
  for d in bin lib lib64 sbin; do
    if [ -e "$r/$d" ] || [ -L "$r/$d" ]; then echo "native: a package ships /$d outside /usr" >&2; exit 1; fi
    mkdir -p "$r/usr/$d"
    ln -s "usr/$d" "$r/$d"
  done
  # What the postinsts' update-alternatives would have linked: the reference BLAS
  # and LAPACK (libblas3, liblapack3), where numpy's and scipy's modules look.
  multiarch=$r/usr/lib/x86_64-linux-gnu
  for lib in blas/libblas.so.3 lapack/liblapack.so.3; do
    [ -f "$multiarch/$lib" ] || { echo "native: no /usr/lib/x86_64-linux-gnu/$lib" >&2; exit 1; }
    ln -s "$lib" "$multiarch/${lib#*/}"
  done
  # tzdata's postinst with its default answer: the local time is UTC.
  [ -f "$r/usr/share/zoneinfo/Etc/UTC" ] || { echo "native: no /usr/share/zoneinfo/Etc/UTC" >&2; exit 1; }
  ln -s /usr/share/zoneinfo/Etc/UTC "$r/etc/localtime"
  [ "$(readlink "$r/usr/bin/python3")" = python3.13 ] || ln -sfn python3.13 "$r/usr/bin/python3"
  [ -e "$r/lib64/ld-linux-x86-64.so.2" ] || { echo "native: /lib64/ld-linux-x86-64.so.2 does not resolve" >&2; exit 1; }

  # What nothing reads at run time: manual pages, info, lintian overrides and bug
  # report scripts, documentation but each package's copyright file (the licences).
  rm -rf "$r/usr/share/man" "$r/usr/share/info" "$r/usr/share/lintian" "$r/usr/share/bug" \
    "$r/usr/share/doc-base"
  for d in "$r"/usr/share/doc/*; do
    if [ -d "$d" ] && [ ! -L "$d" ]; then find "$d" -mindepth 1 -maxdepth 1 ! -name copyright -exec rm -rf {} +; fi
  done
  echo "$NATIVE_DEBS" | awk 'NF { print $1 }' | while read -r name; do
    c=$r/usr/share/doc/$name
    if [ -L "$c" ]; then
      case $(readlink "$c") in /*) c=$r$(readlink "$c") ;; *) c=$r/usr/share/doc/$(readlink "$c") ;; esac
    fi
    [ -f "$c/copyright" ] || { echo "native: $name has no copyright file" >&2; exit 1; }
  done

  # run ARGS: python3.13 in the root, as root, with an empty environment but these.
  run() {
    env -i PATH=/usr/bin LC_ALL=C.UTF-8 TZ=UTC PYTHONHASHSEED=0 HOME=/nonexistent \
      MPLCONFIGDIR=/usr/share/sandcell/matplotlib "$chroot" "$r" /usr/bin/python3.13 -s -B "$@"
  }
  # The standard library and every library byte-compiled beside its sources, so that
  # nothing needs to write __pycache__ in the read-only root. Unchecked-hash .pyc (the
  # sources' times do not matter); one process (-j1), a fixed hash seed, sorted
  # directory walks: the same bytes each time. -B: the modules compileall itself
  # imports are compiled by it, not cached on import first.
  run -m compileall -q -f -j1 --invalidation-mode unchecked-hash /usr/lib/python3.13 /usr/lib/python3/dist-packages
  # matplotlib's font list (fontlist-v390.json), made once here: each run copies it
  # into its own MPLCONFIGDIR instead of scanning the fonts again. Its order follows
  # the hash seed, fixed here; it holds no time.
  mkdir -p "$r/usr/share/sandcell/matplotlib"
  run -c 'import matplotlib; matplotlib.use("Agg"); import matplotlib.font_manager'
  ls "$r/usr/share/sandcell/matplotlib"/fontlist-v*.json >/dev/null ||
    { echo "native: matplotlib wrote no font list" >&2; exit 1; }

  # The mount points of the sandbox's layout.
  for d in ws tmp proc dev sandcell; do mkdir -p "$r/$d"; done

  # Owners, modes and times normalised: root:root, directories 0755, files 0755 when
  # executable by anyone and 0644 otherwise (no setuid, setgid or sticky bit but
  # /tmp's), every time SOURCE_DATE_EPOCH.
  chown -R -h 0:0 "$r"
  find "$r" -type d -exec chmod 00755 {} +
  find "$r" -type f -perm /0111 -exec chmod 0755 {} +
  find "$r" -type f ! -perm /0111 -exec chmod 0644 {} +
  chmod 1777 "$r/tmp"
  find "$r" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
  manifest "$r" "$1/sums" >"$1/MANIFEST"
}

key=$(cat "$here/recipe.sh" "$here/build.sh" | sha256sum | cut -c1-16)
cached=$cache/native-$key
work=
cleanup() { if [ -n "$work" ] && [ -d "$work" ]; then rm -rf --one-file-system "$work"; fi; }
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

if [ -z "$fresh" ] && [ -f "$cached/MANIFEST" ] && cmp -s "$cached/MANIFEST" "$outdir/MANIFEST" 2>/dev/null; then
  # Already there: make bundle checks every file of the copy it installs.
  echo "native: $outdir is the cached root $key"
  exit 0
fi
if [ -z "$fresh" ] && [ -f "$cached/MANIFEST" ]; then
  echo "native: cached root $key"
  src=$cached
else
  work=$(mktemp -d "$cache/native-build.XXXXXX")
  echo "native: building the root in $work"
  build "$work"
  if [ -n "$fresh" ]; then
    src=$work
  else
    # Into the cache by one rename: a half-built root is never reused.
    rm -rf --one-file-system "$cached"
    mv "$work" "$cached"
    work=
    src=$cached
  fi
fi

rm -rf --one-file-system "$outdir"
mkdir -p "$(dirname "$outdir")"
if [ "$src" = "$work" ]; then
  mv "$work" "$outdir"
  work=
else
  cp -a "$src" "$outdir"
fi
# What OUTDIR holds is checked against what was built: the same entries, and every
# time SOURCE_DATE_EPOCH.
manifest "$outdir/rootfs" "$outdir/sums" | cmp -s - "$outdir/MANIFEST" ||
  { echo "native: $outdir/rootfs differs from its MANIFEST" >&2; exit 1; }
if [ -n "$(find "$outdir/rootfs" \( -newermt "@$SOURCE_DATE_EPOCH" -o ! -newermt "@$((SOURCE_DATE_EPOCH - 1))" \) -print -quit)" ]; then
  echo "native: $outdir/rootfs has a time other than SOURCE_DATE_EPOCH" >&2
  exit 1
fi
sha256sum "$outdir/MANIFEST"
echo "native: $(wc -l <"$outdir/PACKAGES") packages ($((download / 1048576)) MiB downloaded), root $(du -sh --apparent-size "$outdir/rootfs" | cut -f1) in $(wc -l <"$outdir/MANIFEST") entries"
