#!/bin/bash
# make test-image: the OCI image under podman, as root, with the project's own podman
# configuration (CONTAINERS_CONF, CONTAINERS_STORAGE_CONF: set by the Makefile).
# Usage: packaging/test-image.sh dist/sandcell-image.tar IMAGE
# Loads the archive, checks its metadata and size, runs it read-only without
# capabilities, and checks: healthy, a run through the socket on a host volume prints
# 42 with the image's required layers active, guest code cannot reach the host's
# network, a file written in a run stays in the state volume, SIGTERM ends it with
# status 0 within the grace period while a run finishes. Needs jq, curl-free: the
# host's client is bin/sandcell (run --socket).
set -euo pipefail
# (grep -c, not grep -q, after a pipe: -q stops reading at the first match, and the
# writer's SIGPIPE then fails the pipeline under pipefail.)
tar=$1 image=$2
: "${CONTAINERS_CONF:?run through make test-image}" "${CONTAINERS_STORAGE_CONF:?run through make test-image}"
sandcell=${SANDCELL:-bin/sandcell}
name=sandcell-test-$$
work=$(mktemp -d /tmp/sandcell-image-test.XXXXXX)
listener=
cleanup() {
	podman rm -f "$name" >/dev/null 2>&1 || true
	[ -z "$listener" ] || kill "$listener" 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "test-image: FAIL: $*" >&2; podman logs "$name" 2>&1 | tail -20 >&2 || true; exit 1; }
step() { echo "test-image: $*"; }

# The archive, not what the build left in storage.
podman rmi -f "$image" >/dev/null 2>&1 || true
podman load -q -i "$tar"
size=$(stat -c %s "$tar")
step "archive $tar: $size bytes"
# 150 MB: the interpreter, its compressed snapshot module and the binary, which
# carries the lean worker (98.4 MB measured: the worker added 25 MB, the snapshot's
# heap a few to the module; the MCP server's SDK 3.8 MB before), and the site layer's
# libraries and zone data (143 MB measured with them: 44 MB more, babel's locale data
# 33 MB of it).
[ "$size" -le 150000000 ] || fail "image archive is $size bytes, over 150 MB"

