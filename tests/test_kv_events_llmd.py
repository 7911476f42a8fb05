"""pagode's KV-event batches read by a Go reader of llm-d's shape (tests/llmd_decoder): the
library llm-d decodes with (vmihailenco/msgpack v5), structs read by position, events told
apart by their first element. Go and the library come from Debian's packages
(scripts/install-go-msgpack.sh, run by `make test`)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import msgspec
import pytest
import vllm_block_hash as vllm

from engine.core.block_manager import BlockManager
from engine.core.sequence import Sequence
from engine.observers.kv_events import KVEventRecorder, encode_batch
from engine.sampling_params import SamplingParams
from engine.types.outputs import RequestTimes

BS = 16
GOPATH = Path("/usr/share/gocode")  # where Debian's golang-*-dev packages put their sources
LIBRARY = GOPATH / "src/github.com/vmihailenco/msgpack/v5"
SOURCE = Path(__file__).parent / "llmd_decoder"


@pytest.fixture(scope="module")
def decoder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("go") is None or not LIBRARY.is_dir():
        pytest.skip("go or vmihailenco/msgpack v5 is missing; scripts/install-go-msgpack.sh installs them")
    out = tmp_path_factory.mktemp("llmd") / "decoder"
    env = {**os.environ, "GO111MODULE": "off", "GOPATH": str(GOPATH), "GOCACHE": str(out.parent / "cache"),
           "GOFLAGS": ""}
    subprocess.run(["go", "build", "-o", str(out), "."], cwd=SOURCE, env=env, check=True, timeout=600)
    return out


def read(decoder: Path, payloads: list[bytes]) -> subprocess.CompletedProcess[str]:
    stdin = "".join(payload.hex() + "\n" for payload in payloads)
    return subprocess.run([str(decoder)], input=stdin, capture_output=True, text=True, timeout=60)


def seq(request_id: str, tokens: list[int]) -> Sequence:
    return Sequence(request_id, tokens, SamplingParams(max_tokens=1), RequestTimes(0.0))


def step_batches(layout: str) -> tuple[list[bytes], list[int], list[int]]:
    """Three steps' batches: a prompt stored, a second one sharing its first two blocks, and an
    eviction then a reset; with the vLLM hashes of both prompts."""
    manager = BlockManager(num_blocks=6, block_size=BS)
    recorder = KVEventRecorder(BS, "CPU", layout)
    manager.observer = recorder
    first, second = seq("a", list(range(100, 148))), seq("b", list(range(100, 132)) + list(range(7, 39)))
    payloads = []
    for s in (first, second):
        manager.allocate(s, len(s))
        s.num_computed_tokens = len(s)
        manager.commit_full_blocks(s)
        payloads.append(encode_batch(float(len(payloads)), recorder.take_events()))
    manager.free(first)
    manager.free(second)
    manager.allocate(seq("c", list(range(900, 996))), 96)  # six blocks: every cached one is evicted
    manager.reset_prefix_cache()
    payloads.append(encode_batch(2.0, recorder.take_events()))
    return payloads, vllm.request_block_hashes(first.token_ids, BS), vllm.request_block_hashes(second.token_ids, BS)


@pytest.mark.slow
def test_llmds_reader_decodes_pagodes_array_batches(decoder: Path) -> None:
    payloads, first, second = step_batches("array")
    result = read(decoder, payloads)
    assert result.returncode == 0, result.stderr
    batches: list[dict[str, Any]] = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(b["ts"], b["rank"]) for b in batches] == [(0, 0), (1, 0), (2, 0)]
    assert batches[0]["events"] == [{"type": "BlockStored", "hashes": first, "parent": None,
                                     "token_ids": list(range(100, 148)), "block_size": BS, "lora_id": None,
                                     "medium": "CPU", "lora_name": None}]
    [stored] = batches[1]["events"]
    assert (stored["hashes"], stored["parent"], stored["token_ids"]) == (second[2:], first[1], list(range(7, 39)))
    removals = batches[2]["events"][:-1]
    assert {h for e in removals for h in e["hashes"]} == set(first) | set(second)
    assert all(e["type"] == "BlockRemoved" and e["medium"] == "CPU" for e in removals)
    assert batches[2]["events"][-1] == {"type": "AllBlocksCleared"}


@pytest.mark.slow
def test_llmds_array_reader_cannot_read_the_map_layout(decoder: Path) -> None:
    """Why "array" is the default: a reader of llm-d's shape fails on named-field events."""
    payloads, _, _ = step_batches("map")
    result = read(decoder, payloads[:1])
    assert result.returncode != 0 and "msgpack" in result.stderr, result


@pytest.mark.slow
def test_llmds_reader_refuses_an_array_with_vllms_later_fields(decoder: Path) -> None:
    """Why the array layout stops at lora_name: msgspec writes defaulted fields of an
    array_like struct as nulls, and the reader then finds 12 elements for 8 fields."""
    event = ["BlockStored", [1], None, list(range(BS)), BS, None, "CPU", None, None, None, None, None]
    result = read(decoder, [msgspec.msgpack.encode([0.0, [event], 0])])
    assert result.returncode != 0
    assert "number of fields in array-encoded struct has changed" in result.stderr
