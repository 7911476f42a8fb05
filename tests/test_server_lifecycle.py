"""Server flags and process lifecycle end to end, on real `pagode serve` processes: what
--batching, --scheduling-policy and --sse-send-timeout change for HTTP clients, what a
second SIGTERM and a Ctrl+C (SIGINT) do to open streams and the exit status, and that a
calibration written by `pagode plan --calibrate` sizes the batch of the next `pagode serve`.

The engine-level tests hold the scheduler's rules; these hold that the flags reach it
through the CLI and that their effect survives the HTTP layer. Three small servers load
side by side (each with a 256-token context), and each signal test is the last test to use
its server, since it ends the process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_fixtures import (
    REPO_ROOT,
    ServerProcess,
    json_error,
    launch_server,
    metric_value,
    running_server,
    wait_all_healthy,
)
from tests_support import cache_sharing_builds

from engine import envs
from engine.tuning import batch_cap
from planner.step_model import StepTimeModel

pytestmark = pytest.mark.slow

MAX_MODEL_LEN = 256
# fp32 KV of SmolLM2-135M is 45 KiB a token: 28 MiB is 39 blocks of 16, two whole contexts
# of 256 (static and continuous batching reserve max_model_len positions per sequence).
WHOLE_CONTEXTS = 2
# A pinned fused-decode limit skips its measurement at load, most of a start-up on a busy
# two-core machine; these tests are about flags and signals, not the decode step's speed.
QUICK_START = ["--max-model-len", str(MAX_MODEL_LEN), "--fused-decode-limit", "8"]
# A pinned batch cap too: two servers timing their decode steps side by side on two cores
# would take half a minute and measure each other; the cache holds 2 whole contexts anyway.
BATCHING_ARGS = [*QUICK_START, "--kv-cache-memory", "28MiB", "--kv-cache-dtype", "fp32", "--max-num-seqs", "8"]
STARTUP_S = 900.0  # three servers loading side by side on two shared cores
SSE_SEND_TIMEOUT_S = 1.0
LONG_DRAIN_S = 300  # a drain this long cannot explain an exit within WAIT_S
WAIT_S = 120.0
LONG_TOKENS = 48
SHORT_TOKENS = 4


def completion(max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {"prompt": "Count:", "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}, **extra}


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, ServerProcess]]:
    log_dir = tmp_path_factory.mktemp("lifecycle-logs")
    started = {
        "static": launch_server([*BATCHING_ARGS, "--batching", "static"], log_dir, name="static"),
        "continuous": launch_server([*BATCHING_ARGS, "--batching", "continuous",
                                     "--shutdown-timeout", str(LONG_DRAIN_S)], log_dir,
                                    name="continuous"),
        "priority": launch_server([*QUICK_START, "--kv-cache-memory", "64MiB",
                                   "--scheduling-policy", "priority", "--max-num-seqs", "1",
                                   "--sse-send-timeout", str(SSE_SEND_TIMEOUT_S)], log_dir,
                                  name="priority"),
    }
    try:
        wait_all_healthy(list(started.values()), STARTUP_S)
        yield started
    finally:
        for server in started.values():
            server.stop()


@dataclass
class Stream:
    """One streamed completion read in a task: each data event with its arrival time."""

    events: list[tuple[float, str]] = field(default_factory=list)
    status: int | None = None
    cut: str | None = None  # the transport error, when the server closed before the end
    started: asyncio.Event = field(default_factory=asyncio.Event)  # first content event
    task: asyncio.Task[None] | None = None

    @property
    def done(self) -> bool:
        return bool(self.events) and self.events[-1][1] == "[DONE]"

    def chunks(self) -> list[dict[str, Any]]:
        return [json.loads(data) for _, data in self.events if data != "[DONE]"]

    def content_times(self) -> list[float]:
        return [t for t, data in self.events if data != "[DONE]" and json.loads(data)["choices"]]

    @property
    def first_token_at(self) -> float:
        return self.content_times()[0]

    @property
    def last_token_at(self) -> float:
        return self.content_times()[-1]

    def finish_reasons(self) -> list[str]:
        return [choice["finish_reason"] for chunk in self.chunks() for choice in chunk["choices"]
                if choice.get("finish_reason")]

    def completion_tokens(self) -> int:
        usage = [chunk["usage"] for chunk in self.chunks() if chunk.get("usage")]
        return int(usage[-1]["completion_tokens"])

    async def read(self, client: httpx.AsyncClient, body: dict[str, Any]) -> None:
        try:
            async with client.stream("POST", "/v1/completions", json=body) as response:
                self.status = response.status_code
                async for line in response.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    data = line[len("data: "):]
                    self.events.append((time.monotonic(), data))
                    if data != "[DONE]" and json.loads(data).get("choices"):
                        self.started.set()
        except httpx.TransportError as exc:
            self.cut = repr(exc)

    async def wait_started(self) -> None:
        assert self.task is not None
        waiter = asyncio.ensure_future(self.started.wait())
        await asyncio.wait({waiter, self.task}, timeout=WAIT_S,
                           return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        assert self.started.is_set(), f"no content event: status {self.status}, {self.events}"

    async def finish(self) -> Stream:
        assert self.task is not None
        await asyncio.wait_for(self.task, WAIT_S)
        return self


def start(client: httpx.AsyncClient, body: dict[str, Any]) -> Stream:
    stream = Stream()
    stream.task = asyncio.create_task(stream.read(client, body))
    return stream


async def metrics(client: httpx.AsyncClient) -> str:
    return (await client.get("/metrics")).text


async def wait_for_metric(client: httpx.AsyncClient, name: str, value: float) -> None:
    deadline = time.monotonic() + WAIT_S
    while metric_value(await metrics(client), name) != value:
        assert time.monotonic() < deadline, f"{name} never reached {value}"
        await asyncio.sleep(0.02)


def whole_contexts(metrics_text: str) -> int:
    """How many sequences of max_model_len positions the server's KV cache holds."""
    line = next(line for line in metrics_text.splitlines()
                if line.startswith("pagode:cache_config_info{"))
    labels = dict(item.split("=", 1) for item in line[line.index("{") + 1:line.rindex("}")]
                  .split(","))
    blocks, block_size = int(labels["num_blocks"].strip('"')), int(labels["block_size"].strip('"'))
    return blocks // -(-MAX_MODEL_LEN // block_size)


