#!/usr/bin/env bash
# Build the local Debian base image that make test-docker builds pagode's
# images on, where no image registry can be pulled from:
#   bash scripts/docker-base-image.sh [NAME]        (default pagode-base:bookworm)
# debootstrap makes a minimal bookworm root with Python 3.11 (the Python of the
# CPU torch wheel) and `docker import` turns it into an image. An image already
# present under NAME is reused. Elsewhere the Dockerfile's default base,
# python:3.11-slim-bookworm, plays this part.
set -euo pipefail

name="${1:-pagode-base:bookworm}"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"

if docker image inspect "$name" >/dev/null 2>&1; then
    echo "docker-base-image: reusing $name"
    exit 0
fi
if ! command -v debootstrap >/dev/null 2>&1; then
    [ "${EUID:-$(id -u)}" -eq 0 ] || { echo "docker-base-image: debootstrap is missing and installing it needs root" >&2; exit 1; }
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
fi

root="$(mktemp -d /var/tmp/pagode-base.XXXXXX)"
trap 'rm -rf "$root"' EXIT
start=$(date +%s)
echo "docker-base-image: debootstrap bookworm into $root (about a minute)"
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
    bookworm "$root" "$mirror" >"$root.log" 2>&1 \
    || { tail -20 "$root.log" >&2; rm -f "$root.log"; exit 1; }
rm -f "$root.log"
# What an image does not need: downloaded packages, package lists (a build runs
# apt-get update first), documentation and translations.
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* \
       "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/locale/*
tar -C "$root" -c . | docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["python3"]' \
    - "$name" >/dev/null
echo "docker-base-image: built $name in $(( $(date +%s) - start )) s"
