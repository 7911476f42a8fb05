#!/usr/bin/env bash
# make test-docker: build pagode's image and run its compose stacks for real
# (tests/test_docker_*.py). Around the tests this script
#   - installs Debian's Docker engine (docker.io) and docker-compose when missing,
#   - starts dockerd when none answers, and stops the one it started,
#   - builds the local Debian base image, or reuses it (scripts/docker-base-image.sh).
# It fails loudly when the engine cannot run here: it never skips.
# Extra arguments go to pytest, e.g. `make test-docker ARGS=-x`.
set -euo pipefail
cd "$(dirname "$0")/.."

started_at=$(date +%s)
PY="${PY:-.venv/bin/python}"
report="$(mktemp /tmp/pagode-docker-report.XXXXXX.json)"
dockerd_pid=""
dockerd_log=""

fail() { echo "test-docker: $*" >&2; exit 1; }

as_root() { [ "${EUID:-$(id -u)}" -eq 0 ]; }

install_engine() {
    command -v dockerd >/dev/null 2>&1 && command -v docker >/dev/null 2>&1 && return 0
    as_root || fail "no Docker engine (dockerd) and installing one needs root"
    command -v apt-get >/dev/null 2>&1 || fail "no Docker engine and no apt-get to install one"
    echo "test-docker: installing Debian's docker.io"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker.io >/dev/null \
        || fail "apt-get could not install docker.io"
}

install_compose() {
    bash scripts/install-deploy-tools.sh
    command -v docker-compose >/dev/null 2>&1 || docker compose version >/dev/null 2>&1 \
        || fail "neither docker-compose nor the docker compose plugin is installed"
}

stop_dockerd() {
    [ -n "$dockerd_pid" ] || return 0
    echo "test-docker: stopping the dockerd it started (pid $dockerd_pid)"
    kill -TERM "$dockerd_pid" 2>/dev/null || true
    for _ in $(seq 1 60); do
        kill -0 "$dockerd_pid" 2>/dev/null || break
        sleep 0.5
    done
    if kill -0 "$dockerd_pid" 2>/dev/null; then
        echo "test-docker: dockerd $dockerd_pid did not stop within 30 s" >&2
    fi
    rm -f "$dockerd_log"
}

start_dockerd() {
    if docker info >/dev/null 2>&1; then
        echo "test-docker: using the Docker engine that is already running"
        return 0
    fi
    as_root || fail "no Docker engine answers and starting dockerd needs root"
    dockerd_log="$(mktemp /tmp/pagode-dockerd.XXXXXX.log)"
    echo "test-docker: starting dockerd (log: $dockerd_log)"
    dockerd >"$dockerd_log" 2>&1 &
    dockerd_pid=$!
    for _ in $(seq 1 120); do
        docker info >/dev/null 2>&1 && return 0
        kill -0 "$dockerd_pid" 2>/dev/null || break
        sleep 0.5
    done
    tail -30 "$dockerd_log" >&2 || true
    fail "dockerd did not come up (see its log above): the Docker tests cannot run on this machine"
}

cleanup() {
    status=$?
    stop_dockerd
    if [ -s "$report" ]; then
        echo "test-docker: measurements:"
        cat "$report"
    fi
    rm -f "$report"
    echo "test-docker: $([ $status -eq 0 ] && echo passed || echo FAILED) in $(( $(date +%s) - started_at )) s"
    exit $status
}
trap cleanup EXIT

install_engine
install_compose
start_dockerd
base_start=$(date +%s)
bash scripts/docker-base-image.sh pagode-base:bookworm
base_seconds=$(( $(date +%s) - base_start ))
echo "test-docker: base image ready after $base_seconds s"
printf '{"name": "base image ready (debootstrap + import, or reused)", "value": %d, "unit": "s"}\n' \
    "$base_seconds" >>"$report"

DOCKER_TESTS=1 DOCKER_TEST_REPORT="$report" DOCKER_BASE_IMAGE=pagode-base:bookworm \
    "$PY" -m pytest -q -ra -p no:cacheprovider tests/test_docker_image.py \
    tests/test_docker_stack.py tests/test_docker_replicas.py "$@"
