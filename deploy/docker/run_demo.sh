#!/usr/bin/env bash
# Build and run the compose demo end to end, in the guide's topology (see docker-compose.yml): certificates,
# node keys and proxy configurations; images; SuperLink + SuperExec + the two proxies; the node keys registered
# by the operator through the control proxy (compose's one-shot `register` service); 3 SuperNodes through the
# fleet proxy, each on a network of its own with it; the checks (a data holder's container tries to submit a run
# and register a key; supernode-0 tries to reach supernode-1 and a port on the host; a SuperNode with an
# unregistered key tries to join); one `flwr run` from this host followed to its end; the results folder copied
# out and checked; then everything torn down (also on failure or Ctrl-C). Each phase's time is printed at the end.
#
# Exit status: 0 only when the run finished and every check held; 2 with a line "run_demo: <why>" on stderr when a
# prerequisite is missing or a check fails; any other status is that of the command that failed (e.g. the build).
#
# usage: deploy/docker/run_demo.sh [extra run-config, e.g. "method='fedcac' num-server-rounds=5"]
# needs: docker (an engine that answers), docker compose or docker-compose, curl, openssl, ssh-keygen, ip, python3 and
#        the flwr CLI (pip install -e .) on this host; all are checked first, and the missing ones named
# env:   PFLOWER_BASE=pflower-base:local  build from the local base (build_local_base.sh) instead of the
#                                         published images; the SuperLink uses it too
#        PFLOWER_PROXY_BASE               the proxies' base: debian:bookworm-slim, or with PFLOWER_BASE set
#                                         pflower-proxy-base:local (build_local_base.sh builds both)
#        PFLOWER_PORT (19093)             host port of the control proxy (loopback only)
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
EXTRA="${1:-}"
PORT="${PFLOWER_PORT:-19093}"
export PFLOWER_PORT="$PORT" PFLOWER_CERTS="$HERE/certs" PFLOWER_KEYS="$HERE/keys" PFLOWER_PROXY_CONF="$HERE/proxy"
export COMPOSE_PROJECT_NAME="${COMPOSE_PROJECT_NAME:-pflower-demo}"
if [ -n "${PFLOWER_BASE:-}" ]; then
  export PFLOWER_SUPERLINK_IMAGE="${PFLOWER_SUPERLINK_IMAGE:-$PFLOWER_BASE}" \
         PFLOWER_SUPEREXEC_BASE="${PFLOWER_SUPEREXEC_BASE:-$PFLOWER_BASE}" \
         PFLOWER_PROXY_BASE="${PFLOWER_PROXY_BASE:-pflower-proxy-base:local}"
fi

fail() { echo "run_demo: $*" >&2; exit 2; }
# every prerequisite first, all the missing ones named at once (each with where it comes from on Debian)
missing=()
for need in "curl:curl" "openssl:openssl" "ssh-keygen:openssh-client" "ip:iproute2" "python3:python3" "docker:docker.io"; do
  command -v "${need%%:*}" >/dev/null 2>&1 || missing+=("${need%%:*} (Debian: apt-get install -y ${need#*:})")
done
if docker compose version >/dev/null 2>&1; then
  COMPOSE=(docker compose); COMPOSE_SAYS="docker compose (plugin), $(docker compose version --short 2>/dev/null || true)"
elif command -v docker-compose >/dev/null 2>&1; then
  COMPOSE=(docker-compose); COMPOSE_SAYS="docker-compose (standalone; Debian's docker.io has no compose plugin), $(docker-compose version --short 2>/dev/null || true)"
else
  missing+=("docker compose or docker-compose (Debian: apt-get install -y docker-compose)")
