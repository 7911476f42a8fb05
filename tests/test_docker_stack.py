"""docker/compose.yaml, run: pagode and Prometheus from the image that users get.

On the host's loopback (tests/docker_harness.py says what changes and why), in order:
- the container's own HEALTHCHECK says healthy; the time from its start, with an empty
  kernel volume, is the cold start that docs/docker.md gives;
- its first start compiled every C++ kernel into the volume, none was left out;
- the `openai` SDK streams a chat completion, curl gets a non-streamed completion;
- Prometheus has scraped `pagode:` series (asked through its HTTP API);
- `docker compose stop` (SIGTERM) while streams are open: they run to their end, a new
  request gets a 503, and the container exits 0 before the grace period;
- `docker compose down` leaves no container of the project behind.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import openai
import pytest
from docker_harness import (
    KERNEL_DIR,
    KERNEL_VOLUME,
    Stack,
    built_images,
    in_image,
    kernel_sources,
    model_name,
    parse_time,
    record,
    run,
    single_stack,
    skip_unless_enabled,
)

from cpu_kernels import isa

pytestmark = [pytest.mark.slow, skip_unless_enabled, pytest.mark.timeout(2400)]

SHUTDOWN_TIMEOUT_S = 30.0  # compose.yaml: --shutdown-timeout 30, stop_grace_period 40s
STREAMS = 3
# The open streams should last about this long after SIGTERM: long enough that the
# drain is seen while they run, well within the shutdown timeout on a busy machine
# (three streams at once take 2-3 times what one alone predicts: sized for 4 s,
# 15 tokens drained in 9 s at a load average of 7, 367 tokens in 11 s at 3.6).
STREAM_SECONDS = 3.0


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    images = built_images()
    stack = single_stack(tmp_path_factory.mktemp("stack"), images)
    # What an interrupted run left, its kernel volume included: this start is cold.
    stack.down("--volumes")
    stack.up()
    seconds = stack.wait_healthy("pagode")
    record("cold start: container start -> healthy, empty kernel volume", seconds, "s")
    # The cold start is CPU-bound (compiling, measuring): say how busy the machine was.
    record("load average over the last minute, at healthy", os.getloadavg()[0], f"on {os.cpu_count()} CPUs")
    yield stack
    stack.down()


def client(stack: Stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.url("pagode") + "/v1", api_key="unused",
                         max_retries=0, timeout=300)


def test_first_start_compiles_the_kernels_for_this_cpu_into_the_volume(stack: Stack) -> None:
    """One library from every source of cpu_kernels/src, built at first start (not at image
    build) for the instruction-set level of the CPU the container runs on."""
    logs = stack.logs("pagode")
    assert "unavailable" not in logs, logs[-6000:]
    assert any(s.startswith("cpu_kernels/src/") for s in kernel_sources())
    level = isa.target_level(isa.detect(), None).label
    built = re.findall(rf"compiling the CPU kernels \((\w+), [^)]*\) into {KERNEL_DIR}/(\S+)", logs)
    assert [lvl for lvl, _ in built] == [level], logs[-6000:]
    libraries = in_image(stack_image(stack), f"find {KERNEL_DIR} -name '*.so' -exec basename {{}} ';'",
                         "-v", f"{KERNEL_VOLUME}:{KERNEL_DIR}")
    assert libraries.split() == [Path(built[0][1]).name]
    assert libraries.startswith(f"pagode_cpu-{level}-")


def stack_image(stack: Stack) -> str:
    image: str = stack.inspect("pagode")["Config"]["Image"]
    return image


def test_openai_sdk_streams_a_chat_completion(stack: Stack) -> None:
    model = model_name(stack.url("pagode"))
    chunks = list(client(stack).chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Name three colours."}],
        max_tokens=16, temperature=0, stream=True))
    deltas = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(deltas) > 1, "a stream arrives in pieces"
    assert "".join(deltas).strip()
    assert chunks[0].choices[0].delta.role == "assistant"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes in (["length"], ["stop"])


def test_curl_gets_a_completion(stack: Stack) -> None:
    url = stack.url("pagode")
    body = json.dumps({"model": model_name(url), "prompt": "The capital of France is",
                       "max_tokens": 8, "temperature": 0})
    out = run(["curl", "-sS", "--fail-with-body", "--max-time", "120", "-H",
               "Content-Type: application/json", "-d", body, f"{url}/v1/completions"]).stdout
    doc = json.loads(out)
    assert doc["object"] == "text_completion"
    assert doc["choices"][0]["text"].strip()
    assert doc["choices"][0]["finish_reason"] in ("length", "stop")
    assert 0 < doc["usage"]["completion_tokens"] <= 8


def prometheus_query(stack: Stack, query: str) -> list[dict[str, object]]:
    response = httpx.get(stack.url("prometheus") + "/api/v1/query", params={"query": query}, timeout=10)
    response.raise_for_status()
    result: list[dict[str, object]] = response.json()["data"]["result"]
    return result


def test_prometheus_scraped_pagode_series(stack: Stack) -> None:
    """Prometheus scrapes the pagode: series, and a scrape after the completions above
    (the ones the earlier tests made) counts their tokens: the counter is not zero."""
    deadline = time.monotonic() + 120
    names: set[str] = set()
    tokens = 0.0
    while time.monotonic() < deadline:
        try:
            up = prometheus_query(stack, 'up{job="pagode"}')
            series = prometheus_query(stack, 'count by (__name__) ({__name__=~"pagode:.+", job="pagode"})')
            total = prometheus_query(stack, 'sum(pagode:generation_tokens_total{job="pagode"})')
        except httpx.HTTPError:
            up, series, total = [], [], []
        names = {str(s["metric"]["__name__"]) for s in series}  # type: ignore[index]
        tokens = float(total[0]["value"][1]) if total else 0.0  # type: ignore[index]
        if up and up[0]["value"][1] == "1" and tokens > 0:  # type: ignore[index]
            break
        time.sleep(1)
    assert "pagode:num_requests_running" in names and "pagode:generation_tokens_total" in names, \
        f"scraped series: {sorted(names)}\n{stack.logs('prometheus')[-3000:]}"
    assert tokens > 0, "no scrape counted the completions made before"


@dataclass
class Stream:
    text: list[str] = field(default_factory=list)
    finish: str | None = None
    error: BaseException | None = None
    started: threading.Event = field(default_factory=threading.Event)


def tokens_for(stack: Stack, model: str, seconds: float) -> int:
    """How many tokens a stream takes about `seconds` to generate on this machine now."""
    start = time.monotonic()
    client(stack).completions.create(model=model, prompt="Once upon a time", max_tokens=16,
                                     extra_body={"ignore_eos": True})
    per_token = (time.monotonic() - start) / 16
    return max(4, min(512, int(seconds / per_token)))


def stream_into(stack: Stack, model: str, tokens: int, out: Stream) -> None:
    try:
        for chunk in client(stack).chat.completions.create(
                model=model, messages=[{"role": "user", "content": "Tell a long story."}],
                max_tokens=tokens, stream=True, extra_body={"ignore_eos": True}):
            if not chunk.choices:
                continue
            if chunk.choices[0].delta.content:
                out.text.append(chunk.choices[0].delta.content)
                out.started.set()
            out.finish = chunk.choices[0].finish_reason or out.finish
    except BaseException as err:  # recorded, asserted on by the test
        out.error = err
    finally:
        out.started.set()


def wait_draining(stack: Stack, timeout: float = 30) -> None:
    """Until /health says the server is shutting down (SIGTERM arrived)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            response = httpx.get(stack.url("pagode") + "/health", timeout=2)
            if response.status_code == 503 and "shutting down" in response.text:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    pytest.fail(f"the server never said it was draining:\n{stack.logs('pagode')[-3000:]}")


