#!/bin/sh
# The compose demo's one-shot `register` service: the operator registers the SuperNodes' public keys
# (/keys/*.pub) with the SuperLink through the control proxy, as `flwr supernode register` does from the
# operator's machine. The SuperNodes start only after this exits 0 (docker-compose.yml: depends_on with
# service_completed_successfully); without it, a SuperLink started with --enable-supernode-auth refuses them and
# they restart in a loop ("Failed to activate SuperNode", exit code 305).
# A key the SuperLink already knows (the service runs again on a second `up`) counts as registered.
set -eu

mkdir -p /tmp/operator
cat > /tmp/operator/config.toml <<EOF
[superlink]
default = "operator"

[superlink.operator]
address = "control-proxy:9093"
root-certificates = "/certs/ca.crt"
EOF
export FLWR_HOME=/tmp/operator

# `flwr ... --format json` exits 0 also when it failed: the answer's "success" says whether it did
answer() {  # answer <json>: "ok <node id>", "known" (key already registered) or "failed <message>"
  python -c 'import json, sys
d = json.loads(sys.argv[1][sys.argv[1].index("{"):])
m = d.get("error-message", "")
print("ok " + str(d["node-id"]) if d.get("success") else "known" if "already in use" in m else "failed " + m)' "$1"
}

for key in /keys/*.pub; do
  name="$(basename "$key" .pub)"
  tries=0
  # the SuperLink behind the proxy may still be starting (502, unavailable): retry for up to two minutes
  while :; do
    result="$(answer "$(flwr supernode register "$key" operator --name "$name" --format json 2>&1)" 2>&1 || true)"
    case "$result" in
      ok\ *) echo "$name: registered, node id ${result#ok }"; break ;;
      known) echo "$name: already registered"; break ;;
    esac
    tries=$((tries + 1))
    if [ "$tries" -ge 60 ]; then
      echo "register: $name could not be registered through control-proxy:9093: $result" >&2
      exit 1
    fi
    sleep 2
  done
done