fi
command -v flwr >/dev/null 2>&1 || missing+=("flwr, the operator's CLI (pip install -e . in the checkout)")
if [ ${#missing[@]} -gt 0 ]; then
  fail "missing on this machine: $(printf '%s; ' "${missing[@]}" | sed 's/; $//'). Install them and retry (deploy/docker/README.md, Prerequisites)."
fi
docker info >/dev/null 2>&1 || fail "no Docker engine answers ('docker info' failed). Start it (as root: 'dockerd > /tmp/dockerd.log 2>&1 & echo \$! > /tmp/dockerd.pid', or 'systemctl start docker') and retry."
echo "compose: $COMPOSE_SAYS"
echo "machine: $(date -u '+%Y-%m-%d %H:%M UTC'), $(uname -sr), $(nproc) cores ($(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)), $(awk '/^MemTotal/ {printf "%.0f", $2 / 1048576}' /proc/meminfo) GB memory, Docker $(docker version -f '{{.Server.Version}}' 2>/dev/null), load average $(cut -d ' ' -f 1-3 /proc/loadavg)"
COMPOSE+=(-f "$HERE/docker-compose.yml")
for image in ${PFLOWER_BASE:+"$PFLOWER_BASE" "$PFLOWER_PROXY_BASE"}; do
  docker image inspect "$image" > /dev/null 2>&1 || fail "the base image $image does not exist: build it with deploy/docker/build_local_base.sh"
done

PHASE="" PHASE_START=$SECONDS PHASE_TIMES=()
phase() {  # phase <name>: start the next phase, noting how long the one before took
  [ -z "$PHASE" ] || PHASE_TIMES+=("$(printf '%5d s  %s' $((SECONDS - PHASE_START)) "$PHASE")")
  PHASE="$1" PHASE_START=$SECONDS
  [ -z "$1" ] || echo "== $1"
}

if [ -z "${PFLOWER_BASE:-}" ]; then  # the Dockerfile installs the dependencies: with this machine's remote pip indexes
  while IFS='=' read -r name value; do [ -z "$name" ] || export "$name=$value"; done \
    < <(PYTHONPATH="$REPO" python3 -m deploy.pflower_deploy.pipconf build-args)
fi

WORK="$(mktemp -d /tmp/pflower-demo.XXXXXX)"
host_listener=""
cleanup() {
  [ -z "$host_listener" ] || kill "$host_listener" 2>/dev/null || true
  echo "== tearing down"
  "${COMPOSE[@]}" logs --no-color > "$WORK/compose.log" 2>&1 || true
  "${COMPOSE[@]}" down -v --remove-orphans > /dev/null 2>&1 || true
  echo "compose logs kept in $WORK/compose.log"
}
trap cleanup EXIT

phase "certificates (CA + one certificate for superlink, fleet-proxy, control-proxy, localhost, 127.0.0.1), node keys, proxy configs"
"$REPO/deploy/make_certs.sh" "$HERE/certs" superlink fleet-proxy control-proxy localhost 127.0.0.1 > /dev/null
"$REPO/deploy/make_node_keys.sh" "$HERE/keys" 4 > /dev/null  # node3: a key a data holder would like to register
# ca.key signs certificates: this user's only, and mounted in no container (docker-compose.yml). The private keys the
# containers read (server.key: the proxies and the SuperLink; keys/nodeK: SuperNode K) must be readable by Flower's
# images' user (uid 49999): as root, handed to that uid; otherwise readable by all (a demo on one machine only).
chmod 600 "$HERE/certs/ca.key"
chmod 644 "$HERE/certs/ca.crt" "$HERE/certs/server.pem" "$HERE/keys/"*.pub
for f in "$HERE/certs/server.key" "$HERE/keys/node0" "$HERE/keys/node1" "$HERE/keys/node2" "$HERE/keys/node3"; do
  if [ "$(id -u)" = 0 ]; then chown 49999:49999 "$f" && chmod 600 "$f"; else chmod 644 "$f"; fi
done
conf() {  # conf <name> <deploy.make_proxy_conf options...>: a standalone nginx configuration for one proxy container
  PYTHONPATH="$REPO" python3 -m deploy.make_proxy_conf --superlink superlink:9091 --superlink-name superlink \
    --certs /certs --no-file-check --standalone "$HERE/proxy/$1" --site-path /etc/pflower-proxy/pflower.conf \
    --logs stdio "${@:2}" 2> /dev/null
}
conf fleet --fleet 0.0.0.0:9092                      # the data holders' proxy: Fleet routes only
conf control --control 0.0.0.0:9093 --operator all   # on the link and operator networks only: no data holder is there

phase "build (base: ${PFLOWER_BASE:-the published images}; proxies: ${PFLOWER_PROXY_BASE:-debian:bookworm-slim})"
"${COMPOSE[@]}" build
phase "up: superlink, superexec, fleet-proxy, control-proxy"
"${COMPOSE[@]}" up -d superlink superexec fleet-proxy control-proxy
healthy=""
for i in $(seq 1 120); do  # 200 only once the SuperLink behind the proxy answers (502 before)
  if curl -sf --cacert "$HERE/certs/ca.crt" --max-time 2 "https://127.0.0.1:$PORT/health" > /dev/null 2>&1; then healthy=1; break; fi
  sleep 1
done
[ -n "$healthy" ] || fail "no answer from the SuperLink through the control proxy (https://127.0.0.1:$PORT/health) in 120 s"

export FLWR_HOME="$WORK/flwr"
mkdir -p "$FLWR_HOME"
cat > "$FLWR_HOME/config.toml" <<TOML
[superlink]
default = "docker"

[superlink.docker]
address = "127.0.0.1:$PORT"
root-certificates = "$HERE/certs/ca.crt"
TOML

phase "up: supernode-0..2 (each on a network of its own with the fleet proxy), after the one-shot 'register' service registered their keys"
"${COMPOSE[@]}" up -d supernode-0 supernode-1 supernode-2 \
  || { "${COMPOSE[@]}" logs --no-color register >&2; fail "the SuperNodes did not start (the registration's log is above)"; }
"${COMPOSE[@]}" logs --no-color register | sed -n 's/^register[^|]*| //p'
online=""
for i in $(seq 1 60); do  # the three registered SuperNodes connected through the fleet proxy
  online="$(flwr supernode ls docker --format json 2>&1 | python3 -c 'import json, sys; t = sys.stdin.read()
print(sum(n["status"] == "online" for n in json.loads(t[t.index("{"):]).get("nodes", [])))' 2>/dev/null || true)"
  [ "$online" = 3 ] && break
  sleep 2
done
[ "$online" = 3 ] || fail "${online:-no} SuperNode(s) of 3 online after 120 s (their logs are in the compose log kept below)"
echo "SuperNodes online (flwr supernode ls): $online"

phase "a data holder (supernode-0's container) tries to submit a run and register a key"
holder_try() {  # holder_try <address> <command> <expected words>: the command must fail, refused as expected
  if out="$("${COMPOSE[@]}" exec -T supernode-0 sh -c "
      mkdir -p /tmp/holder && printf '[superlink]\ndefault = \"h\"\n[superlink.h]\naddress = \"$1\"\nroot-certificates = \"/certs/ca.crt\"\n' > /tmp/holder/config.toml
      echo '$(cat "$HERE/keys/node3.pub")' > /tmp/holder/own.pub
      export FLWR_HOME=/tmp/holder
      $2" 2>&1)"; then
    fail "a data holder could '$2' via $1:
$out"
  fi
  out="$(echo "$out" | tr -d '│╭╮╰╯─' | tr -s ' \n' ' ' | sed 's/Using SuperLink: [^)]*) //')"
  echo "$out" | grep -q "$3" || fail "'$2' via $1 failed, but not with '$3': $out"
  echo "refused: $2 via $1 -> $(echo "$out" | cut -c1-110)"
}
holder_try fleet-proxy:9092 "flwr run /app h --run-config num-server-rounds=1" "404 Not Found"
holder_try fleet-proxy:9092 "flwr supernode register /tmp/holder/own.pub h" "404 Not Found"
holder_try control-proxy:9093 "flwr run /app h --run-config num-server-rounds=1" "unavailable"
holder_try superlink:9091 "flwr supernode register /tmp/holder/own.pub h" "unavailable"
runs="$(flwr ls docker --format json | python3 -c 'import json,sys; t=sys.stdin.read(); print(len(json.loads(t[t.index("{"):])["runs"]))')"
[ "$runs" = 0 ] || fail "$runs run(s) exist before the operator submitted one"
echo "runs on the SuperLink before the operator's: $runs"

phase "isolation: supernode-0 tries to reach supernode-1 and a port on the host"
probe() {  # probe <service> <probe...>: deploy/pflower_deploy/probes.py run in the service's container (stdin), JSON
  "${COMPOSE[@]}" exec -T "$1" python - --timeout 3 "${@:2}" < "$REPO/deploy/pflower_deploy/probes.py"
}
verdict() {  # verdict <reachable|unreachable> <JSON results>: "probe -> result" for each; status 1 if one is not as asked
  python3 - "$@" <<'PY'
import json, sys
want, results = sys.argv[1], json.loads(sys.argv[2])
print(", ".join(f"{r['probe'].removeprefix('tcp:')} {'connected' if r.get('connected') else r.get('error')}" for r in results))
sys.exit(any(bool(r.get("connected")) != (want == "reachable") for r in results))
PY
}
ip_on() {  # ip_on <service> <network>: the service's address on the compose network
  docker inspect -f "{{(index .NetworkSettings.Networks \"${COMPOSE_PROJECT_NAME}_$2\").IPAddress}}" "$("${COMPOSE[@]}" ps -q "$1")"
}
# a bare TCP listener on all addresses (accepts, closes, serves nothing): listen <port, 0: any>; prints its port
LISTENER='import socket, sys
s = socket.create_server(("0.0.0.0", int(sys.argv[1])))
print(s.getsockname()[1], flush=True)
while True:
    s.accept()[0].close()'
# the control: the probe does connect from supernode-0 to what it must reach
said="$(verdict reachable "$(probe supernode-0 tcp:fleet-proxy:9092)")" || fail "supernode-0 cannot reach the fleet proxy: $said"
echo "isolation: supernode-0 reaches its proxy: $said"
# supernode-1 listens on a test port (for 60 s) on all its addresses; the fleet proxy, on supernode-1's network, reaches it
peer="$(ip_on supernode-1 fleet-1)"
"${COMPOSE[@]}" exec -T -d supernode-1 timeout 60 python -c "$LISTENER" 18080 > /dev/null
for _ in $(seq 1 20); do
  "${COMPOSE[@]}" exec -T fleet-proxy timeout 3 bash -c "exec 3<>/dev/tcp/$peer/18080" 2>/dev/null && break
  sleep 1
done || true
"${COMPOSE[@]}" exec -T fleet-proxy timeout 3 bash -c "exec 3<>/dev/tcp/$peer/18080" 2>/dev/null \
  || fail "the check cannot run: supernode-1's test port ($peer:18080) does not answer the fleet proxy on supernode-1's network"
said="$(verdict unreachable "$(probe supernode-0 tcp:supernode-1:18080 "tcp:$peer:18080")")" \
  || fail "supernode-0 reaches supernode-1: $said"
echo "isolation: supernode-0 cannot reach supernode-1 (its port 18080 answers the fleet proxy at $peer): $said"
# a port on the host, listening on all its addresses: the addresses the host has (each answers from the host) and
# the address it would have on supernode-0's network (its gateway, which the host must not have: inhibit_ipv4)
python3 -c "$LISTENER" 0 > "$WORK/host_port" 2>&1 &
host_listener=$!
for _ in $(seq 1 20); do [ -s "$WORK/host_port" ] && break; sleep 0.5; done
host_port="$(head -n 1 "$WORK/host_port")"
[[ "$host_port" =~ ^[0-9]+$ ]] || fail "the check cannot run: no test port on the host ($host_port)"
gateway="$(docker network inspect -f '{{(index .IPAM.Config 0).Gateway}}' "${COMPOSE_PROJECT_NAME}_fleet-0")"
ip -4 -o addr show 2>/dev/null | grep -q " inet $gateway/" && fail "the host has an address on supernode-0's network ($gateway): its sockets are open to the node"
mapfile -t host_ips < <(ip -4 -o addr show 2>/dev/null | awk '{split($4, a, "/"); print a[1]}' | grep -v '^127\.')
[ ${#host_ips[@]} -gt 0 ] || fail "the check cannot run: no IPv4 address of this host found with 'ip -4 addr'"
host_probes=()
for a in "${host_ips[@]}"; do host_probes+=("tcp:$a:$host_port"); done
for _ in $(seq 1 20); do verdict reachable "$(python3 "$REPO/deploy/pflower_deploy/probes.py" --timeout 3 "${host_probes[@]}")" > /dev/null && break; sleep 0.5; done || true
said="$(verdict reachable "$(python3 "$REPO/deploy/pflower_deploy/probes.py" --timeout 3 "${host_probes[@]}")")" \
  || fail "the check cannot run: the host's test port does not answer on all its addresses from the host: $said"
said="$(verdict unreachable "$(probe supernode-0 "${host_probes[@]}" "tcp:$gateway:$host_port")")" \
  || fail "supernode-0 reaches a port on the host: $said"
echo "isolation: supernode-0 cannot reach a port on the host (port $host_port on 0.0.0.0 answers the host on all ${#host_ips[@]} addresses; $gateway is fleet-0's gateway, not the host's): $said"
kill "$host_listener" 2>/dev/null || true
host_listener=""

phase "a SuperNode with a key nobody registered (keys/node3) tries to join"
code=0
timeout 300 "${COMPOSE[@]}" run --rm --no-deps unregistered > "$WORK/unregistered.log" 2>&1 || code=$?
# refused by the SuperLink (Flower's error 2004), not failing for another reason (TLS, network: also exit code 305)
grep -q "Exit Code: 305" "$WORK/unregistered.log" && grep -q "Failed to activate SuperNode" "$WORK/unregistered.log" \
  || fail "the unregistered SuperNode was not refused as expected (exit status $code); its log: $(tail -n 12 "$WORK/unregistered.log")"
[ "$code" = 1 ] || fail "the unregistered SuperNode's container exited with $code, not 1 (Flower's flwr_exit: 1 for every error code)"
echo "refused: an unregistered SuperNode: its log says 'Exit Code: 305' and 'Failed to activate SuperNode'; its container exits with status $code"

phase "flwr run (operator, TLS to the control proxy at 127.0.0.1:$PORT)"
RUN_CONFIG="num-server-rounds=3 min-nodes=3 round-timeout=600.0 results-dir='/tmp/pflower-results' $EXTRA"
flwr run "$REPO" docker --stream --run-config "$RUN_CONFIG" 2>&1 | tee "$WORK/run.log"
line="$(grep -a '^pflower ' "$WORK/run.log" | tail -n 1 || true)"
[ -n "$line" ] || fail "the run printed no summary line; see $WORK/run.log"
folder="${line##*-> }"
phase "results: $folder (in the superexec container)"
cid="$("${COMPOSE[@]}" ps -q superexec)"
mkdir -p "$WORK/results"
docker cp "$cid:$folder" "$WORK/results/" || fail "could not copy $folder out of the superexec container"
summary="$WORK/results/$(basename "$folder")/summary.json"
python3 - "$summary" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
assert s["rounds"] >= 1 and s["clients"] == 3, s
print(f"summary.json: {s['rounds']} rounds, {s['clients']} clients, personalized acc {s['personal-acc']:.4f}, "
      f"{s['failures']} rejected replies")
PY
phase ""
echo "== demo finished in $SECONDS s (load average now $(cut -d ' ' -f 1-3 /proc/loadavg)); results copied to $WORK/results"
printf '%s\n' "${PHASE_TIMES[@]}"
