#!/usr/bin/env bash
# Build a local base image for the compose demo where no image registry is reachable.
#
# debootstrap makes a Debian bookworm root file system (Python 3.11), a virtual environment in it gets
# pflower's pinned dependencies (flwr, torch, ...) with this machine's pip configuration, and `docker import` turns
# the tree into an image. The pip configuration is what `pip config list` shows here (pip's configuration files and
# PIP_* variables): it is written to the tree's /etc/pip.conf for the install (and removed before the import), and
# the local paths it names (file:// indexes, find-links folders, constraint files, certificates) are bind-mounted
# read-only at the same place (deploy/pflower_deploy/pipconf.py). pip runs there with no other PIP_* variable.
# Where Flower's published images can be pulled, this is not needed: the Dockerfiles default to them.
# Then it runs build_local_proxy_base.sh: the proxies' small base (Debian minbase + nginx-light), without torch.
#
# usage: deploy/docker/build_local_base.sh [image-tag] [proxy-image-tag]
#        (defaults pflower-base:local and pflower-proxy-base:local; needs root)
set -euo pipefail

TAG="${1:-pflower-base:local}"
PROXY_TAG="${2:-pflower-proxy-base:local}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
REPO="$(cd "$(dirname "$0")/../.." && pwd)"
WORK="$(mktemp -d /tmp/pflower-base.XXXXXX)"
ROOT="$WORK/rootfs"
MOUNTS=()

die() { echo "build_local_base: $*" >&2; exit 1; }
cleanup() {
  for ((i=${#MOUNTS[@]}-1; i>=0; i--)); do umount -l "${MOUNTS[$i]}" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

[ "$(id -u)" = 0 ] || die "needs root (debootstrap, chroot, mounts)"
command -v debootstrap >/dev/null || die "debootstrap is missing: apt-get install -y debootstrap"
command -v docker >/dev/null || die "docker is missing: apt-get install -y docker.io, then start dockerd"
docker info >/dev/null 2>&1 || die "no Docker engine answers: start dockerd (deploy/docker/README.md) and retry"

echo "[1/4] debootstrap bookworm (minbase + python3) into $ROOT (t+${SECONDS} s)"
debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates,procps \
  bookworm "$ROOT" "$MIRROR" > "$WORK/debootstrap.log" 2>&1 || { tail -20 "$WORK/debootstrap.log"; die "debootstrap failed"; }

echo "[2/4] this machine's pip configuration into the tree, the local paths it names bind-mounted; DNS (t+${SECONDS} s)"
cp /etc/resolv.conf "$ROOT/etc/resolv.conf"
bind() {  # bind <host path> : read-only mount at the same path inside the root
  [ -e "$1" ] || { echo "  (not bind-mounted: $1 does not exist on this machine)"; return 0; }
  if [ -d "$1" ]; then mkdir -p "$ROOT$1"; else mkdir -p "$(dirname "$ROOT$1")"; touch "$ROOT$1"; fi
  mount --bind "$1" "$ROOT$1" && mount -o remount,bind,ro "$ROOT$1" && MOUNTS+=("$ROOT$1")
}
pip_paths="$(PYTHONPATH="$REPO" python3 -m deploy.pflower_deploy.pipconf chroot "$ROOT/etc/pip.conf")" \
  || die "could not read this machine's pip configuration (pip config list)"
while read -r p; do [ -z "$p" ] || bind "$p"; done <<< "$pip_paths"
mount -t proc proc "$ROOT/proc" && MOUNTS+=("$ROOT/proc")

echo "[3/4] install pflower's pinned dependencies into /opt/venv (torch is large: minutes) (t+${SECONDS} s)"
DEPS="$(python3 - "$REPO/pyproject.toml" <<'EOF'
import sys, tomllib
print(" ".join(f"'{d}'" for d in tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]))
EOF
)"
# a clean environment: pip reads the tree's /etc/pip.conf (written above), and no PIP_* variable besides
env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 PIP_ROOT_USER_ACTION=ignore \
  chroot "$ROOT" /bin/sh -c "python3 -m venv /opt/venv && /opt/venv/bin/pip install -q --no-cache-dir $DEPS" \
  || die "pip install in the root file system failed"
rm -f "$ROOT/etc/resolv.conf" "$ROOT/etc/pip.conf"  # neither belongs in the image: this machine's, not the image's
for ((i=${#MOUNTS[@]}-1; i>=0; i--)); do umount -l "${MOUNTS[$i]}"; done
MOUNTS=()
rm -rf "$ROOT/root/.cache" "$ROOT/var/cache/apt/archives"/*.deb

echo "[4/4] docker import -> $TAG (t+${SECONDS} s)"
# The tree (torch and its CUDA libraries: about 6 GB) and the image's layer would otherwise be on disk together, which
# a machine with little free space cannot hold: tar removes each file once it is in the stream. Nothing may still be
# mounted in the tree then (a bind mount's host files would be removed with it).
if findmnt -rn -o TARGET | grep -q "^$ROOT"; then die "something is still mounted under $ROOT: not streaming it"; fi
previous="$(docker image inspect -f '{{.Id}}' "$TAG" 2>/dev/null || true)"
mapfile -t top < <(ls -A "$ROOT")
(cd "$ROOT" && tar -c --remove-files -- "${top[@]}") | docker import \
  -c 'ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  -c 'ENV PYTHONUNBUFFERED=1' -c 'WORKDIR /app' - "$TAG"
# a rebuilt base leaves its predecessor untagged: remove it unless images built on it still need it
if [ -n "$previous" ] && [ "$previous" != "$(docker image inspect -f '{{.Id}}' "$TAG")" ]; then
  docker image rm "$previous" >/dev/null 2>&1 && echo "removed the previous $TAG ($previous)" || true
fi
docker image ls "$TAG"
cleanup
trap - EXIT
echo "built $TAG in ${SECONDS} s"
"$(dirname "$0")/build_local_proxy_base.sh" "$PROXY_TAG"
