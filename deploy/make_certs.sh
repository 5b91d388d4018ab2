#!/usr/bin/env bash
# Make a private CA and a SuperLink server certificate signed by it (openssl).
#
#   deploy/make_certs.sh [OUT_DIR] [NAME_OR_IP ...]
#
# OUT_DIR defaults to deploy/certs; the names default to "localhost 127.0.0.1". Every name/IP given ends
# up in the server certificate's subjectAltName (DNS:... for names, IP:... for addresses), so list every
# name or address SuperNodes and `flwr` use to reach the SuperLink. Comma-separated lists work too:
#   deploy/make_certs.sh deploy/certs superlink.example.org,10.0.0.5
#
# Writes OUT_DIR/ca.crt, ca.key (keep private: it signs certificates), server.pem, server.key,
# server.csr. Give the SuperLink  --ssl-ca-certfile ca.crt --ssl-certfile server.pem --ssl-keyfile server.key
# and SuperNodes / the `flwr` connection  ca.crt  (--root-certificates / root-certificates = "...").
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${1:-$here/certs}"
shift || true
names=("$@")
[ ${#names[@]} -eq 0 ] && names=(localhost 127.0.0.1)
days="${CERT_DAYS:-365}"
bits="${CERT_BITS:-2048}"  # RSA key size (CA and server)

# split comma-separated arguments
all=()
for n in "${names[@]}"; do IFS=',' read -r -a parts <<<"$n"; all+=("${parts[@]}"); done

san=""
for n in "${all[@]}"; do
  [ -z "$n" ] && continue
  if [[ "$n" =~ ^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$ || "$n" == *:* ]]; then entry="IP:$n"; else entry="DNS:$n"; fi
  san="${san:+$san,}$entry"
done
cn="${all[0]}"

mkdir -p "$out"
cd "$out"
umask 077

openssl genrsa -out ca.key "$bits" 2>/dev/null
openssl req -new -x509 -key ca.key -sha256 -days "$days" -out ca.crt \
  -subj "/O=pflower/CN=pflower test CA" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"

openssl genrsa -out server.key "$bits" 2>/dev/null
openssl req -new -key server.key -out server.csr -subj "/O=pflower/CN=$cn"
cat > server.ext <<EXT
basicConstraints = CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = $san
EXT
openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out server.pem \
  -days "$days" -sha256 -extfile server.ext 2>/dev/null
rm -f server.ext ca.srl
chmod 644 ca.crt server.pem
openssl verify -CAfile ca.crt server.pem >/dev/null
echo "certificates in $out: ca.crt ca.key server.pem server.key (subjectAltName: $san)"
