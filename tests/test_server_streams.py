"""Many streams at once: concurrent greedy streams stay correct, and streams cut by their
clients are aborted and give their KV blocks back."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from server_fixtures import EXACT_ARGS, SESSION_ARGS, ServerProcess, metric_value, running_server, served_batch_cap

pytestmark = pytest.mark.slow

TOPICS = ["the sea", "a fox", "Mars", "bread", "a violin", "winter", "a lighthouse", "tea",
          "chess", "a bridge", "rain", "the moon"]
STYLES = ["Write one sentence about", "Tell me a fact about", "Describe", "A poem about"]
SETTLE_TIMEOUT_S = 60.0


def stream_prompt(i: int) -> str:
    return f"{STYLES[i % len(STYLES)]} {TOPICS[i % len(TOPICS)]} (#{i}):"


async def metrics(http: httpx.AsyncClient) -> str:
    response = await http.get("/metrics")
    assert response.status_code == 200
    return response.text


async def wait_until_idle(http: httpx.AsyncClient) -> str:
    """Poll /metrics until no request runs or waits and the KV cache is empty."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while True:
        text = await metrics(http)
        busy = (metric_value(text, "pagode:num_requests_running")
                + metric_value(text, "pagode:num_requests_waiting")
                + metric_value(text, "pagode:kv_cache_usage_perc"))
        if busy == 0 or time.monotonic() > deadline:
            return text
        await asyncio.sleep(0.1)


async def stream_text(http: httpx.AsyncClient, body: dict[str, Any]) -> tuple[str, str]:
    """Stream a completion; return its text and finish reason."""
    text, finish, _ = await stream_tokens(http, body)
    return text, finish


async def stream_tokens(http: httpx.AsyncClient, body: dict[str, Any]
                        ) -> tuple[str, str, list[tuple[str, dict[str, float]]]]:
    """Stream a completion; return its text, finish reason and, when the body asks for
    logprobs, each token with its top logprobs."""
    text, finish, tokens = [], None, []
    async with http.stream("POST", "/v1/completions", json={**body, "stream": True}) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: "):])
            assert "error" not in chunk, chunk
            choice = chunk["choices"][0]
            text.append(choice["text"])
            finish = choice["finish_reason"] or finish
            if choice.get("logprobs"):
                tokens += zip(choice["logprobs"]["tokens"], choice["logprobs"]["top_logprobs"],
                              strict=True)
    assert finish is not None
    return "".join(text), finish, tokens


# fp32 GEMMs of a batch and of one row sum in different orders (the BLAS blocks by M), so
# two greedy runs may part where the two best tokens are this close; anywhere else is a bug.
NEAR_TIE_NATS = 0.02
MAX_NEAR_TIE_PARTINGS = 6  # of 64 streams
# The int4 weights' rounding moves a logprob by up to a few tenths of a nat (the quality
# gate in test_quantization bounds what that does to the text). How many streams part then
# depends on which GEMM won the load-time race, so only where they part is held.
QUANTIZED_NEAR_TIE_NATS = 0.5
QUANTIZED_MAX_NEAR_TIE_PARTINGS = 64


def parting(batched: list[tuple[str, dict[str, float]]],
            alone: list[tuple[str, dict[str, float]]]) -> int | None:
    """The first position where two greedy token sequences differ, or None."""
    for i, ((a, _), (b, _)) in enumerate(zip(batched, alone, strict=False)):
        if a != b:
            return i
    return None if len(batched) == len(alone) else min(len(batched), len(alone))


@pytest.fixture(scope="module")
def exact_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """fp32 weights: whether a stream's tokens depend on its batch is a question for the
    scheduler, the cache and the attention, and the quantized kernels' rounding would hide
    the answer."""
    # A batch cap given: timing fp32 decode steps at start to size one is no part of the question.
    with running_server([*SESSION_ARGS, *EXACT_ARGS, "--max-num-seqs", "64"], tmp_path_factory.mktemp("exact-logs"),
                        name="exact") as proc:
        yield proc


@pytest.fixture
async def exact_http(exact_server: ServerProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=exact_server.base_url, timeout=60.0) as client:
        yield client


async def test_64_concurrent_greedy_streams_match_solo(exact_server: ServerProcess,
                                                       exact_http: httpx.AsyncClient) -> None:
    await check_batched_streams_match_solo(exact_http, served_batch_cap(exact_server), NEAR_TIE_NATS,
                                           MAX_NEAR_TIE_PARTINGS)


async def test_64_concurrent_greedy_streams_match_solo_with_the_shipped_weights(
        server: ServerProcess, http: httpx.AsyncClient) -> None:
    """The int4 weights round differently at one token (the block kernel) and in a batch
    (the raced GEMM), so near ties may fall either way; a scheduling or cache bug still
    shows as a parting between tokens far apart."""
    await check_batched_streams_match_solo(http, served_batch_cap(server), QUANTIZED_NEAR_TIE_NATS,
                                           QUANTIZED_MAX_NEAR_TIE_PARTINGS)


