#!/usr/bin/env bash
# Build and run the compose demo end to end: certificates, images, SuperLink + SuperExec + 3 SuperNodes
# (TLS on), one `flwr run` followed to its end, the results folder copied out and checked, then
# everything torn down (also on failure or Ctrl-C).
#
# usage: deploy/docker/run_demo.sh [extra run-config, e.g. "method='fedcac' num-server-rounds=5"]
# env:   PFLOWER_BASE=pflower-base:local  build from the local base (build_local_base.sh) instead of
#                                         Flower's published images; the SuperLink uses it too
#        PFLOWER_PORT (19093)             host port of the SuperLink (loopback only)
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
EXTRA="${1:-}"
PORT="${PFLOWER_PORT:-19093}"
export PFLOWER_PORT="$PORT" PFLOWER_CERTS="$HERE/certs" COMPOSE_PROJECT_NAME="${COMPOSE_PROJECT_NAME:-pflower-demo}"
if [ -n "${PFLOWER_BASE:-}" ]; then
  export PFLOWER_SUPERLINK_IMAGE="${PFLOWER_SUPERLINK_IMAGE:-$PFLOWER_BASE}" PFLOWER_SUPEREXEC_BASE="${PFLOWER_SUPEREXEC_BASE:-$PFLOWER_BASE}"
fi

fail() { echo "run_demo: $*" >&2; exit 2; }
command -v docker >/dev/null 2>&1 || fail "Docker is missing on this machine (no 'docker' command). Install an engine, e.g. 'apt-get install docker.io docker-compose' on Debian, start 'dockerd', and retry."
docker info >/dev/null 2>&1 || fail "no Docker engine answers ('docker info' failed). Start it (e.g. 'dockerd &' as root, or 'systemctl start docker') and retry."
if docker compose version >/dev/null 2>&1; then COMPOSE=(docker compose); elif command -v docker-compose >/dev/null 2>&1; then COMPOSE=(docker-compose); else fail "neither 'docker compose' nor 'docker-compose' is installed (apt-get install docker-compose)"; fi
command -v flwr >/dev/null 2>&1 || fail "the flwr CLI is missing on the host: pip install -e . first"

WORK="$(mktemp -d /tmp/pflower-demo.XXXXXX)"
cleanup() {
  echo "== tearing down"
  "${COMPOSE[@]}" -f "$HERE/docker-compose.yml" logs --no-color > "$WORK/compose.log" 2>&1 || true
  "${COMPOSE[@]}" -f "$HERE/docker-compose.yml" down -v --remove-orphans > /dev/null 2>&1 || true
  echo "compose logs kept in $WORK/compose.log"
}
trap cleanup EXIT

echo "== certificates (CA + SuperLink certificate for superlink, localhost, 127.0.0.1)"
"$REPO/deploy/make_certs.sh" "$HERE/certs" superlink localhost 127.0.0.1 > /dev/null
chmod 644 "$HERE/certs/"*  # demo only: Flower's images run as uid 49999 and must read the mounted key

echo "== build (base: ${PFLOWER_BASE:-the published Flower images})"
start=$(date +%s)
"${COMPOSE[@]}" -f "$HERE/docker-compose.yml" build
echo "== up"
"${COMPOSE[@]}" -f "$HERE/docker-compose.yml" up -d
for i in $(seq 1 60); do
  if curl -sk --max-time 2 "https://127.0.0.1:$PORT/health" > /dev/null 2>&1; then break; fi
  sleep 1
done

export FLWR_HOME="$WORK/flwr"
mkdir -p "$FLWR_HOME"
cat > "$FLWR_HOME/config.toml" <<TOML
[superlink]
default = "docker"

[superlink.docker]
address = "127.0.0.1:$PORT"
root-certificates = "$HERE/certs/ca.crt"
TOML

echo "== flwr run (TLS to 127.0.0.1:$PORT)"
RUN_CONFIG="num-server-rounds=3 min-nodes=3 round-timeout=600.0 results-dir='/tmp/pflower-results' $EXTRA"
flwr run "$REPO" docker --stream --run-config "$RUN_CONFIG" 2>&1 | tee "$WORK/run.log"
line="$(grep -a '^pflower ' "$WORK/run.log" | tail -n 1 || true)"
[ -n "$line" ] || fail "the run printed no summary line; see $WORK/run.log"
folder="${line##*-> }"
echo "== results: $folder (in the superexec container)"
cid="$("${COMPOSE[@]}" -f "$HERE/docker-compose.yml" ps -q superexec)"
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
echo "== demo finished in $(( $(date +%s) - start )) s; results copied to $WORK/results"