inspect() { podman image inspect --format "$1" "$image"; }
[ "$(inspect '{{.Config.User}}')" = 65532:65532 ] || fail "user is $(inspect '{{.Config.User}}'), not 65532"
[ "$(inspect '{{index .Config.Healthcheck.Test 1}}')" = /usr/bin/sandcell ] || fail "no HEALTHCHECK running sandcell healthcheck"
created=$(date -u -d "@${SOURCE_DATE_EPOCH:?}" +%Y-%m-%dT%H:%M:%SZ)
for label in "version=${PKG_VERSION:?}" "revision=${REVISION:?}" "created=$created" \
	source=https://github.com/sandcell/sandcell title=sandcell; do
	key=org.opencontainers.image.${label%%=*} want=${label#*=}
	got=$(inspect "{{index .Labels \"$key\"}}")
	[ "$got" = "$want" ] || fail "label $key is '$got', want '$want'"
done
[ -n "$(inspect '{{index .Labels "org.opencontainers.image.licenses"}}')" ] || fail "no licenses label"
step "metadata: user 65532, HEALTHCHECK, OCI labels (created $created)"

# The state volume and the socket's directory, as an operator prepares them.
mkdir -p "$work/state" "$work/run"
chown 65532:65532 "$work/state" "$work/run"
chmod 0750 "$work/run"
sock=$work/run/sandcell.sock
run_flags=(--read-only --cap-drop=all --security-opt no-new-privileges --tmpfs /run -v "$work/state:/var/lib/sandcell")
# (podman's complaints about systemd timers for health checks go to podman.err.)
podman run -d --name "$name" "${run_flags[@]}" -v "$work/run:/run/sandcell" "$image" >/dev/null 2>>"$work/podman.err"

# podman schedules health checks with systemd timers, absent here: run them by hand.
# Prints the seconds it took.
wait_healthy() {
	local start i
	start=$(date +%s%N)
	for i in $(seq 1 360); do
		if podman healthcheck run "$name" >/dev/null 2>>"$work/podman.err"; then
			[ "$(podman inspect --format '{{.State.Health.Status}}' "$name")" = healthy ] || fail "health status is not healthy"
			echo "$(( ($(date +%s%N) - start) / 1000000 )) ms"
			return
		fi
		[ "$(podman inspect --format '{{.State.Running}}' "$name")" = true ] || fail "the container exited while starting"
		[ "$i" -lt 360 ] || fail "not healthy after 180 s"
		sleep 0.5
	done
}
took=$(wait_healthy)
step "healthy after $took (first start: unpacks and compiles modules into the state volume)"
podman restart -t 10 "$name" >/dev/null 2>>"$work/podman.err"
took=$(wait_healthy)
step "healthy after $took (restarted on the same state volume)"
podman logs "$name" 2>&1 | grep -c '"msg":"ready"' >/dev/null || fail "no ready line in the log"

out=$("$sandcell" run --socket "$sock" -c 'print(6*7)')
[ "$out" = 42 ] || fail "run printed '$out', not 42"
json=$("$sandcell" run --socket "$sock" --json -c 'print(1)')
jq -e '(.result // .).enforcement | .seccomp.active and .landlock.active and .no_new_privs and .capabilities == "="' \
	<<<"$json" >/dev/null || fail "a layer is not active: $(jq -c '(.result // .).enforcement' <<<"$json")"
layers=$(podman logs "$name" 2>&1 | grep '"msg":"ready"' | tail -1 | jq -r '.layers | join(",")')
for layer in rlimits capabilities landlock no_new_privs seccomp; do
	[[ ",$layers," == *",$layer,"* ]] || fail "layer $layer not active at start: $layers"
done
step "a run through $sock printed 42; layers active: $layers"
# The contract as the self-test reports it in this container, for the log.
podman run --rm "${run_flags[@]}" "$image" selftest 2>>"$work/podman.err" | sed 's/^/test-image:   /'
why=$(jq -r '(.result // .).enforcement.errors.pidns // empty' <<<"$json")
[ -n "$why" ] && step "pidns: $why"

# Guest code cannot reach a listener on the host (the container network's gateway).
gateway=$(podman network inspect podman --format '{{range .Subnets}}{{.Gateway}}{{end}}')
port=$(( 20000 + $$ % 10000 ))
python3 -c 'import socket,sys
s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("0.0.0.0", int(sys.argv[1]))); s.listen()
c,a=s.accept(); open(sys.argv[2],"w").write(str(a))' "$port" "$work/connected" &
listener=$!
out=$("$sandcell" run --socket "$sock" -c "
import socket
try:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(3)
    s.connect(('$gateway', $port))
    print('connected')
except Exception as e:
    print('refused', type(e).__name__, e)")
case $out in refused*) ;; *) fail "guest network: $out" ;; esac
sleep 1
[ ! -e "$work/connected" ] || fail "the host listener was reached: $(cat "$work/connected")"
kill "$listener"
listener=
step "guest network to $gateway:$port: $out"

# SIGTERM: a run in flight finishes, then the daemon exits 0 within the grace period.
"$sandcell" run --socket "$sock" -c 'import time; time.sleep(2); print("finished")' >"$work/inflight" 2>&1 &
inflight=$!
sleep 1
start=$(date +%s)
podman stop -t 10 "$name" >/dev/null 2>>"$work/podman.err"
took=$(( $(date +%s) - start ))
wait "$inflight" || fail "the run in flight failed: $(cat "$work/inflight")"
[ "$(cat "$work/inflight")" = finished ] || fail "the run in flight printed '$(cat "$work/inflight")'"
code=$(podman inspect --format '{{.State.ExitCode}}' "$name")
[ "$code" = 0 ] || fail "exit status $code after SIGTERM"
[ "$took" -lt 10 ] || fail "stopping took $took s"
# Two "stopped" lines: the restart's and this stop's.
[ "$(podman logs "$name" 2>&1 | grep -c '"msg":"stopped"')" -ge 2 ] || fail "no stopped line in the log after SIGTERM"
step "SIGTERM: the run in flight finished, exit 0 after $took s"
podman rm -f "$name" >/dev/null 2>&1

