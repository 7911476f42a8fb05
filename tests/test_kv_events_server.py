"""KV events from a real server: a real ZMQ subscriber (and a replay client) reads what the
default model's prefix cache does under real completions, decoded as llm-d decodes them
(positional arrays), with hashes held to vLLM's definition (tests/vllm_block_hash.py).

One server for the module, with a KV cache of a few dozen blocks so that distinct prompts
evict; the tests run in order and each looks only at the batches its own requests caused.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
import vllm_block_hash as vllm
import zmq
from server_fixtures import ServerProcess, metric_value, running_server

pytestmark = pytest.mark.slow

BS = 16
TOPIC = "kv@127.0.0.1@SmolLM2"
WAIT_S = 60.0
PREFIX = ("You are a careful assistant for a small library. Answer in one short sentence, name the shelf, "
          "and never invent a book that the catalogue does not list. The catalogue has three shelves: "
          "history on the left, science in the middle, and poetry by the window. Loans last two weeks, "
          "a renewal needs the card, and the reading room closes an hour before the front door does. ")


@dataclass
class Fleet:
    """The server, and every frame its PUB socket sent to our SUB socket, in order."""

    server: ServerProcess
    replay_endpoint: str
    sub: zmq.Socket[bytes]
    frames: list[tuple[bytes, int, bytes]] = field(default_factory=list)

    def wait_for(self, done: Callable[[list[Any]], bool], since: int) -> list[Any]:
        """Receive until `done` holds for the events of the batches from index `since` on."""
        deadline = time.monotonic() + WAIT_S
        while True:
            events = [event for _, _, payload in self.frames[since:] for event in decode(payload)[1]]
            if done(events):
                return events
            if time.monotonic() > deadline:
                raise TimeoutError(f"no such events after {WAIT_S}s: {events}")
            if self.sub.poll(200):
                topic, seq, payload = self.sub.recv_multipart()
                self.frames.append((topic, int.from_bytes(seq, "big"), payload))

    def drain(self, quiet_s: float = 0.5) -> int:
        """Receive what was sent until the socket has been quiet a while; the frames so far."""
        while self.sub.poll(int(quiet_s * 1000)):
            topic, seq, payload = self.sub.recv_multipart()
            self.frames.append((topic, int.from_bytes(seq, "big"), payload))
        return len(self.frames)

    def complete(self, prompt: str, max_tokens: int = 1) -> dict[str, Any]:
        response = httpx.post(f"{self.server.api_url}/completions", timeout=120,
                              json={"prompt": prompt, "max_tokens": max_tokens, "temperature": 0})
        assert response.status_code == 200, response.text
        return dict(response.json())

    def tokenize(self, prompt: str) -> list[int]:
        response = httpx.post(f"{self.server.base_url}/tokenize", json={"prompt": prompt}, timeout=60)
        assert response.status_code == 200, response.text
        return list(response.json()["tokens"])


def decode(payload: bytes) -> Any:
    """As llm-d's vllm_adapter does: untyped msgpack, the batch and its events positional arrays."""
    return msgspec.msgpack.decode(payload)


def tagged(events: list[Any], tag: str) -> list[Any]:
    return [event for event in events if event[0] == tag]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    run_dir: Path = tmp_path_factory.mktemp("kv-events")
    endpoint, replay = f"ipc://{run_dir}/pub", f"ipc://{run_dir}/replay"
    config = {"enable_kv_cache_events": True, "endpoint": endpoint, "replay_endpoint": replay, "topic": TOPIC}
    args = ["--kv-cache-memory", "8MiB", "--max-model-len", "256", "--max-num-seqs", "4",
            "--kv-events-config", json.dumps(config)]
    context = zmq.Context()
    sub = context.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv@")  # llm-d's filter
    try:
        with running_server(args, run_dir, name="kv-events") as server:
            sub.connect(endpoint)
            time.sleep(0.5)  # ZMQ's slow joiner: let the subscription reach the PUB socket
            yield Fleet(server, replay, sub)
    finally:
        sub.close(linger=0)
        context.term()
    # The publisher's thread let the server stop on SIGTERM like any other.
    assert server.proc.returncode == 0, server.log_tail()
    assert f"KV events: publishing on {endpoint} (bound), replay {replay}" in server.log()
    assert "Traceback" not in server.log(), server.log_tail()


