#!/usr/bin/env bash
# Install the tools the deployment checks use (docker-compose, promtool, nginx)
# from Debian's packages when they are missing. Idempotent; a no-op when all are
# present; never fails the build: without root or apt-get it prints a notice and
# exits 0, and the tests that need a missing tool skip with a reason.
set -uo pipefail

have_all() {
    command -v docker-compose >/dev/null 2>&1 \
        && command -v promtool >/dev/null 2>&1 \
        && command -v nginx >/dev/null 2>&1
}

if have_all; then
    exit 0
fi

if [ "${EUID:-$(id -u)}" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "install-deploy-tools: docker-compose/promtool/nginx missing and not root (or no apt-get);" \
         "the deployment tests that need them will be skipped." >&2
    exit 0
fi

# Debian's postinst scripts would start prometheus, prometheus-node-exporter and
# nginx as daemons; policy-rc.d exit 101 tells invoke-rc.d not to start any
# service while we install. Restore whatever policy was there before.
policy=/usr/sbin/policy-rc.d
backup=""
if [ -e "$policy" ]; then
    backup="$(mktemp)"
    cp -p "$policy" "$backup"
fi
restore_policy() {
    if [ -n "$backup" ]; then mv -f "$backup" "$policy"; else rm -f "$policy"; fi
}
trap restore_policy EXIT
printf '#!/bin/sh\nexit 101\n' >"$policy"
chmod 755 "$policy"

export DEBIAN_FRONTEND=noninteractive
status=0
apt-get update -qq || status=$?
if [ "$status" -eq 0 ]; then
    # --no-install-recommends keeps prometheus from pulling node-exporter & co.
    apt-get install -y -qq --no-install-recommends docker-compose prometheus nginx >/dev/null \
        || status=$?
fi

if [ "$status" -ne 0 ] || ! have_all; then
    echo "install-deploy-tools: apt-get could not install every tool (status $status);" \
         "the deployment tests that need a missing one will be skipped." >&2
fi
exit 0
