#!/usr/bin/env bash
# Install Go and the msgpack library llm-d decodes KV events with (vmihailenco/msgpack v5),
# from Debian's packages, for tests/test_kv_events_llmd.py. Idempotent; never fails the
# build: without root or apt-get it prints a notice and exits 0, and that test skips.
set -uo pipefail

LIB=/usr/share/gocode/src/github.com/vmihailenco/msgpack/v5
if command -v go >/dev/null 2>&1 && [ -d "$LIB" ]; then
    exit 0
fi
if [ "${EUID:-$(id -u)}" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "install-go-msgpack: go or its msgpack library missing and not root (or no apt-get);" \
         "the llm-d decoder test will be skipped." >&2
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
status=0
apt-get update -qq || status=$?
if [ "$status" -eq 0 ]; then
    apt-get install -y -qq --no-install-recommends golang-go golang-github-vmihailenco-msgpack.v5-dev >/dev/null \
        || status=$?
fi
if [ "$status" -ne 0 ]; then
    echo "install-go-msgpack: apt-get could not install golang-go and the msgpack library (status $status);" \
         "the llm-d decoder test will be skipped." >&2
fi
exit 0
