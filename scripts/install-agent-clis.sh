#!/usr/bin/env bash
# Install the coding-agent CLIs that tests/test_agent_clis.py drives against a pagode on
# loopback (Claude Code and Codex CLI, pinned), from npm into the pagode cache
# (${PAGODE_CACHE_DIR:-~/.cache/pagode}/agent-clis). Idempotent; never fails the build:
# without npm, or offline, it prints a notice and exits 0, and those tests skip.
set -uo pipefail

CLAUDE_CODE="@anthropic-ai/claude-code@2.1.197"
CODEX="@openai/codex@0.171.0"
DIR="${PAGODE_CACHE_DIR:-$HOME/.cache/pagode}/agent-clis"
STAMP="$DIR/.installed-claude-code-2.1.197-codex-0.171.0"

if [ -e "$STAMP" ]; then
    exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
    echo "install-agent-clis: npm missing; the Claude Code and Codex CLI tests will be skipped." >&2
    exit 0
fi
mkdir -p "$DIR"
# The packages' platform binaries come as optional dependencies, so no install script runs.
if npm install --prefix "$DIR" --no-audit --no-fund --loglevel=error "$CLAUDE_CODE" "$CODEX" >/dev/null \
        && "$DIR/node_modules/.bin/claude" --version >/dev/null 2>&1 \
        && "$DIR/node_modules/.bin/codex" --version >/dev/null 2>&1; then
    touch "$STAMP"
else
    echo "install-agent-clis: npm could not install $CLAUDE_CODE and $CODEX;" \
         "the Claude Code and Codex CLI tests will be skipped." >&2
fi
exit 0
