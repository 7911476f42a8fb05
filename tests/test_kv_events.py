"""KV events without a server: the config's rules, vLLM's block hash, the events the block
manager's changes become, both wire layouts, and the ZMQ publisher on real sockets.
tests/test_kv_events_server.py runs them in a real server."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import msgspec
import pytest
import vllm_block_hash as vllm
import zmq

from engine.arg_utils import kv_events_flag
from engine.config import EngineConfig
from engine.core.block_hashes import external_hash, hash_blocks, none_hash, sha256_cbor
from engine.core.block_manager import BlockManager
from engine.core.sequence import Sequence
from engine.kv_events_config import KVEventsConfig, parse_kv_events_config
from engine.observers.kv_events import KVEventRecorder, encode_batch
from engine.observers.kv_publisher import END_SEQ, ZmqEventPublisher, binds
from engine.sampling_params import SamplingParams
from engine.types.outputs import RequestTimes
from server.cli import build_parser

BS = 16
VECTORS = Path(__file__).parent / "data" / "vllm_block_hashes.json"  # scripts/vllm_block_hash_vectors.py


# ---- the config ---------------------------------------------------------
def test_config_defaults_follow_vllm() -> None:
    config = parse_kv_events_config('{"enable_kv_cache_events": true}')
    assert config == KVEventsConfig(True, "zmq", "tcp://*:5557", None, 10_000, 100_000, 100_000, "", "array")
    assert config.publishes
    disabled = parse_kv_events_config('{"endpoint": "tcp://*:6000"}')
    assert disabled is not None and disabled.publisher == "null" and not disabled.publishes
    null = parse_kv_events_config({"enable_kv_cache_events": True, "publisher": "null"})
    assert null is not None and not null.publishes
    assert parse_kv_events_config(None) is None and parse_kv_events_config("") is None


@pytest.mark.parametrize(("text", "names"), [
    ('{"enable_kv_cache_events": true, "endpiont": "tcp://*:1"}', "unknown keys ['endpiont']"),
    ('{"enable_kv_cache_events": "yes"}', "enable_kv_cache_events must be a bool"),
    ('{"publisher": "kafka"}', "publisher must be one of"),
    ('{"endpoint": "localhost:5557"}', "endpoint must be a ZMQ address"),
    ('{"replay_endpoint": "tcp://"}', "replay_endpoint must be a ZMQ address"),
    ('{"buffer_steps": 0}', "buffer_steps must be an integer >= 1"),
    ('{"hwm": -1}', "hwm must be an integer >= 0"),
    ('{"max_queue_size": true}', "max_queue_size must be an integer >= 1"),
    ('{"topic": 5}', "topic must be a str"),
    ('{"event_layout": "struct"}', "event_layout must be one of"),
    ('[1, 2]', "must be a JSON object"),
])
def test_bad_configs_are_refused_naming_the_key(text: str, names: str) -> None:
    with pytest.raises(ValueError, match=names.replace("[", r"\[").replace("]", r"\]")):
        parse_kv_events_config(text)


def test_the_serve_flag_refuses_a_bad_config_at_startup(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["serve", "--kv-events-config", '{"enable_kv_cache_events": true, "x": 1}'])
    assert exit_info.value.code == 2
    assert "--kv-events-config: kv events config: unknown keys ['x']" in capsys.readouterr().err
    parsed = build_parser().parse_args(["serve", "--kv-events-config", '{"enable_kv_cache_events": true}'])
    assert parsed.kv_events_config == kv_events_flag('{"enable_kv_cache_events": true}')


def test_events_need_prefix_caching() -> None:
    config = parse_kv_events_config('{"enable_kv_cache_events": true}')
    with pytest.raises(ValueError, match="need prefix caching"):
        EngineConfig(kv_events_config=config, enable_prefix_caching=False, device="cpu", quantization="none")


# ---- vLLM's block hash ----------------------------------------------------
@pytest.mark.parametrize("case", json.loads(VECTORS.read_text())["cases"])
def test_block_hashes_equal_those_vllms_own_functions_computed(case: dict[str, object],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The file holds what vLLM's source computed (see its generated_by); the transcription the
    server tests use as reference must agree with it too."""
    if case["pythonhashseed"] is None:
        monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    else:
        monkeypatch.setenv("PYTHONHASHSEED", str(case["pythonhashseed"]))
    tokens = case["token_ids"]
    assert isinstance(tokens, list)
    assert [external_hash(d) for d in hash_blocks(tokens, BS)] == case["hashes"]
    assert vllm.request_block_hashes(tokens, BS) == case["hashes"]