@dataclass
class BatchingRun:
    long: Stream
    short: Stream
    later: list[Stream]
    peak_running: float
    peak_waiting: float


async def run_batching_probe(server: ServerProcess) -> BatchingRun:
    """A long and a short request fill the cache's two whole-context slots (under static
    batching they queue behind a first request, so that one batch takes both); three short
    ones arrive while they run. /metrics is sampled until every stream has ended."""
    async with httpx.AsyncClient(base_url=server.base_url, timeout=WAIT_S) as client:
        assert whole_contexts(await metrics(client)) == WHOLE_CONTEXTS
        streams = []
        if server.args[server.args.index("--batching") + 1] == "static":
            first = start(client, completion(LONG_TOKENS))
            await first.wait_started()
            streams.append(first)
        long = start(client, completion(LONG_TOKENS))
        short = start(client, completion(SHORT_TOKENS))
        if streams:
            await wait_for_metric(client, "pagode:num_requests_waiting", 2)
            assert not streams[0].done, "the first request ended before the next two queued"
        await long.wait_started()
        await short.wait_started()
        later = [start(client, completion(SHORT_TOKENS)) for _ in range(3)]
        peak_running = peak_waiting = 0.0
        streams += [long, short, *later]
        deadline = time.monotonic() + WAIT_S
        while not all(s.task is not None and s.task.done() for s in streams):
            assert time.monotonic() < deadline, "streams did not end"
            text = await metrics(client)
            peak_running = max(peak_running, metric_value(text, "pagode:num_requests_running"))
            peak_waiting = max(peak_waiting, metric_value(text, "pagode:num_requests_waiting"))
            await asyncio.sleep(0.03)
        for stream in streams:
            await stream.finish()
            assert stream.done and stream.cut is None, (stream.status, stream.cut)
            assert stream.finish_reasons() == ["length"]
        assert all(s.completion_tokens() == LONG_TOKENS for s in streams[:-4])
        assert all(s.completion_tokens() == SHORT_TOKENS for s in [short, *later])
    return BatchingRun(long, short, later, peak_running, peak_waiting)


async def test_static_batching_admits_no_one_into_a_running_batch(
        servers: dict[str, ServerProcess]) -> None:
    run = await run_batching_probe(servers["static"])
    assert run.peak_running == WHOLE_CONTEXTS  # the cache's whole contexts, never more
    assert run.peak_waiting >= 1  # and more were in flight than it holds
    # The short request left the batch early, yet nobody took its place before the long
    # one, the last of its batch, had finished.
    assert run.short.last_token_at < run.long.last_token_at
    for stream in run.later:
        assert stream.first_token_at > run.long.last_token_at


async def test_continuous_batching_fills_a_freed_slot_at_once(
        servers: dict[str, ServerProcess]) -> None:
    run = await run_batching_probe(servers["continuous"])
    assert run.peak_running == WHOLE_CONTEXTS
    assert run.peak_waiting >= 1
    # The short request's slot went to a waiting one while the long request still ran.
    first_joined = min(stream.first_token_at for stream in run.later)
    assert run.short.last_token_at < first_joined < run.long.last_token_at