# As deploy/kubernetes runs it: the TCP listener with bearer tokens from a mounted
# file (the Secret), state and /run on empty world-writable directories (emptyDir),
# probes over HTTP without a token; and a seccomp profile like Docker's and
# containerd's RuntimeDefault, which podman's does not match: clone with namespace
# flags and unshare refused with EPERM (their default errno), clone3 ENOSYS. The
# daemon must be ready with the image's required layers and no namespaces.
jq '.defaultErrnoRet = 1 | (.syscalls[] | select(.action == "SCMP_ACT_ALLOW" and (.names | index("clone")))).names |=
	map(select(. != "clone" and . != "clone3" and . != "unshare"))
  | .syscalls += [{names: ["clone"], action: "SCMP_ACT_ALLOW",
	args: [{index: 0, value: 2114060288, valueTwo: 0, op: "SCMP_CMP_MASKED_EQ"}]},
	{names: ["clone3"], action: "SCMP_ACT_ERRNO", errnoRet: 38}]' \
	/usr/share/containers/seccomp.json >"$work/runtime-default.json"
mkdir -m 0777 "$work/k8s-state" "$work/k8s-run"
chmod 0777 "$work/k8s-state" "$work/k8s-run"
"$sandcell" token new ci --role runner >"$work/token"
secret=$(sed -n 2p "$work/token" | sed 's/^# //')
grep -v '^#' "$work/token" >"$work/tokens.toml"
chmod 0644 "$work/tokens.toml"
k8s_flags=(--read-only --cap-drop=all --security-opt no-new-privileges --security-opt "seccomp=$work/runtime-default.json"
	-v "$work/k8s-run:/run" -v "$work/k8s-state:/var/lib/sandcell"
	-e SANDCELL_TCP_LISTEN=:8443 -e SANDCELL_TCP_TOKENS_FILE=/etc/sandcell/tokens/tokens.toml)
if podman run --rm "${k8s_flags[@]}" "$image" serve >"$work/notokens" 2>&1; then
	fail "started without a tokens file"
fi
grep -q tokens "$work/notokens" || fail "no word of the missing tokens file: $(tail -2 "$work/notokens")"
podman run -d --name "$name" "${k8s_flags[@]}" -v "$work/tokens.toml:/etc/sandcell/tokens/tokens.toml:ro" \
	-p "127.0.0.1:$((port + 1)):8443" "$image" >/dev/null 2>>"$work/podman.err" || fail "podman run: $(tail -1 "$work/podman.err")"
ready=
for _ in $(seq 1 90); do
	if curl -sf "http://127.0.0.1:$((port + 1))/readyz" >/dev/null; then ready=1; break; fi
	sleep 2
done
[ -n "$ready" ] || fail "/readyz over TCP not 200 after 180 s"
curl -sf "http://127.0.0.1:$((port + 1))/livez" >/dev/null || fail "/livez over TCP"
layers=$(podman logs "$name" 2>&1 | grep '"msg":"ready"' | tail -1 | jq -r '.layers | join(",")')
[ "$layers" = rlimits,capabilities,landlock,no_new_privs,seccomp ] || fail "layers under the RuntimeDefault-like profile: $layers"
step "under a RuntimeDefault-like seccomp profile: ready, layers active: $layers"
api() { curl -s -o "$work/body" -w '%{http_code}' -H 'content-type: application/json' "$@" "http://127.0.0.1:$((port + 1))/v1/runs" -d '{"code":"print(6*7)"}'; }
[ "$(api)" = 401 ] || fail "a run without a token was not refused 401"
[ "$(api -H "Authorization: Bearer x$secret")" = 401 ] || fail "a run with a wrong token was not refused 401"
status=$(api -H "Authorization: Bearer $secret")
[ "$status" = 201 ] || [ "$status" = 200 ] || fail "a run with the token: $status $(cat "$work/body")"
jq -e '.result.stdout == "42\n"' "$work/body" >/dev/null || fail "run over TCP: $(cat "$work/body")"
step "TCP listener: probes answer without a token, runs need one (401 without), 42 with; refused to start without tokens"
echo "test-image: ok"
