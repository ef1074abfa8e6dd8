#!/bin/sh
# The image every Dockerfile here builds FROM when no container registry is reachable: a
# minimal Debian (bookworm: Python 3.11, as in python:3.11-slim) made with debootstrap from
# Debian's archive and loaded with `docker import`. Built once; later runs reuse it.
#   deploy/compose/base-image.sh [IMAGE]     (default burn-remote-base:bookworm)
set -eu
IMAGE=${1:-burn-remote-base:bookworm}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
CACHE=${DEBOOTSTRAP_CACHE:-/var/cache/burn-remote/debootstrap}
PACKAGES=python3,python3-venv,iproute2,ca-certificates

if docker image inspect "$IMAGE" >/dev/null 2>&1; then
    echo "base image: $IMAGE (cached)"
    exit 0
fi
echo "base image: building $IMAGE with debootstrap from $MIRROR (once; about a minute)"
root=$(mktemp -d /var/tmp/burn-remote-base.XXXXXX)
trap 'rm -rf "$root"' EXIT
mkdir -p "$CACHE"
debootstrap --variant=minbase --include="$PACKAGES" --cache-dir="$CACHE" \
    bookworm "$root" "$MIRROR" >"$root.log" 2>&1 || { tail -20 "$root.log"; exit 1; }
rm -f "$root.log"
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/usr/share/doc \
    "$root"/usr/share/man "$root"/usr/share/locale
tar -C "$root" -c . | docker import \
    --change 'ENV LANG=C.UTF-8 PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["python3"]' - "$IMAGE" >/dev/null
echo "base image: $IMAGE built"
