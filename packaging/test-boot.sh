#!/bin/sh
# The .deb end to end under a booted systemd (make test-packages-boot, root): a
# minimal Debian bookworm root (debootstrapped once, cached in
# /var/cache/sandcell-test), booted with systemd-nspawn, no network. Inside, a
# oneshot unit runs packaging/test-inside.sh, which installs the package and checks
# socket activation, readiness under the unit's own sandbox, access, restart,
# upgrade and purge, writes its verdict to /root/result and powers the container off.
#
# Usage: test-boot.sh OLD.deb NEW.deb (NEW is a later version of the same build).
set -eu
old=$1
new=$2
here=$(cd "$(dirname "$0")" && pwd)
cache=/var/cache/sandcell-test
# The root's name changes with its package list, so a cached older root is not used.
base=$cache/bookworm-root-curl
[ "$(id -u)" = 0 ] || { echo "test-boot: needs root (debootstrap, systemd-nspawn)" >&2; exit 1; }
command -v systemd-nspawn >/dev/null || { echo "test-boot: systemd-nspawn missing (apt-get install systemd-container)" >&2; exit 1; }

mkdir -p "$cache"
rm -rf "$cache/bookworm-root"
if [ ! -d "$base" ]; then
	echo "test-boot: debootstrap bookworm into $base (once; about 2 minutes)"
	rm -rf "$base.partial"
	debootstrap --variant=minbase --include=systemd,systemd-sysv,dbus,libseccomp2,procps,ca-certificates,curl \
		bookworm "$base.partial" http://deb.debian.org/debian >"$cache/debootstrap.log" 2>&1 ||
		{ tail -20 "$cache/debootstrap.log" >&2; exit 1; }
	mv "$base.partial" "$base"
fi

root=$(mktemp -d /var/tmp/sandcell-boot.XXXXXX)
trap 'rm -rf "$root"' EXIT
cp -a "$base/." "$root/"
cp "$old" "$root/root/old.deb"
cp "$new" "$root/root/new.deb"
cp "$here/test-inside.sh" "$root/root/test-inside.sh"
chmod 0755 "$root/root/test-inside.sh"
cat >"$root/etc/systemd/system/sandcell-test.service" <<'EOF'
[Unit]
Description=Sandcell package test
After=multi-user.target
[Service]
Type=oneshot
StandardOutput=journal+console
ExecStart=/root/test-inside.sh
ExecStopPost=/bin/systemctl poweroff --no-block
[Install]
WantedBy=multi-user.target
EOF
mkdir -p "$root/etc/systemd/system/multi-user.target.wants"
ln -sf /etc/systemd/system/sandcell-test.service "$root/etc/systemd/system/multi-user.target.wants/sandcell-test.service"

echo "test-boot: booting $root"
# nspawn's own seccomp filter predates Landlock: allow its calls, as a host's
# systemd does for a unit that asks (the unit's own filter still applies inside).
timeout 600 systemd-nspawn --register=no --keep-unit --quiet --private-network -b -D "$root" \
	--system-call-filter='landlock_create_ruleset landlock_add_rule landlock_restrict_self' \
	>"$cache/boot.log" 2>&1 || true
cp "$root/root/result" "$cache/result" 2>/dev/null || echo "no result" >"$cache/result"
if ! grep -q '^PASS$' "$cache/result"; then
	echo "test-boot: FAILED (boot log: $cache/boot.log)" >&2
	cat "$cache/result" >&2
	exit 1
fi
cat "$cache/result"
