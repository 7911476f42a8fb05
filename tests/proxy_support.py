"""What the tests of proxies before pagode replicas share (nginx, vllm-router): processes on
loopback ports, SSE streams read network read by network read, and per-replica counters.

A proxy must pass each streamed token on as it comes: `stream` notes which network read
delivered each SSE event, so a test can tell a flowing stream from one buffered to the end.

The two pinned replicas behind the proxies are the session's `pinned_pair` (registered as a
plugin in tests/conftest.py): the nginx and vllm-router modules ask for the same replicas,
and one model load shared is two loads side by side saved.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_fixtures import serve_command

from loadgen.server_process import free_port, stop

ROOT = Path(__file__).resolve().parents[1]
REPLICA_ARGS = ["--kv-cache-memory", "256MiB", "--max-model-len", "512"]
# Replicas that start side by side on the same cores would time each other's kernel
# crossover and batch-size measurements (minutes on a busy machine, past the startup
# timeout): these pin them, as the Docker replica tests pin the crossovers
# (tests/docker_harness.py).
PINNED_REPLICA_ARGS = [*REPLICA_ARGS, "--fused-decode-limit", "16", "--max-num-seqs", "16"]
PINNED_REPLICA_ENV = {"PAGODE_QUANT_CROSSOVER": "8", "PAGODE_QUANT_TILES": "8"}
STARTUP_TIMEOUT_S = 300.0  # as tests/server_fixtures.py: two models loading on a busy 2-core machine


# --- processes ----------------------------------------------------------------------


@dataclass
class Process:
    proc: subprocess.Popen[bytes]
    url: str
    log: Path

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""

    def stop(self) -> None:
        stop(self.proc, grace=20)


def spawn(argv: list[str], url: str, log: Path, env: dict[str, str] | None = None) -> Process:
    with open(log, "wb") as out:  # the child keeps its own descriptor
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, **env} if env else None)
    return Process(proc, url, log)


def wait_ok(process: Process, path: str) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.proc.poll() is not None:
            pytest.fail(f"{process.url} exited with {process.proc.returncode}:\n{process.tail()}")
        try:
            if httpx.get(process.url + path, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    pytest.fail(f"{process.url}{path} not ready after {STARTUP_TIMEOUT_S} s:\n{process.tail()}")


@dataclass
class PinnedPair:
    """Two replicas with PINNED_REPLICA_ARGS, started on first use and shared by the modules
    that put a proxy before them. A test may kill one (the nginx failover test does): the
    next module's `ready` starts a new one in its place."""

    log_dir: Path
    replicas: list[Process] = field(default_factory=list)

    def ready(self) -> list[Process]:
        """Both replicas, healthy; any that has exited is replaced on a new port."""
        for i in range(2):
            if i < len(self.replicas) and self.replicas[i].proc.poll() is None:
                continue
            port = free_port()
            replica = spawn(serve_command(port, PINNED_REPLICA_ARGS), f"http://127.0.0.1:{port}",
                            self.log_dir / f"replica{i}-{port}.log", PINNED_REPLICA_ENV)
            if i < len(self.replicas):
                self.replicas[i] = replica
            else:
                self.replicas.append(replica)
        for replica in self.replicas:
            wait_ok(replica, "/health")
        return list(self.replicas)

    def stop(self) -> None:
        for replica in self.replicas:
            replica.stop()
        self.replicas.clear()


def later_modules_use(request: pytest.FixtureRequest, fixture: str) -> bool:
    """Whether a test after this module in the run asks for `fixture`: if none does, a
    module fixture may stop a shared process now rather than hold it to the session's end."""
    items = request.session.items
    mine = [i for i, item in enumerate(items) if getattr(item, "module", None) is request.module]
    return any(fixture in getattr(item, "fixturenames", ()) for item in items[max(mine, default=-1) + 1:])


