#!/bin/sh
# Runs inside the booted test container (see test-boot.sh) as a oneshot unit. Each
# step appends a line to /root/result; the last line is PASS or FAIL.
set -u
out=/root/result
: >"$out"
log() { echo "$*" >>"$out"; }
fail() { log "FAIL: $*"; log "--- journal"; journalctl -u sandcell.service -u sandcell.socket --no-pager -n 60 >>"$out" 2>&1; log FAIL; exit 1; }
sock=/run/sandcell/sandcell.sock
# ready waits (at most 90 s) for the daemon to answer /readyz 200.
ready() {
	i=0
	until sandcell healthcheck --socket "$sock" 2>>"$out"; do
		i=$((i + 1))
		[ $i -lt 180 ] || return 1
		sleep 0.5
	done
}

dpkg -i /root/old.deb >>"$out" 2>&1 || fail "dpkg -i old.deb"
log "ok: installed $(dpkg-query -W -f '${Version}' sandcell)"
[ "$(systemctl is-active sandcell.socket)" = active ] || fail "sandcell.socket is not active"
[ "$(systemctl is-active sandcell.service)" != active ] || fail "sandcell.service started before the first connection"
[ "$(systemctl is-enabled sandcell.socket)" = enabled ] || fail "sandcell.socket is not enabled"
getent passwd sandcell >/dev/null || fail "no sandcell user"
log "ok: socket active and enabled, service waiting for its first connection"

# The first connection starts the service; it is active only after READY=1.
ready || fail "never ready"
[ "$(systemctl is-active sandcell.service)" = active ] || fail "sandcell.service is not active after the first connection"
status=$(systemctl show -p StatusText --value sandcell.service)
log "ok: service started by the socket: $status"
case $status in *"11 layers active"*) ;; *) fail "not every layer active under the unit's sandbox: $status" ;; esac
# READY=1 came after the self-test: the journal has the passed canary before "ready".
journalctl -u sandcell.service -o cat --no-pager |
	awk '/check=canary state=ok/ { c = NR } /msg=ready/ { r = NR } END { exit !(c && r && c < r) }' ||
	fail "no passed self-test before ready in the journal"

# A member of the sandcell group (a supplementary group: SO_PEERGROUPS under the
# unit) is a runner by the default configuration.
useradd -m -G sandcell alice
useradd -m -G sandcell bob
got=$(runuser -u alice -- sandcell run --socket "$sock" -c 'print(6*7)' 2>&1) || fail "alice's run: $got"
[ "$got" = 42 ] || fail "alice's run printed $got"
log "ok: alice (runner by the sandcell group) ran print(6*7): $got"

# A named workspace under the unit's own filter (where openat2 answers ENOSYS): a
# file uploaded, read by a run, written by it, read back, a SQL query, removed.
api() { runuser -u alice -- curl -sS --unix-socket "$sock" -H 'Content-Type: application/json' "$@"; }
ws=$(api -X POST http://x/v1/workspaces | sed -n 's/.*"id":"\([^"]*\)".*/\1/p')
[ -n "$ws" ] || fail "no workspace created"
api -X PUT --data-binary 'six times seven' "http://x/v1/workspaces/$ws/files/in/q.txt" >/dev/null || fail "upload"
got=$(api -d '{"workspace":"'"$ws"'","code":"q = open(\"/ws/in/q.txt\").read()\nopen(\"/ws/a.txt\", \"w\").write(q + \" is 42\")"}' http://x/v1/runs)
case $got in *'"exit_code":0'*) ;; *) fail "run in the workspace: $got" ;; esac
got=$(api "http://x/v1/workspaces/$ws/files/a.txt")
[ "$got" = "six times seven is 42" ] || fail "read back: $got"
got=$(api -d '{"workspace":"'"$ws"'","code":"import sqlite3; c = sqlite3.connect(\"/ws/t.db\"); c.execute(\"create table t(x)\"); c.execute(\"insert into t values (42)\"); c.commit()"}' http://x/v1/runs)
case $got in *'"exit_code":0'*) ;; *) fail "sqlite in a run: $got" ;; esac
got=$(api -d '{"workspace":"'"$ws"'","db":"t.db","sql":"SELECT x FROM t"}' http://x/v1/sql)
case $got in *'"rows":[[42]]'*) ;; *) fail "SQL tool: $got" ;; esac
api -X DELETE "http://x/v1/workspaces/$ws/files/in" -o /dev/null -w '%{http_code}' | grep -q 204 || fail "delete a directory"
api -X DELETE "http://x/v1/workspaces/$ws" -o /dev/null -w '%{http_code}' | grep -q 204 || fail "delete the workspace"
log "ok: a named workspace under the unit: upload, run reads and writes it, read back, SQL tool, delete"

