"""The real server, started as a subprocess on a free loopback port, for the server tests.

`server` is session-scoped: one server (and one model load) for every test that can share
it. Tests that need special flags (an API key, a tiny queue bound, SIGTERM, a dead engine
loop) start their own small server with `running_server(...)`.

Register with `pytest_plugins = ["server_fixtures"]` in tests/conftest.py (tests/ is on
sys.path there), or run `PYTHONPATH=tests pytest -p server_fixtures tests/test_server*.py`.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from loadgen.server_process import free_port, stop

REPO_ROOT = Path(__file__).resolve().parents[1]
# The shipped defaults (auto weights, fp16 KV): what the HTTP tests hold is what users run.
# A test that needs token-for-token equality across batches starts its own server with
# EXACT_ARGS, since the quantized kernels (few tokens) and the GEMMs (many) round apart.
SESSION_ARGS = ["--kv-cache-memory", "512MiB", "--max-model-len", "1024"]
SMALL_ARGS = ["--kv-cache-memory", "128MiB", "--max-model-len", "512"]
EXACT_ARGS = ["--quantization", "none"]
STARTUP_TIMEOUT_S = 300.0  # model loading on a busy 2-core CI machine
STOP_TIMEOUT_S = 60.0


@dataclass
class ServerProcess:
    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path
    args: list[str] = field(default_factory=list)
    health_statuses: list[int] = field(default_factory=list)  # what /health said at startup

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def api_url(self) -> str:
        return f"{self.base_url}/v1"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def log_tail(self, chars: int = 4000) -> str:
        return self.log()[-chars:]

    def is_healthy(self) -> bool:
        """Poll /health once; raise if the process died."""
        if self.proc.poll() is not None:
            raise RuntimeError(f"server exited with {self.proc.returncode} during startup:"
                               f"\n{self.log_tail()}")
        with contextlib.suppress(httpx.HTTPError):
            status = httpx.get(f"{self.base_url}/health", timeout=2.0).status_code
            self.health_statuses.append(status)
            return status == 200
        return False

    def wait_healthy(self, timeout: float = STARTUP_TIMEOUT_S) -> None:
        wait_all_healthy([self], timeout)

    def signal(self, sig: int = signal.SIGTERM) -> None:
        self.proc.send_signal(sig)

    def wait_exit(self, timeout: float = STOP_TIMEOUT_S) -> int:
        return self.proc.wait(timeout=timeout)

    def stop(self) -> None:
        stop(self.proc, grace=STOP_TIMEOUT_S)


def wait_all_healthy(servers: list[ServerProcess], timeout: float = STARTUP_TIMEOUT_S) -> None:
    """Wait for servers loading side by side, polling each in turn."""
    deadline = time.monotonic() + timeout
    pending = list(servers)
    while pending:
        pending = [s for s in pending if not s.is_healthy()]
        if pending and time.monotonic() > deadline:
            raise TimeoutError(f"server not healthy after {timeout}s:\n{pending[0].log_tail()}")
        time.sleep(0.25)


def serve_command(port: int, args: list[str]) -> list[str]:
    """`pagode serve` on the loopback at `port`; `python -m server.cli` needs no script on PATH."""
    return [sys.executable, "-m", "server.cli", "serve", "--host", "127.0.0.1", "--port", str(port), *args]


def launch_server(args: list[str], log_dir: Path, env: dict[str, str] | None = None,
                  name: str = "server") -> ServerProcess:
    """Start `python -m server.cli serve` on a free port; do not wait for it."""
    port = free_port()
    log_path = log_dir / f"{name}-{port}.log"
    command = serve_command(port, args)
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(command, cwd=REPO_ROOT, env=full_env, stdout=log_file,
                                stderr=subprocess.STDOUT)
    return ServerProcess(proc, port, log_path, command)


@contextlib.contextmanager
def running_server(args: list[str], log_dir: Path, env: dict[str, str] | None = None,
                   name: str = "server") -> Iterator[ServerProcess]:
    server = launch_server(args, log_dir, env, name)
    try:
        server.wait_healthy()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The shared server: default model, 512MiB of KV cache, max_model_len 1024."""
    log_dir = tmp_path_factory.mktemp("server-logs")
    with running_server(SESSION_ARGS, log_dir, name="session") as proc:
        yield proc


@pytest.fixture
async def http(server: ServerProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60.0) as client:
        yield client


def served_batch_cap(server: ServerProcess) -> int:
    """The max_num_seqs a running server chose, as its start-up log states it."""
    found = re.findall(r"max_num_seqs (\d+): ", server.log())
    assert found, server.log()[-3000:]
    return int(found[-1])


def metric_value(text: str, name: str, labels: dict[str, str] | None = None) -> float:
    """The value of one Prometheus sample (all given labels must match)."""
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        series, _, value = line.rpartition(" ")
        metric, _, label_text = series.partition("{")
        if metric != name:
            continue
        if all(f'{k}="{v}"' in label_text for k, v in (labels or {}).items()):
            return float(value)
    raise KeyError(f"{name} {labels or ''} not in metrics")


def json_error(response: httpx.Response) -> dict[str, Any]:
    """The OpenAI error body, checked for shape."""
    body = response.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert error["code"] == response.status_code
    assert isinstance(error["message"], str) and error["message"]
    return dict(error)
