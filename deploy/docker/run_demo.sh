#!/usr/bin/env bash
# Build and run the compose demo end to end, in the guide's topology (see docker-compose.yml): certificates,
# node keys and proxy configurations; images; SuperLink + SuperExec + the two proxies; the node keys registered
# by the operator through the control proxy (compose's one-shot `register` service); 3 SuperNodes through the
# fleet proxy; a data holder's container trying to submit a run (must be refused); one `flwr run` from this host
# followed to its end; the results folder copied out and checked; then everything torn down (also on failure or
# Ctrl-C). Each phase's time is printed at the end. Exit 0 only when the run finished and every check held.
#
# usage: deploy/docker/run_demo.sh [extra run-config, e.g. "method='fedcac' num-server-rounds=5"]
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
command -v docker >/dev/null 2>&1 || fail "Docker is missing on this machine (no 'docker' command). Install an engine, e.g. 'apt-get update && apt-get install -y docker.io docker-compose' on Debian, start dockerd (deploy/docker/README.md), and retry."
docker info >/dev/null 2>&1 || fail "no Docker engine answers ('docker info' failed). Start it (as root: 'dockerd > /tmp/dockerd.log 2>&1 & echo \$! > /tmp/dockerd.pid', or 'systemctl start docker') and retry."
if docker compose version >/dev/null 2>&1; then
  COMPOSE=(docker compose); echo "compose: docker compose (plugin), $(docker compose version --short 2>/dev/null || true)"
elif command -v docker-compose >/dev/null 2>&1; then
  COMPOSE=(docker-compose); echo "compose: docker-compose (standalone; Debian's docker.io has no compose plugin), $(docker-compose version --short 2>/dev/null || true)"
else
  fail "neither 'docker compose' (plugin) nor 'docker-compose' is installed (Debian: apt-get install -y docker-compose)"
fi
command -v flwr >/dev/null 2>&1 || fail "the flwr CLI is missing on the host: pip install -e . first"
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

WORK="$(mktemp -d /tmp/pflower-demo.XXXXXX)"
cleanup() {
  echo "== tearing down"
  "${COMPOSE[@]}" logs --no-color > "$WORK/compose.log" 2>&1 || true
  "${COMPOSE[@]}" down -v --remove-orphans > /dev/null 2>&1 || true
  echo "compose logs kept in $WORK/compose.log"
}
trap cleanup EXIT

phase "certificates (CA + one certificate for superlink, fleet-proxy, control-proxy, localhost, 127.0.0.1), node keys, proxy configs"
"$REPO/deploy/make_certs.sh" "$HERE/certs" superlink fleet-proxy control-proxy localhost 127.0.0.1 > /dev/null
"$REPO/deploy/make_node_keys.sh" "$HERE/keys" 4 > /dev/null  # node3: a key a data holder would like to register
chmod 644 "$HERE/certs/"* "$HERE/keys/"*  # demo only: Flower's images run as uid 49999 and must read the mounted keys
conf() {  # conf <name> <make_proxy_conf.py options...>: a standalone nginx configuration for one proxy container
  python3 "$REPO/deploy/make_proxy_conf.py" --superlink superlink:9091 --superlink-name superlink \
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

phase "up: supernode-0..2 (fleet network only), after the one-shot 'register' service registered their keys"
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
echo "== demo finished in $SECONDS s; results copied to $WORK/results"
printf '%s\n' "${PHASE_TIMES[@]}"