def test_block_hashes_equal_vllms_sha256_cbor(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    rng = random.Random(7)
    for length in (0, 15, 16, 17, 100, 517):
        tokens = [rng.randrange(49152) for _ in range(length)]
        ours = [external_hash(d) for d in hash_blocks(tokens, BS)]
        assert ours == vllm.request_block_hashes(tokens, BS)
        assert len(ours) == length // BS


def test_pythonhashseed_changes_the_root_as_in_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    tokens = list(range(40))
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    unseeded = [external_hash(d) for d in hash_blocks(tokens, BS)]
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    seeded = [external_hash(d) for d in hash_blocks(tokens, BS)]
    assert seeded == vllm.request_block_hashes(tokens, BS)
    assert seeded != unseeded
    # A known answer from a cross-language check of vLLM's scheme: sha256(cbor("0")).
    assert none_hash().hex() == "4e1195df020de59e0d65a33a4279f1183e7ae4e5d980e309f8b55adff2e61c3e"
    assert sha256_cbor("0") == none_hash()


# ---- events from the block manager ------------------------------------------
def make_seq(request_id: str, tokens: list[int]) -> Sequence:
    return Sequence(request_id, list(tokens), SamplingParams(max_tokens=1), RequestTimes(0.0))


def compute(manager: BlockManager, seq: Sequence) -> None:
    """What a step does: allocate, compute the whole prompt, commit its full blocks."""
    manager.allocate(seq, len(seq))
    seq.num_computed_tokens = len(seq)
    manager.commit_full_blocks(seq)


def plain(events: list[object]) -> list[object]:
    return msgspec.msgpack.decode(msgspec.msgpack.encode(events))


def test_stored_removed_and_cleared_in_vllms_array_layout() -> None:
    manager = BlockManager(num_blocks=8, block_size=BS)
    recorder = KVEventRecorder(BS, "CPU")
    manager.observer = recorder
    shared = list(range(1000, 1040))  # 2 full blocks and 8 tokens
    first = make_seq("a", shared + list(range(8)))  # 48 tokens: 3 full blocks
    compute(manager, first)
    [stored] = plain(recorder.take_events())
    reference = vllm.request_block_hashes(first.token_ids, BS)
    # Exactly the eight elements llm-d's struct has (tests/test_kv_events_llmd.py says why).
    assert stored == ["BlockStored", reference, None, first.token_ids, BS, None, "CPU", None]

    second = make_seq("b", shared + list(range(50, 90)))  # shares 2 blocks, then 3 of its own
    compute(manager, second)
    [stored] = plain(recorder.take_events())
    reference = vllm.request_block_hashes(second.token_ids, BS)
    assert stored[1] == reference[2:5] and stored[2] == reference[1]
    assert stored[3] == second.token_ids[32:80]

    manager.free(first)
    manager.free(second)
    third = make_seq("c", list(range(3000, 3100)))  # 7 blocks: 2 free ones, then evicts 5 cached
    manager.allocate(third, len(third))
    removed = plain(recorder.take_events())
    cached = set(vllm.request_block_hashes(first.token_ids, BS)) | set(reference)
    assert [event[0] for event in removed] == ["BlockRemoved"] * 5
    assert all(len(event[1]) == 1 and event[1][0] in cached and event[2:] == ["CPU"] for event in removed)
    assert len({event[1][0] for event in removed}) == 5

    manager.reset_prefix_cache()
    assert plain(recorder.take_events()) == [["AllBlocksCleared"]]
    assert not manager.hash_to_block and not recorder.digests


def test_a_block_whose_parent_left_the_cache_still_chains() -> None:
    manager = BlockManager(num_blocks=8, block_size=BS)
    recorder = KVEventRecorder(BS, "CPU")
    manager.observer = recorder
    seq = make_seq("a", list(range(64)))
    manager.allocate(seq, len(seq))
    seq.num_computed_tokens = 32
    manager.commit_full_blocks(seq)
    manager.reset_prefix_cache()  # the parent's digest is forgotten
    recorder.take_events()
    seq.num_computed_tokens = 64
    manager.commit_full_blocks(seq)
    [stored] = plain(recorder.take_events())
    reference = vllm.request_block_hashes(seq.token_ids, BS)
    assert stored[1] == reference and stored[2] is None  # all four enter the cache again


def test_the_map_layout_names_the_fields() -> None:
    recorder = KVEventRecorder(BS, "GPU", layout="map")
    manager = BlockManager(num_blocks=4, block_size=BS)
    manager.observer = recorder
    compute(manager, make_seq("a", list(range(20))))
    manager.reset_prefix_cache()
    ts, events, rank = msgspec.msgpack.decode(encode_batch(12.5, recorder.take_events()))
    assert (ts, rank) == (12.5, 0)
    assert events == [{"type": "BlockStored", "block_hashes": vllm.request_block_hashes(list(range(20)), BS),
                       "parent_block_hash": None, "token_ids": list(range(16)), "block_size": BS,
                       "lora_id": None, "medium": "GPU", "lora_name": None},
                      {"type": "AllBlocksCleared"}]


LORA_VECTORS = VECTORS.with_name("vllm_lora_block_hashes.json")


@pytest.mark.parametrize("layout", ["array", "map"])
def test_an_adapters_blocks_carry_it_as_vllm_publishes_them(layout: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Requests on LoRA adapters: the hashes, lora_id, lora_name and (map) per-block extra_keys
    are what vLLM's own functions gave for the same adapter, name, path and tokens (the file);
    the same tokens on the base model publish the base's hashes and no adapter."""
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    cases = json.loads(LORA_VECTORS.read_text())["cases"]
    paths = {case["lora_name"]: case["lora_path"] for case in cases}
    recorder = KVEventRecorder(BS, "CPU", layout=layout, lora_paths=lambda: paths)
    manager = BlockManager(num_blocks=16, block_size=BS)
    manager.observer = recorder
    for case in cases:
        seq = make_seq(case["lora_name"], case["token_ids"])
        seq.lora_name, seq.cache_root = case["lora_name"], case["lora_id"]
        compute(manager, seq)
        [stored] = plain(recorder.take_events())
        full = case["token_ids"][:len(case["hashes"]) * BS]
        if layout == "array":
            assert stored == ["BlockStored", case["hashes"], None, full, BS, case["lora_id"], "CPU", case["lora_name"]]
        else:
            assert stored == {"type": "BlockStored", "block_hashes": case["hashes"], "parent_block_hash": None,
                              "token_ids": full, "block_size": BS, "lora_id": case["lora_id"], "medium": "CPU",
                              "lora_name": case["lora_name"], "extra_keys": case["event_extra_keys"]}
    tokens = cases[0]["token_ids"]
    compute(manager, make_seq("base", tokens))
    [stored] = plain(recorder.take_events())
    base_hashes = stored[1] if layout == "array" else stored["block_hashes"]
    assert base_hashes == vllm.request_block_hashes(tokens, BS)
    assert not set(base_hashes) & set(cases[0]["hashes"])
    if layout == "array":
        assert stored[5] is None and stored[7] is None
    else:
        assert stored["lora_id"] is None and stored["lora_name"] is None
        assert "extra_keys" not in stored  # left out at its default, as vLLM's omit_defaults does


# ---- the publisher on real sockets --------------------------------------------
def test_bind_or_connect_as_vllm_decides() -> None:
    assert binds("tcp://*:5557") and binds("tcp://[::]:5557") and binds("ipc:///tmp/x") and binds("inproc://x")
    assert not binds("tcp://10.0.0.2:5557")


def test_publisher_frames_sequence_and_replay(tmp_path: Path) -> None:
    endpoint, replay_endpoint = f"ipc://{tmp_path}/pub", f"ipc://{tmp_path}/replay"
    config = parse_kv_events_config({"enable_kv_cache_events": True, "endpoint": endpoint,
                                     "replay_endpoint": replay_endpoint, "topic": "kv@pod@m", "buffer_steps": 3})
    assert config is not None
    publisher = ZmqEventPublisher(config)
    context = zmq.Context()
    sub = context.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv@")
    sub.setsockopt(zmq.RCVTIMEO, 10_000)
    sub.connect(endpoint)
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.RCVTIMEO, 10_000)
    dealer.connect(replay_endpoint)
    try:
        time.sleep(0.5)  # ZMQ's slow joiner: a subscription takes a moment to reach the PUB
        types = KVEventRecorder(BS, "CPU").types
        for n in range(5):
            publisher.publish([types["BlockRemoved"](block_hashes=[n], medium="CPU")])
        frames = [sub.recv_multipart() for _ in range(5)]
        assert [f[0] for f in frames] == [b"kv@pod@m"] * 5
        assert [int.from_bytes(f[1], "big") for f in frames] == [0, 1, 2, 3, 4]
        batches = [msgspec.msgpack.decode(f[2]) for f in frames]
        assert [b[1] for b in batches] == [[["BlockRemoved", [n], "CPU"]] for n in range(5)]
        assert all(b[2] == 0 and abs(b[0] - time.time()) < 60 for b in batches)

        dealer.send_multipart([b"", (1).to_bytes(8, "big")])  # only the last 3 are kept
        replies = []
        while True:
            empty, seq, payload = dealer.recv_multipart()
            assert empty == b""
            replies.append((int.from_bytes(seq, "big", signed=True), payload))
            if seq == END_SEQ:
                break
        assert replies == [(2, frames[2][2]), (3, frames[3][2]), (4, frames[4][2]), (-1, b"")]
    finally:
        publisher.shutdown()
        sub.close(linger=0)
        dealer.close(linger=0)
        context.term()


def test_an_endpoint_in_use_is_a_startup_error(tmp_path: Path) -> None:
    context = zmq.Context()
    taken = context.socket(zmq.PUB)
    port = taken.bind_to_random_port("tcp://127.0.0.1")
    config = parse_kv_events_config({"enable_kv_cache_events": True, "endpoint": f"ipc://{tmp_path}/a",
                                     "replay_endpoint": f"tcp://127.0.0.1:{port}"})
    assert config is not None
    try:
        with pytest.raises(ValueError, match=f"kv events: cannot open .* or tcp://127.0.0.1:{port}: Address"):
            ZmqEventPublisher(config)
    finally:
        taken.close(linger=0)
        context.term()


def test_a_full_queue_drops_batches_rather_than_wait(tmp_path: Path) -> None:
    """The engine's side never waits for the publisher's thread: past max_queue_size a batch
    is dropped and counted (vLLM's publisher would block the step instead)."""
    config = parse_kv_events_config({"enable_kv_cache_events": True, "endpoint": f"ipc://{tmp_path}/full",
                                     "max_queue_size": 1})
    assert config is not None
    publisher = ZmqEventPublisher(config)
    try:
        cleared = KVEventRecorder(BS, "CPU").types["AllBlocksCleared"]
        for _ in range(2_000):
            publisher.publish([cleared()])
        assert publisher.dropped > 0
    finally:
        publisher.shutdown()