@pytest.fixture(scope="session")
def pinned_pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PinnedPair]:
    """The shared pair, not yet started: a module fixture calls `ready()`, and `stop()` once
    `later_modules_use` says no later module needs it."""
    pair = PinnedPair(tmp_path_factory.mktemp("pinned-replicas"))
    try:
        yield pair
    finally:
        pair.stop()


# --- streams through a proxy -------------------------------------------------------


@dataclass
class Stream:
    events: list[dict[str, Any]] = field(default_factory=list)
    read_of_event: list[int] = field(default_factory=list)  # which network read carried it
    done: bool = False
    first_content: threading.Event = field(default_factory=threading.Event)
    error: str | None = None

    @property
    def text(self) -> str:
        return "".join(c.get("text", "") for e in self.events for c in e.get("choices", []))

    @property
    def content_reads(self) -> list[int]:
        return [r for e, r in zip(self.events, self.read_of_event, strict=True)
                if any(c.get("text") for c in e.get("choices", []))]

    @property
    def finish_reason(self) -> str | None:
        reasons = [c.get("finish_reason") for e in self.events for c in e.get("choices", [])]
        return next((r for r in reversed(reasons) if r), None)

    @property
    def ok(self) -> bool:
        return self.error is None and self.done and self.finish_reason in ("stop", "length")


def completion_body(model: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    return {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}


def stream(url: str, body: dict[str, Any], into: Stream | None = None) -> Stream:
    """POST a streamed completion, noting which network read delivered each SSE event."""
    result = into or Stream()
    buffer = b""
    try:
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as resp:
            if resp.status_code != 200:
                result.error = f"HTTP {resp.status_code}: {resp.read()[:300]!r}"
                return result
            for read_index, chunk in enumerate(resp.iter_raw()):
                buffer += chunk
                while b"\n\n" in buffer:
                    raw, buffer = buffer.split(b"\n\n", 1)
                    parse_event(raw.decode(), read_index, result)
    except httpx.HTTPError as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    return result


def parse_event(raw: str, read_index: int, result: Stream) -> None:
    data = "".join(line[5:].strip() for line in raw.splitlines() if line.startswith("data:"))
    if data == "[DONE]":
        result.done = True
    elif data:
        event = json.loads(data)
        if "error" in event:
            result.error = str(event["error"])
        result.events.append(event)
        result.read_of_event.append(read_index)
        if any(c.get("text") for c in event.get("choices", [])):
            result.first_content.set()


# --- per-replica counters -----------------------------------------------------------


def counter_sum(url: str, name: str) -> float:
    """A pagode series summed over its labels, from the replica's /metrics."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(float(v) for v in re.findall(rf"^pagode:{name}(?:\{{[^}}]*\}})? (\S+)$", text, re.M))


def success_count(replica: Process) -> float:
    return counter_sum(replica.url, "request_success_total")


# --- vllm-router ---------------------------------------------------------------------


def with_flag(argv: list[str], flag: str, *values: str) -> list[str]:
    """`argv` with `flag`'s values (those up to the next flag) replaced, or the flag added."""
    if flag not in argv:
        return [*argv, flag, *values]
    at = argv.index(flag)
    end = next((i for i in range(at + 1, len(argv)) if argv[i].startswith("--")), len(argv))
    return [*argv[:at + 1], *values, *argv[end:]]


def router_args(command: list[str], port: int, metrics_port: int, workers: list[str],
                policy: str | None = None) -> list[str]:
    """A shipped router command on 127.0.0.1 (its API and metrics ports moved), over these
    workers; with `policy`, another policy on the same flags (a baseline to compare with)."""
    argv = [str(a) for a in command]
    for flag, values in (("--host", ["127.0.0.1"]), ("--port", [str(port)]),
                         ("--prometheus-host", ["127.0.0.1"]),
                         ("--prometheus-port", [str(metrics_port)]), ("--worker-urls", workers),
                         *((("--policy", [policy]),) if policy else ())):
        argv = with_flag(argv, flag, *values)
    return argv
