"""`pagode serve` for the benchmarks that measure it over HTTP: the command, started on a
free loopback port through loadgen's launcher, the way a user runs the server."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from loadgen.server_process import running_command

REPO_ROOT = Path(__file__).resolve().parents[1]


def serve_command(port: int, server_args: Sequence[str]) -> list[str]:
    # `python -m server.cli` works whether or not the `pagode` script is on PATH.
    return [sys.executable, "-m", "server.cli", "serve", "--host", "127.0.0.1",
            "--port", str(port), *server_args]


@contextlib.contextmanager
def running_server(
    server_args: Sequence[str], log: Path, startup_timeout: float = 300.0,
    env: dict[str, str] | None = None,
) -> Iterator[str]:
    """A healthy `pagode serve` for the duration of the block; yields its base URL."""
    with running_command(lambda port: serve_command(port, server_args), log, startup_timeout,
                         env=env, cwd=REPO_ROOT) as url:
        yield url