# Edit the conffile (kept across the upgrade below): only alice runs code now.
pid_before=$(systemctl show -p MainPID --value sandcell.service)
sed -i 's/^runners = .*/runners = ["alice"]/' /etc/sandcell/sandcell.toml
systemctl restart sandcell.service || fail "systemctl restart"
ready || fail "not ready after restart"
[ "$(systemctl show -p MainPID --value sandcell.service)" != "$pid_before" ] || fail "restart kept the same process"
log "ok: restarted (a new main process)"
got=$(runuser -u bob -- sandcell run --socket "$sock" -c 'print(1)' 2>&1) && fail "bob (no role) was allowed to run"
case $got in *forbidden*) ;; *) fail "bob was not refused by the API (403 forbidden): $got" ;; esac
sandcell audit verify --config /etc/sandcell/sandcell.toml >>"$out" 2>&1 || fail "audit verify"
# The refusal is a record (its kind is plain text in the database or its WAL).
cat /var/lib/sandcell/audit.db* | grep -aq 'access.denied' || fail "bob's refusal is not in the audit log"
log "ok: bob (no role) refused, and the refusal audited; the chain verifies"
audit_before=$(stat -c %s /var/lib/sandcell/audit.db)

# Upgrade: the edited configuration and the audit log stay; the daemon is restarted.
pid_before=$(systemctl show -p MainPID --value sandcell.service)
dpkg -i /root/new.deb >>"$out" 2>&1 || fail "dpkg -i new.deb"
grep -q '^runners = \["alice"\]' /etc/sandcell/sandcell.toml || fail "the upgrade replaced the edited configuration"
[ -f /var/lib/sandcell/audit.db ] || fail "the upgrade lost the audit log"
[ "$(stat -c %s /var/lib/sandcell/audit.db)" -ge "$audit_before" ] || fail "the audit log shrank"
ready || fail "not ready after the upgrade"
[ "$(systemctl show -p MainPID --value sandcell.service)" != "$pid_before" ] || fail "the upgrade did not restart the daemon"
got=$(runuser -u alice -- sandcell run --socket "$sock" -c 'print(6*7)' 2>&1) || fail "run after upgrade: $got"
log "ok: upgraded to $(dpkg-query -W -f '${Version}' sandcell); config and audit log kept; alice ran: $got"

# Purge: state and configuration gone.
apt-get purge -y sandcell >>"$out" 2>&1 || fail "apt-get purge"
[ ! -e /var/lib/sandcell ] || fail "purge left /var/lib/sandcell"
[ ! -e /etc/sandcell/sandcell.toml ] || fail "purge left the configuration"
[ ! -e /usr/bin/sandcell ] || fail "purge left the binary"
[ ! -e /var/cache/sandcell ] || fail "purge left /var/cache/sandcell"
[ ! -e /etc/systemd/system/sockets.target.wants/sandcell.socket ] || fail "purge left the socket enabled"
getent passwd sandcell >/dev/null || fail "purge removed the sandcell user (Debian policy keeps system users)"
log "ok: purged: state, cache, configuration, files and unit links removed; the user stays"
log PASS