def test_stored_blocks_are_the_prompts_tokens_under_vllms_hashes(fleet: Fleet) -> None:
    first = PREFIX + "Where would I find a book on the French revolution?"
    second = PREFIX + "Which shelf holds the sonnets of Shakespeare, please?"
    first_ids, second_ids = fleet.tokenize(first), fleet.tokenize(second)
    first_full = len(first_ids) // BS
    # max_tokens 1: the one output token never gets K/V, so exactly the prompt's full blocks are stored.
    assert fleet.complete(first)["usage"]["prompt_tokens"] == len(first_ids)
    events = fleet.wait_for(lambda e: sum(len(s[1]) for s in tagged(e, "BlockStored")) >= first_full, 0)
    reference = vllm.request_block_hashes(first_ids, BS)
    assert len(reference) == first_full >= 4
    stored = tagged(events, "BlockStored")
    assert [h for event in stored for h in event[1]] == reference
    assert [t for event in stored for t in event[3]] == first_ids[:first_full * BS]
    assert stored[0][2] is None  # the prompt's first block has no parent
    for event in stored:
        assert len(event) == 8 and event[4:] == [BS, None, "CPU", None]  # block_size, lora_id, medium, lora_name
        assert len(event[3]) == BS * len(event[1])
    assert [seq for _, seq, _ in fleet.frames] == list(range(len(fleet.frames)))
    assert all(topic == TOPIC.encode() for topic, _, _ in fleet.frames)

    since = fleet.drain()
    shared = next(i for i in range(first_full) if first_ids[i * BS:(i + 1) * BS] != second_ids[i * BS:(i + 1) * BS])
    assert shared >= 3  # the prefix's blocks are found in the cache, not stored again
    fleet.complete(second)
    second_reference = vllm.request_block_hashes(second_ids, BS)
    events = fleet.wait_for(lambda e: bool(tagged(e, "BlockStored")), since)
    [stored_second] = tagged(events, "BlockStored")
    assert stored_second[1] == second_reference[shared:]
    assert stored_second[2] == reference[shared - 1]  # chained to a block published earlier
    assert stored_second[3] == second_ids[shared * BS:len(second_reference) * BS]
    batch = decode(fleet.frames[-1][2])
    assert len(batch) == 3 and batch[2] == 0 and abs(batch[0] - time.time()) < 600  # [ts, events, dp rank]


def test_evicted_blocks_are_removed_by_the_hashes_they_were_stored_under(fleet: Fleet) -> None:
    since = fleet.drain()
    stored_before = {h for _, _, p in fleet.frames for e in tagged(decode(p)[1], "BlockStored") for h in e[1]}
    for n in range(12):  # distinct prompts until the cache of a few dozen blocks must evict
        since_prompt = fleet.drain()
        fleet.complete(f"Story {n}: " + " ".join(f"word{n}x{i}" for i in range(25)))
        fleet.wait_for(lambda e: bool(tagged(e, "BlockStored")), since_prompt)
        if tagged([e for _, _, p in fleet.frames[since:] for e in decode(p)[1]], "BlockRemoved"):
            break
    events = [e for _, _, p in fleet.frames[since:] for e in decode(p)[1]]
    removed = tagged(events, "BlockRemoved")
    assert removed, "no eviction after 12 distinct prompts"
    stored_since = {h for e in tagged(events, "BlockStored") for h in e[1]}
    for event in removed:
        assert event == ["BlockRemoved", event[1], "CPU"] and len(event[1]) == 1
        assert event[1][0] in stored_before | stored_since
    assert {e[1][0] for e in removed} & stored_before, "the first test's blocks were the oldest"