async def test_priority_policy_serves_a_later_urgent_request_first(
        servers: dict[str, ServerProcess]) -> None:
    # --max-num-seqs 1: one request runs, the others wait in the engine's queue, and the
    # order they leave it in is the order their first tokens reach the client.
    async with httpx.AsyncClient(base_url=servers["priority"].base_url, timeout=WAIT_S) as client:
        await wait_for_metric(client, "pagode:num_requests_waiting", 0)
        blocker = start(client, completion(MAX_MODEL_LEN - 16))
        await blocker.wait_started()
        lows = []
        for queued in (1, 2):
            lows.append(start(client, completion(4, priority=1)))
            await wait_for_metric(client, "pagode:num_requests_waiting", queued)
        urgent = start(client, completion(4, priority=0))  # lower value: served first (vLLM)
        await wait_for_metric(client, "pagode:num_requests_waiting", 3)
        assert not blocker.done, "the blocker finished before the queue had formed"
        assert blocker.task is not None
        blocker.task.cancel()  # the client leaves: its request is aborted, the slot frees
        with contextlib.suppress(asyncio.CancelledError):
            await blocker.task
        for stream in (urgent, *lows):
            await stream.finish()
            assert stream.done and stream.finish_reasons() == ["length"]
    # One at a time: the urgent request, though it came last, ran to its end before either
    # earlier low-priority request produced a token.
    assert urgent.last_token_at < min(low.first_token_at for low in lows)


def aborted(metrics_text: str) -> float:
    try:
        return metric_value(metrics_text, "pagode:request_success_total",
                            {"finished_reason": "abort"})
    except KeyError:  # no request has been aborted yet
        return 0.0


def stalled_stream_request(request_id: str) -> bytes:
    body = json.dumps({"prompt": "one two three four five six seven eight nine ten " * 15,
                       "echo": True, "max_tokens": 96, "n": 4, "logprobs": 20,
                       "temperature": 0, "ignore_eos": True, "stream": True}).encode()
    return (b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nX-Request-Id: " + request_id.encode() +
            b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


def stalled_requests(server: ServerProcess, request_id: str) -> list[str]:
    return [line for line in server.log().splitlines()
            if f"request finished id=cmpl-{request_id}-" in line]


async def test_a_client_that_stops_reading_is_cut_and_its_request_aborted(
        servers: dict[str, ServerProcess]) -> None:
    # Each choice's first event echoes a 150-token prompt with its top-20 logprobs (about
    # 80 KB), each later one is about 1 KB a token, and at --max-num-seqs 1 the four choices
    # run one after the other. The client announces a small segment size, which keeps the
    # server's socket buffer small (on loopback it would otherwise hold megabytes), and reads
    # nothing: the server's sends block within the first two choices, and only the send
    # timeout can end the request before its last choice has run.
    server = servers["priority"]
    async with httpx.AsyncClient(base_url=server.base_url, timeout=WAIT_S) as client:
        aborted_before = aborted(await metrics(client))
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, 536)
    sock.connect(("127.0.0.1", server.port))
    try:
        sock.sendall(stalled_stream_request("stalled"))
        deadline = time.monotonic() + WAIT_S
        while len(stalled_requests(server, "stalled")) < 4:
            assert time.monotonic() < deadline, stalled_requests(server, "stalled")
            await asyncio.sleep(0.1)
        # What the server had sent before the cut comes through once the client reads, then
        # the connection ends: the stream stopped where it was, with no [DONE].
        received = b""
        sock.settimeout(WAIT_S)
        with contextlib.suppress(ConnectionResetError):
            while chunk := sock.recv(1 << 16):
                received += chunk
    finally:
        sock.close()
    assert received.startswith(b"HTTP/1.1 200")
    assert b"data: " in received and b"data: [DONE]" not in received
    finished = stalled_requests(server, "stalled")
    assert any("finish_reason=abort" in line for line in finished), finished
    async with httpx.AsyncClient(base_url=server.base_url, timeout=WAIT_S) as client:
        for name in ("running", "waiting", "queued"):
            await wait_for_metric(client, f"pagode:num_requests_{name}", 0)
        assert aborted(await metrics(client)) > aborted_before
        assert (await client.get("/health")).status_code == 200
        ok = await client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2})
        assert ok.status_code == 200


async def open_in_flight(client: httpx.AsyncClient, count: int, max_tokens: int) -> list[Stream]:
    """Streams that are running: each has had a content event and none has ended."""
    streams = [start(client, completion(max_tokens)) for _ in range(count)]
    for stream in streams:
        await stream.wait_started()
    return streams


async def wait_draining(client: httpx.AsyncClient) -> None:
    deadline = time.monotonic() + WAIT_S
    while (await client.get("/health")).status_code == 200:
        assert time.monotonic() < deadline, "/health still 200 after the signal"
        await asyncio.sleep(0.02)