def test_sigterm_drains_open_streams_and_exits_zero(stack: Stack) -> None:
    url = stack.url("pagode")
    model = model_name(url)
    tokens = tokens_for(stack, model, STREAM_SECONDS)
    streams = [Stream() for _ in range(STREAMS)]
    threads = [threading.Thread(target=stream_into, args=(stack, model, tokens, s)) for s in streams]
    for thread in threads:
        thread.start()
    for s in streams:
        assert s.started.wait(300) and s.error is None, s.error
    # In flight when the signal is sent: each has streamed content and none has finished
    # (the server's own count at SIGTERM is checked in its log below).
    assert all(s.text and s.finish is None for s in streams), [(len(s.text), s.finish) for s in streams]
    container = stack.container("pagode")
    stop_started = time.time()
    stopper = threading.Thread(target=stack.compose, args=("stop", "pagode"), kwargs={"timeout": 120})
    stopper.start()
    wait_draining(stack)
    late = httpx.post(f"{url}/v1/completions", timeout=30,
                      json={"model": model, "prompt": "Too late", "max_tokens": 4})
    assert late.status_code == 503, late.text
    assert late.json()["error"]["message"] == "The server is shutting down"
    for thread in threads:
        thread.join(120)
    stopper.join(120)
    for s in streams:
        assert s.error is None, f"a stream broke during the drain: {s.error!r}"
        assert s.finish == "length", "an open stream runs to its end while the server drains"
        assert len(s.text) >= tokens // 2
    state = json.loads(run(["docker", "inspect", "-f", "{{json .State}}", container]).stdout)
    assert state["Status"] == "exited" and state["ExitCode"] == 0 and not state["OOMKilled"], state
    drain_seconds = parse_time(state["FinishedAt"]) - stop_started
    record(f"SIGTERM with {STREAMS} open streams of {tokens} tokens -> container exited",
           drain_seconds, "s")
    assert drain_seconds < SHUTDOWN_TIMEOUT_S, "the drain ends within --shutdown-timeout"
    logs = run(["docker", "logs", container], check=False)
    text = logs.stdout + logs.stderr
    assert "drained; shutting down" in text and "shutdown timeout" not in text, text[-3000:]
    assert f"draining {STREAMS} in-flight request(s)" in text, text[-3000:]


def test_down_leaves_nothing_running(stack: Stack) -> None:
    stack.down()
    assert stack.running() == [], "compose down must remove every container of the project"
    networks = run(["docker", "network", "ls", "-q", "--filter",
                    f"label=com.docker.compose.project={stack.project}"]).stdout.split()
    assert networks == []
