#!/bin/sh
# Checks of the built packages that need no booted system (make test-packages):
# the .rpm's scripts, requirements and file list, an install into a scratch rpm
# database (placement, config(noreplace), modes), and the .deb's control data and
# hardened binary (PIE, RELRO, BIND_NOW).
set -eu
deb=$1
rpm=$2
fail() { echo "test-packages: $*" >&2; exit 1; }
has() { printf '%s\n' "$1" | grep -qE "$2" || fail "$3"; }

# rpm: scripts, requirements, files.
scripts=$(rpm -qp --scripts "$rpm")
has "$scripts" 'postinstall scriptlet' "rpm has no %post"
has "$scripts" 'systemd-sysusers sandcell.conf' "rpm %post does not create the user"
has "$scripts" 'preuninstall scriptlet' "rpm has no %preun"
has "$scripts" 'disable --now sandcell.socket sandcell.service' "rpm %preun does not stop the units"
has "$scripts" 'try-restart sandcell.socket sandcell.service' "rpm %postun does not restart on upgrade"
requires=$(rpm -qp --requires "$rpm")
has "$requires" '^libseccomp\.so\.2\(\)\(64bit\)' "rpm does not require libseccomp"
has "$requires" '^systemd' "rpm does not require systemd"
has "$requires" '^glibc >= 2.34' "rpm does not require glibc 2.34"
files=$(rpm -qp -l "$rpm")
for f in /usr/bin/sandcell /usr/lib/sandcell/python.wasm /usr/lib/sandcell/MANIFEST /etc/sandcell/sandcell.toml \
	/usr/lib/systemd/system/sandcell.service /usr/lib/systemd/system/sandcell.socket \
	/usr/lib/sysusers.d/sandcell.conf /usr/lib/tmpfiles.d/sandcell.conf /usr/share/man/man8/sandcell.8.gz \
	/usr/share/doc/sandcell/copyright; do
	has "$files" "^$f\$" "rpm lacks $f"
done
has "$files" '^/usr/lib/sandcell/python-[0-9a-f]+\.cwasm$' "rpm lacks a precompiled module"

# rpm: into a scratch root and database.
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
rpm --root "$root" --initdb
rpm --root "$root" -i --nodeps --noscripts "$rpm"
[ -x "$root/usr/bin/sandcell" ] || fail "scratch install: no /usr/bin/sandcell"
[ "$(rpm --root "$root" -qc sandcell)" = /etc/sandcell/sandcell.toml ] || fail "scratch install: the config is not a config file"
flags=$(rpm --root "$root" -q --qf '[%{FILEFLAGS:fflags} %{FILENAMES}\n]' sandcell | grep ' /etc/sandcell/sandcell.toml$')
case $flags in cn*) ;; *) fail "sandcell.toml is not %config(noreplace): $flags" ;; esac
"$root/usr/bin/sandcell" bundle verify --dir "$root/usr/lib/sandcell" >/dev/null || fail "the packaged bundle does not verify"
"$root/usr/bin/sandcell" config validate "$root/etc/sandcell/sandcell.toml" >/dev/null || fail "the packaged config does not validate"

# deb: control data and the binary's hardening.
dpkg-deb --field "$deb" Depends | grep -q 'libc6 (>= 2.34), libgcc-s1, libseccomp2' || fail "deb dependencies: $(dpkg-deb --field "$deb" Depends)"
dpkg-deb --ctrl-tarfile "$deb" | tar -xO ./conffiles | grep -qx /etc/sandcell/sandcell.toml || fail "deb conffiles lack sandcell.toml"
x=$(mktemp -d)
dpkg-deb -x "$deb" "$x"
readelf -h "$x/usr/bin/sandcell" | grep -q 'DYN (Position-Independent Executable' || fail "sandcell is not PIE"
readelf -l "$x/usr/bin/sandcell" | grep -q GNU_RELRO || fail "sandcell has no RELRO"
readelf -d "$x/usr/bin/sandcell" | grep -q 'BIND_NOW\|FLAGS.*NOW' || fail "sandcell is not BIND_NOW (full RELRO)"
"$x/usr/bin/sandcell" version | grep -q . || fail "sandcell version prints nothing"
rm -rf "$x"
echo "test-packages: ok ($deb, $rpm)"
