"""Any server under test as a subprocess on a free loopback port: started from the command a
caller builds for that port, healthy for the duration of a block, then stopped.

The server is a separate program (pagode, vLLM, llama-server, Prometheus...), so loadgen
stays a client that imports none of it; the caller knows how to start it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def wait_healthy(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float,
                 health_path: str = "/health") -> None:
    """Poll `health_path` until it answers 200; fail early if the server exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before it was healthy:\n{tail(log)}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + health_path, timeout=2.0).status_code == 200:
                return
        time.sleep(0.5)
    raise TimeoutError(f"server not healthy after {timeout:.0f} s:\n{tail(log)}")


def stop(proc: subprocess.Popen[bytes], grace: float = 60.0) -> int:
    """SIGTERM (a server drains), then SIGKILL if it does not exit within `grace`."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return int(proc.returncode)


@contextlib.contextmanager
def running_command(
    command_for: Callable[[int], list[str]], log: Path, startup_timeout: float = 300.0,
    env: dict[str, str] | None = None, cwd: Path | None = None, health_path: str = "/health",
    grace: float = 60.0,
) -> Iterator[str]:
    """The server `command_for(free port)` starts, on the loopback and healthy (`health_path`
    answers 200) for the duration of the block; yields its base URL. Its output goes to `log`."""
    port = free_port()
    log.parent.mkdir(parents=True, exist_ok=True)
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    with log.open("wb") as out:
        proc = subprocess.Popen(command_for(port), cwd=cwd, stdout=out,
                                stderr=subprocess.STDOUT, env=full_env)
        try:
            url = f"http://127.0.0.1:{port}"
            wait_healthy(url, proc, log, startup_timeout, health_path)
            yield url
        finally:
            stop(proc, grace)
