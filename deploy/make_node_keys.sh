#!/usr/bin/env bash
# Make SuperNode authentication key pairs: ECDSA P-384 keys in OpenSSH format, as Flower expects.
#
#   deploy/make_node_keys.sh [OUT_DIR] [COUNT]
#
# OUT_DIR defaults to deploy/keys, COUNT to 2. Writes OUT_DIR/node0, node0.pub, node1, ... Each SuperNode
# keeps its private key (flower-supernode --auth-supernode-private-key OUT_DIR/nodeK); the SuperLink
# operator registers the public keys (flwr supernode register OUT_DIR/nodeK.pub <connection>) against a
# SuperLink started with --enable-supernode-auth. Existing keys are kept.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${1:-$here/keys}"
count="${2:-2}"
mkdir -p "$out"
for ((k = 0; k < count; k++)); do
  if [ ! -f "$out/node$k" ]; then
    ssh-keygen -q -t ecdsa -b 384 -N "" -C "pflower-node$k" -f "$out/node$k"
  fi
done
echo "SuperNode keys in $out: $(cd "$out" && ls node* | tr '\n' ' ')"