def test_a_late_subscriber_replays_what_it_missed(fleet: Fleet) -> None:
    fleet.drain()
    context = zmq.Context()
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.RCVTIMEO, int(WAIT_S * 1000))
    dealer.connect(fleet.replay_endpoint)
    try:
        for start in (0, 3):
            dealer.send_multipart([b"", start.to_bytes(8, "big")])
            replayed = []
            while True:
                empty, seq, payload = dealer.recv_multipart()
                assert empty == b""
                replayed.append((int.from_bytes(seq, "big", signed=True), payload))
                if replayed[-1][0] == -1:
                    break
            assert replayed[-1] == (-1, b"")
            live = [(seq, payload) for _, seq, payload in fleet.frames if seq >= start]
            assert replayed[:len(live)] == live  # byte for byte; batches sent since may follow
            assert [seq for seq, _ in replayed[:-1]] == list(range(start, start + len(replayed) - 1))
    finally:
        dealer.close(linger=0)
        context.term()


def test_reset_prefix_cache_clears_all_blocks(fleet: Fleet) -> None:
    prompt = PREFIX + "Is there a shelf for cookbooks?"
    fleet.complete(prompt)
    hits = metric_value(httpx.get(f"{fleet.server.base_url}/metrics").text, "vllm:prefix_cache_hits_total")
    refused = httpx.post(f"{fleet.server.base_url}/reset_prefix_cache")  # no JSON type: as any web page
    assert refused.status_code == 415
    since = fleet.drain()
    reset = httpx.post(f"{fleet.server.base_url}/reset_prefix_cache", json={})
    assert reset.status_code == 200, reset.text
    events = fleet.wait_for(lambda e: bool(tagged(e, "AllBlocksCleared")), since)
    assert events == [["AllBlocksCleared"]]

    since = fleet.drain()
    fleet.complete(prompt)  # nothing is found now: every full block is stored again
    ids = fleet.tokenize(prompt)
    events = fleet.wait_for(lambda e: bool(tagged(e, "BlockStored")), since)
    assert [h for e in tagged(events, "BlockStored") for h in e[1]] == vllm.request_block_hashes(ids, BS)
    after = metric_value(httpx.get(f"{fleet.server.base_url}/metrics").text, "vllm:prefix_cache_hits_total")
    assert after == hits


async def test_vllm_metrics_agree_with_pagodes_while_a_stream_runs(fleet: Fleet) -> None:
    async with httpx.AsyncClient(base_url=fleet.server.base_url, timeout=120) as http:
        body = {"prompt": "Count slowly:", "max_tokens": 200, "ignore_eos": True, "stream": True}
        async with http.stream("POST", "/v1/completions", json=body) as stream:
            lines = stream.aiter_lines()
            while not (await anext(lines)).startswith("data: "):
                pass
            text = (await http.get("/metrics")).text
        labels: dict[str, str] = {}  # one model: the first sample of each name is the one
        for name in ("num_requests_running", "num_requests_waiting", "prefix_cache_queries_total",
                     "prefix_cache_hits_total"):
            assert metric_value(text, f"vllm:{name}", labels) == metric_value(text, f"pagode:{name}", labels), name
        assert metric_value(text, "vllm:num_requests_running", labels) == 1
        usage = metric_value(text, "vllm:kv_cache_usage_perc", labels)
        num_blocks = cache_label(text, "pagode:cache_config_info", "num_blocks")
        assert 0 < usage <= 1
        assert abs(usage - metric_value(text, "pagode:kv_cache_usage_perc", labels)) <= 1 / num_blocks
        assert cache_label(text, "vllm:cache_config_info", "num_gpu_blocks") == num_blocks
        assert cache_label(text, "vllm:cache_config_info", "block_size") == BS
        lora = metric_value(text, "vllm:lora_requests_info",
                            {"max_lora": "0", "running_lora_adapters": "", "waiting_lora_adapters": ""})
        assert abs(lora - time.time()) < 600  # vLLM's value: when it was last updated
        idle = (await http.get("/metrics")).text
        deadline = time.monotonic() + WAIT_S
        while metric_value(idle, "pagode:num_requests_running", labels) and time.monotonic() < deadline:
            idle = (await http.get("/metrics")).text
        assert metric_value(idle, "vllm:num_requests_running", labels) == 0


def cache_label(text: str, name: str, label: str) -> int:
    line = next(line for line in text.splitlines() if line.startswith(name + "{"))
    return int(line.split(f'{label}="', 1)[1].split('"', 1)[0])