async def check_batched_streams_match_solo(http: httpx.AsyncClient, cap: int, near_tie: float,
                                           max_partings: int) -> None:
    """64 greedy streams at once against each alone. `cap` is the server's max_num_seqs, which
    pagode serve sizes from this machine's decode steps (>= 16): the batch fills to it, never past."""
    bodies = [{"prompt": stream_prompt(i), "max_tokens": 4 + i % 9, "temperature": 0,
               "logprobs": 5} for i in range(64)]
    limits = httpx.Limits(max_connections=100)
    peak = 0.0

    async def watch_running() -> None:
        nonlocal peak
        while True:
            running = metric_value(await metrics(http), "pagode:num_requests_running")
            peak = max(peak, running)
            await asyncio.sleep(0.05)

    watcher = asyncio.create_task(watch_running())
    try:
        async with httpx.AsyncClient(base_url=str(http.base_url), timeout=300.0,
                                     limits=limits) as wide:
            together = await asyncio.gather(*(stream_tokens(wide, b) for b in bodies))
    finally:
        watcher.cancel()
    assert min(32, cap) <= peak <= cap, (peak, cap)  # they really ran together, in one capped batch
    partings = []
    for body, (streamed, finish, batched) in zip(bodies, together, strict=True):
        alone_text, alone_finish, alone = await stream_tokens(http, body)
        at = parting(batched, alone)
        if at is None:
            assert streamed == alone_text, body
            assert finish == alone_finish, body
            continue
        if at < min(len(batched), len(alone)):
            # They may part only at a near tie between two of the top-5 tokens, seen from both runs.
            token, top_alone = alone[at]
            other, top_batched = batched[at]
            assert other in top_alone and token in top_batched, (body, at, top_alone, top_batched)
            assert abs(top_alone[token] - top_alone[other]) <= near_tie, (body, top_alone)
            assert abs(top_batched[token] - top_batched[other]) <= near_tie, (body, at)
        else:  # one run stopped on EOS where the other went on: EOS was a near tie there
            longer = batched if len(batched) > len(alone) else alone
            best, second = sorted(longer[at][1].values(), reverse=True)[:2]
            assert best - second <= near_tie, (body, at, longer[at])
        partings.append(at)
    assert len(partings) <= max_partings, partings


async def cut_stream(base_url: str, body: dict[str, Any], events_before_cut: int) -> int:
    """Open a stream, read a few events, then drop the connection. Returns events read."""
    seen = 0
    async with httpx.AsyncClient(base_url=base_url, timeout=120.0) as client, \
            client.stream("POST", "/v1/completions", json={**body, "stream": True}) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                seen += 1
                if seen >= events_before_cut:
                    break  # leaving the blocks closes the socket mid-stream
    return seen


async def test_disconnects_abort_and_free_kv_blocks(http: httpx.AsyncClient,
                                                    server: ServerProcess) -> None:
    before = await wait_until_idle(http)
    aborts_before = metric_value(before, "pagode:request_success_total",
                                 {"finished_reason": "abort"})
    generated_before = metric_value(before, "pagode:generation_tokens_total")
    max_tokens = 400
    bodies = [{"prompt": stream_prompt(i), "max_tokens": max_tokens, "temperature": 0,
               "ignore_eos": True} for i in range(50)]
    seen = await asyncio.gather(*(cut_stream(server.base_url, b, 2 + i % 3)
                                  for i, b in enumerate(bodies)))
    assert all(2 <= s <= 4 for s in seen)
    after = await wait_until_idle(http)
    assert metric_value(after, "pagode:num_requests_running") == 0
    assert metric_value(after, "pagode:num_requests_waiting") == 0
    assert metric_value(after, "pagode:kv_cache_usage_perc") == 0
    aborts = metric_value(after, "pagode:request_success_total",
                          {"finished_reason": "abort"}) - aborts_before
    assert aborts == 50
    # Aborted early: nowhere near the 50 x 400 tokens they asked for.
    generated = metric_value(after, "pagode:generation_tokens_total") - generated_before
    assert generated < 50 * max_tokens / 4
    # Each cut request logged its abort, with far fewer tokens than asked.
    lines = [line for line in server.log().splitlines()
             if "finish_reason=abort" in line and "request finished" in line]
    counts = [int(line.split("output_tokens=")[1].split()[0]) for line in lines[-50:]]
    assert len(counts) == 50 and max(counts) < max_tokens / 4, counts
    # The next request is served normally.
    text, finish = await stream_text(http, {"prompt": "Hello", "max_tokens": 5,
                                            "temperature": 0, "ignore_eos": True})
    assert finish == "length" and text


async def test_non_streaming_disconnect_aborts(http: httpx.AsyncClient,
                                               server: ServerProcess) -> None:
    before = await wait_until_idle(http)
    aborts_before = metric_value(before, "pagode:request_success_total",
                                 {"finished_reason": "abort"})
    body = {"prompt": "Count to a thousand:", "max_tokens": 500, "temperature": 0,
            "ignore_eos": True}
    async with httpx.AsyncClient(base_url=server.base_url) as client:
        task = asyncio.create_task(client.post("/v1/completions", json=body))
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while metric_value(await metrics(http), "pagode:num_requests_running") == 0:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        task.cancel()  # drops the connection
        with pytest.raises(asyncio.CancelledError):
            await task
    after = await wait_until_idle(http)
    assert metric_value(after, "pagode:request_success_total",
                        {"finished_reason": "abort"}) == aborts_before + 1
    assert metric_value(after, "pagode:kv_cache_usage_perc") == 0
    # Counted as what it is, nginx's 499, never as a server error.
    assert responses(after, "499", "ClientClosedRequestError") == \
        responses(before, "499", "ClientClosedRequestError") + 1
    assert responses(after, "500", "InternalServerError") == \
        responses(before, "500", "InternalServerError")
    assert "Exception in ASGI application" not in server.log()


def responses(text: str, code: str, error_type: str) -> float:
    try:
        return metric_value(text, "pagode:http_responses_total",
                            {"code": code, "error_type": error_type})
    except KeyError:
        return 0.0
