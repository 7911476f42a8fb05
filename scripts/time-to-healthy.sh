#!/usr/bin/env bash
# Seconds from `pagode serve` to a 200 on /health, then the server is stopped (a stop waits
# for a pack of the weights being written). Usage:
#   scripts/time-to-healthy.sh CACHE_DIR PORT MODEL [serve args...]
# An empty CACHE_DIR gives a first start; with the compiled kernels copied in
# (cp -r ~/.cache/pagode/kernels CACHE_DIR/), a first start that compiles nothing.
# Run it again on the same CACHE_DIR for a warm start. The server's log: CACHE_DIR/serve-PORT.log.
set -euo pipefail
cd "$(dirname "$0")/.."
cache=$1 port=$2 model=$3
shift 3
mkdir -p "$cache"
PAGODE_CACHE_DIR=$cache .venv/bin/pagode serve --model "$model" --port "$port" "$@" > "$cache/serve-$port.log" 2>&1 &
pid=$!
start=$(date +%s.%N)
until curl -s -o /dev/null -w "%{http_code}" "localhost:$port/health" 2>/dev/null | grep -q 200; do
  kill -0 "$pid" 2>/dev/null || { echo "the server exited before it was healthy: $cache/serve-$port.log"; exit 1; }
  sleep 0.2
done
end=$(date +%s.%N)
echo "healthy after $(echo "$end - $start" | bc) s"
kill "$pid"
wait "$pid" 2>/dev/null || true
