#!/usr/bin/env bash
# Build a small local base image for the compose demo's two proxies where no image registry is reachable.
#
# The proxies only run nginx: debootstrap makes a Debian bookworm minbase root file system with Debian's
# nginx-light in it (the package deploy/local_cluster.py and the multi-machine guide use), and `docker import`
# turns the tree into an image of about a hundred megabytes, instead of building the proxies on the 7 GB base
# that carries torch. Dockerfile.proxy finds nginx already there and installs nothing.
# Where Flower's and Debian's published images can be pulled, this is not needed: Dockerfile.proxy defaults to
# debian:bookworm-slim. build_local_base.sh runs this script too.
#
# usage: deploy/docker/build_local_proxy_base.sh [image-tag]   (default pflower-proxy-base:local; needs root)
set -euo pipefail

TAG="${1:-pflower-proxy-base:local}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
WORK="$(mktemp -d /tmp/pflower-proxy-base.XXXXXX)"
ROOT="$WORK/rootfs"
trap 'rm -rf "$WORK"' EXIT

die() { echo "build_local_proxy_base: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "needs root (debootstrap)"
command -v debootstrap >/dev/null || die "debootstrap is missing: apt-get install -y debootstrap"
command -v docker >/dev/null || die "docker is missing: apt-get install -y docker.io, then start dockerd"
docker info >/dev/null 2>&1 || die "no Docker engine answers: start dockerd (deploy/docker/README.md) and retry"

echo "[proxy 1/2] debootstrap bookworm (minbase + nginx-light) into $ROOT (t+${SECONDS} s)"
debootstrap --variant=minbase --include=nginx-light bookworm "$ROOT" "$MIRROR" > "$WORK/debootstrap.log" 2>&1 \
  || { tail -20 "$WORK/debootstrap.log"; die "debootstrap failed"; }
# what a container never reads: package caches and lists, documentation, manual pages, translations
rm -rf "$ROOT"/var/cache/apt/archives/*.deb "$ROOT"/var/lib/apt/lists/* "$ROOT"/usr/share/doc/* \
  "$ROOT"/usr/share/man/* "$ROOT"/usr/share/locale/* "$ROOT"/usr/share/info/*

echo "[proxy 2/2] docker import -> $TAG (t+${SECONDS} s)"
tar -C "$ROOT" -c . | docker import -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' - "$TAG" > /dev/null
docker image ls "$TAG"
echo "built $TAG in ${SECONDS} s"