async def test_sigint_drains_like_sigterm(servers: dict[str, ServerProcess]) -> None:
    # Last test on the priority server: it ends the process.
    server = servers["priority"]
    async with httpx.AsyncClient(base_url=server.base_url, timeout=WAIT_S) as client:
        [stream] = await open_in_flight(client, 1, 60)
        assert not stream.done
        server.signal(signal.SIGINT)
        await wait_draining(client)
        refused = await client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2})
        assert refused.status_code == 503
        assert json_error(refused)["type"] == "ServiceUnavailableError"
        await stream.finish()
    # Within --shutdown-timeout (30 s default) the running stream ends as it would have.
    assert stream.done and stream.finish_reasons() == ["length"]
    assert stream.completion_tokens() == 60
    assert server.wait_exit() == 0
    assert "signal 2: draining 1 in-flight request(s)" in server.log()


async def test_second_sigterm_exits_without_waiting_for_the_drain(
        servers: dict[str, ServerProcess]) -> None:
    # Last test on the continuous server: it ends the process. Its --shutdown-timeout is
    # LONG_DRAIN_S: the first signal alone would let both streams run to their end.
    server = servers["continuous"]
    async with httpx.AsyncClient(base_url=server.base_url, timeout=WAIT_S) as client:
        streams = await open_in_flight(client, WHOLE_CONTEXTS, MAX_MODEL_LEN - 16)
        server.signal(signal.SIGTERM)
        await wait_draining(client)
        assert not any(stream.done for stream in streams), "a stream ended before the 2nd signal"
        second_at = time.monotonic()
        server.signal(signal.SIGTERM)
        for stream in streams:
            await stream.finish()
        status = await asyncio.to_thread(server.wait_exit, WAIT_S)
        exited_s = time.monotonic() - second_at
    assert status == 0
    assert exited_s < WAIT_S < LONG_DRAIN_S
    for stream in streams:
        # Aborted where it was, its stream closed properly, short of what it asked for.
        assert stream.done and stream.cut is None, (stream.cut, stream.events[-2:])
        assert stream.finish_reasons() == ["abort"]
        assert stream.completion_tokens() < MAX_MODEL_LEN - 16
    log = server.log()
    assert f"signal {signal.SIGTERM}: draining {WHOLE_CONTEXTS} in-flight request(s)" in log
    assert f"signal {signal.SIGTERM}: exiting without waiting further" in log


# ---- pagode plan --calibrate -> pagode serve ------------------------------------------------

# The CLI's own grid (batches up to 192 at contexts 32 and 192) takes minutes on two cores;
# the command runs as shipped but for a smaller grid with batches around the knee.
SMALL_GRID = "(1, 8, 32, 64), (32,), (64,), 2"  # batches, contexts, prefill chunks, decode steps
CALIBRATE = ("import sys; from planner.calibrate import Grid; "
             f"Grid.for_device = classmethod(lambda cls, device: cls({SMALL_GRID})); "
             "from server.cli import main; sys.exit(main(sys.argv[1:]))")


@pytest.fixture
def private_cache(tmp_path: Path) -> Path:
    """An empty pagode cache but for the compiled kernels, tokenizers and this run's kernel
    races: no step-time fit that `plan` did not write itself."""
    return cache_sharing_builds(tmp_path / "cache", envs.CACHE_DIR.get(), races=True)


def test_calibration_sizes_the_served_batch(private_cache: Path, tmp_path: Path) -> None:
    env = {**os.environ, "PAGODE_CACHE_DIR": str(private_cache)}
    plan = subprocess.run([sys.executable, "-c", CALIBRATE, "plan", "--calibrate"], cwd=REPO_ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
    assert plan.returncode == 0, plan.stdout[-2000:] + plan.stderr[-2000:]
    saved = next(line for line in plan.stdout.splitlines() if line.startswith("fit saved to "))
    path = Path(saved.removeprefix("fit saved to ").split(":")[0])
    assert path.is_relative_to(private_cache / "plan")
    expected = batch_cap.from_decode_rates(StepTimeModel.load(path).meta["decode_tok_s"], str(path), 256)
    with running_server([*QUICK_START, "--kv-cache-memory", "64MiB"],
                        tmp_path, env={"PAGODE_CACHE_DIR": str(private_cache)},
                        name="calibrated") as server:
        lines = [line for line in server.log().splitlines() if "max_num_seqs" in line]
    # The file `plan` wrote is the one `serve` read, and its cap is the one served.
    assert any(line.endswith(f"max_num_seqs {expected.max_num_seqs}: {expected.reason}")
               for line in lines), (expected, lines)
    assert str(path) in expected.reason and "no calibration" not in expected.reason
