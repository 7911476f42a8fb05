"""The real coding-agent CLIs against a pagode on loopback: Claude Code (`claude -p`, on
/v1/messages) and Codex CLI (`codex exec`, on /v1/responses), installed from npm by
scripts/install-agent-clis.sh. Every request a CLI sends is read back from the server's
access log and none may get a 4xx or 5xx; the text the CLI prints must be the text the
server generated (the request log, --log-requests-text). The server requires an API key,
which Claude Code sends as `x-api-key` and Codex as a Bearer token.

The 135M default model does not end its turn within the small output budget these tests
give it (kept small for CI time), so both CLIs end with their own "output limit" message:
the model's quality is not what is proved here, the protocol is.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from server_fixtures import ServerProcess, running_server

from engine import envs

pytestmark = pytest.mark.slow

API_KEY = "test-agent-key"
CLI_BIN = envs.CACHE_DIR.get() / "agent-clis" / "node_modules" / ".bin"
# Room for Codex's prompt with its tools (about 2k tokens); agents send no output limit,
# or their model's whole budget, which the server cuts to fit.
ARGS = ["--kv-cache-memory", "256MiB", "--max-model-len", "4096", "--api-key", API_KEY,
        "--default-max-tokens", "12", "--log-requests-text"]
ACCESS = re.compile(r'uvicorn\.access: \S+ - "(\w+) (\S+) HTTP/[\d.]+" (\d{3})')
FINISHED = re.compile(r"request finished id=(\S+)-0 .* output=(.*)$")
CLI_TIMEOUT_S = 240


def cli(name: str) -> Path:
    path = CLI_BIN / name
    if not path.exists():
        pytest.skip(f"{name} is not installed (scripts/install-agent-clis.sh)")
    return path


@pytest.fixture(scope="module")
def agent_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with running_server(ARGS, tmp_path_factory.mktemp("agent-server"), name="agents") as proc:
        yield proc


@pytest.fixture(scope="module")
def model(agent_server: ServerProcess) -> str:
    models = httpx.get(f"{agent_server.api_url}/models",
                       headers={"Authorization": f"Bearer {API_KEY}"}).json()
    return str(models["data"][0]["id"])


def requests_since(server: ServerProcess, offset: int) -> list[tuple[str, str, int]]:
    """(method, path, status) of every request the server answered after `offset`."""
    return [(m[1], m[2], int(m[3])) for m in ACCESS.finditer(server.log()[offset:])]


def generated_since(server: ServerProcess, offset: int) -> dict[str, str]:
    """Request id -> the text the server generated for it, from the request log."""
    found = {}
    for line in server.log()[offset:].splitlines():
        match = FINISHED.search(line)
        if match:
            found[match[1]] = ast.literal_eval(match[2])
    return found


def run_cli(command: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    full_env = {"PATH": os.environ["PATH"], "HOME": str(cwd), **env}
    return subprocess.run(command, env=full_env, cwd=cwd, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=CLI_TIMEOUT_S, check=False)


def assert_all_answered(requests: list[tuple[str, str, int]], path: str) -> None:
    assert any(p.startswith(path) for _, p, _ in requests), requests
    failed = [r for r in requests if r[2] >= 400]
    assert not failed, failed


def test_claude_code_finishes_a_turn(agent_server: ServerProcess, model: str,
                                     tmp_path: Path) -> None:
    claude = cli("claude")
    offset = len(agent_server.log())
    env = {"ANTHROPIC_BASE_URL": agent_server.base_url, "ANTHROPIC_API_KEY": API_KEY,
           "ANTHROPIC_MODEL": model, "ANTHROPIC_DEFAULT_OPUS_MODEL": model,
           "ANTHROPIC_DEFAULT_SONNET_MODEL": model, "ANTHROPIC_DEFAULT_HAIKU_MODEL": model,
           "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1",
           "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "8"}
    done = run_cli([str(claude), "-p", "Say hello.", "--output-format", "stream-json",
                    "--verbose", "--tools", "", "--system-prompt", "Be brief."], env, tmp_path)
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert events and events[-1]["type"] == "result", done.stdout[-2000:] + done.stderr[-2000:]
    assert_all_answered(requests_since(agent_server, offset), "/v1/messages")
    generated = generated_since(agent_server, offset)
    printed = [event["message"] for event in events if event["type"] == "assistant"
               and event["message"]["id"].startswith("msg_")]
    assert printed, events
    for message in printed:
        text = "".join(block["text"] for block in message["content"] if block["type"] == "text")
        assert text == generated["msg-" + message["id"].removeprefix("msg_")]


def test_codex_finishes_a_turn(agent_server: ServerProcess, model: str, tmp_path: Path) -> None:
    codex = cli("codex")
    home = tmp_path / "codex-home"
    home.mkdir()
    (home / "instructions.md").write_text("You are a coding agent. Answer briefly.\n")
    (home / "config.toml").write_text(
        f'model = "{model}"\nmodel_provider = "pagode"\n'
        f'model_instructions_file = "{home / "instructions.md"}"\n'
        f'web_search = "disabled"\n[features]\nmulti_agent = false\ngoals = false\n'
        f'[model_providers.pagode]\nname = "pagode"\nbase_url = "{agent_server.api_url}"\n'
        f'env_key = "PAGODE_TEST_KEY"\nwire_api = "responses"\n')
    offset = len(agent_server.log())
    done = run_cli([str(codex), "exec", "--skip-git-repo-check", "--json", "Say hello."],
                   {"CODEX_HOME": str(home), "PAGODE_TEST_KEY": API_KEY}, tmp_path)
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    kinds = [event["type"] for event in events]
    assert "turn.started" in kinds, done.stdout[-2000:] + done.stderr[-2000:]
    assert_all_answered(requests_since(agent_server, offset), "/v1/responses")
    generated = set(generated_since(agent_server, offset).values())
    printed = [event["item"]["text"] for event in events if event["type"] == "item.completed"
               and event["item"]["type"] == "agent_message"]
    assert printed and all(text in generated for text in printed), (printed, generated)
    ended = events[-1]
    assert ended["type"] == "turn.completed" or "max_output_tokens" in json.dumps(ended), ended
