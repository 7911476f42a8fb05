"""Starting and stopping a `pagode serve` subprocess on a free loopback port.

Only the experiment uses this; it runs the server as a separate program, so loadgen
still imports nothing of the server or the engine.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import httpx

REPO_ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def serve_command(port: int, server_args: Sequence[str]) -> list[str]:
    # `python -m server.cli` works whether or not the `pagode` script is on PATH.
    return [sys.executable, "-m", "server.cli", "serve", "--host", "127.0.0.1",
            "--port", str(port), *server_args]


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def wait_healthy(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    """Poll /health until it answers 200; fail early if the server exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before it was healthy:\n{tail(log)}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/health", timeout=2.0).status_code == 200:
                return
        time.sleep(0.5)
    raise TimeoutError(f"server not healthy after {timeout:.0f} s:\n{tail(log)}")


def stop(proc: subprocess.Popen[bytes], grace: float = 60.0) -> int:
    """SIGTERM (the server drains), then SIGKILL if it does not exit within `grace`."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return int(proc.returncode)


@contextlib.contextmanager
def running_server(
    server_args: Sequence[str], log: Path, startup_timeout: float = 300.0
) -> Iterator[str]:
    """A healthy `pagode serve` for the duration of the block; yields its base URL."""
    with running_command(lambda port: serve_command(port, server_args), log, startup_timeout) as url:
        yield url


@contextlib.contextmanager
def running_command(
    command_for: Callable[[int], list[str]], log: Path, startup_timeout: float = 300.0,
    env: dict[str, str] | None = None,
) -> Iterator[str]:
    """Any OpenAI-compatible server, started by `command_for(free port)` on the loopback and
    healthy (/health 200) for the duration of the block; yields its base URL."""
    port = free_port()
    log.parent.mkdir(parents=True, exist_ok=True)
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    with log.open("wb") as out:
        proc = subprocess.Popen(command_for(port), cwd=REPO_ROOT, stdout=out,
                                stderr=subprocess.STDOUT, env=full_env)
        try:
            url = f"http://127.0.0.1:{port}"
            wait_healthy(url, proc, log, startup_timeout)
            yield url
        finally:
            stop(proc)
