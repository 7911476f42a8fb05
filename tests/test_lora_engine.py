"""LoRA adapters in the engine: base and adapter requests in one batch, each row on its own
adapter, equal token for token to transformers with the PEFT adapter merged in; the prefix
cache never hands one adapter's KV to another; bad adapters are refused before any is used."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from lora_adapters import save_random_adapter
from reference import assert_greedy_match
from tiny_models import TinySpec, TinyZoo, cached_greedy, one_torch_thread, preempting_cache_bytes, prompts, tiny_spec

from engine import LLM, SamplingParams
from engine.lora import LoraError
from engine.quant.linear import pinned_path
from engine.types.errors import InvalidRequestError

NEW_TOKENS = 24
SPECS = [tiny_spec("llama", "LlamaConfig", "LlamaForCausalLM", "llama"),
         tiny_spec("qwen3", "Qwen3Config", "Qwen3ForCausalLM", "qwen3", head_dim=32)]


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    with one_torch_thread():
        yield


def adapters(zoo: TinyZoo, spec: TinySpec) -> dict[str, tuple[Path, torch.nn.Module]]:
    """Adapter `a` (rank 8) and `b` (rank 16, rsLoRA) over the spec's folder."""
    base = zoo.folder(spec)
    made = {}
    for name, rank, seed, rslora in (("a", 8, 1, False), ("b", 16, 2, True)):
        out = base.parent / f"{base.name}-lora-{name}"
        made[name] = (out, save_random_adapter(base, out, rank, seed, rslora))
    return made


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_mixed_batch_matches_peft_merged(tiny_zoo: TinyZoo, spec: TinySpec) -> None:
    base = tiny_zoo.folder(spec)
    made = adapters(tiny_zoo, spec)
    refs = {None: tiny_zoo.reference(spec), "a": made["a"][1], "b": made["b"][1]}
    ids = prompts(6)
    loras: list[str | None] = [None, "a", "b", "a", None, "b"]
    llm = LLM(model=str(base), enable_lora=True, max_loras=2, max_lora_rank=16,
              lora_modules={name: str(path) for name, (path, _) in made.items()},
              kv_cache_memory=preempting_cache_bytes(base, ids, NEW_TOKENS), max_model_len=128,
              kv_cache_dtype="fp32", quantization="none")
    outs = llm.generate(ids, SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True), lora_name=loras)
    for prompt, lora, out in zip(ids, loras, outs, strict=True):
        ref = refs[lora]
        assert_greedy_match(ref, prompt, out.outputs[0].token_ids, cached_greedy(ref, prompt, NEW_TOKENS))
    assert llm.engine.stats().num_preemptions_total > 0, "the cache was meant to force a preemption"
    # The adapters change the output, so the equality above says the deltas were applied.
    base_out = cached_greedy(refs[None], ids[1], NEW_TOKENS)
    assert cached_greedy(refs["a"], ids[1], NEW_TOKENS) != base_out
    assert cached_greedy(refs["b"], ids[1], NEW_TOKENS) != base_out


def test_prefix_cache_keys_blocks_by_adapter(tiny_zoo: TinyZoo) -> None:
    """One prompt on the base, then on a and on b: had the cache keyed blocks by tokens
    alone, the adapters would read the base's KV and diverge from their references."""
    spec = SPECS[0]
    base, made = tiny_zoo.folder(spec), adapters(tiny_zoo, spec)
    prompt = prompts(1, seed=7)[0] * 3  # three full blocks and more
    llm = LLM(model=str(base), enable_lora=True, max_loras=2, max_lora_rank=16, max_model_len=256,
              lora_modules={name: str(path) for name, (path, _) in made.items()}, kv_cache_dtype="fp32",
              quantization="none")
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    refs = {None: tiny_zoo.reference(spec), "a": made["a"][1], "b": made["b"][1]}
    for lora in (None, "a", "b", "a"):
        out = llm.generate([prompt], params, lora_name=lora)[0]
        assert_greedy_match(refs[lora], prompt, out.outputs[0].token_ids, cached_greedy(refs[lora], prompt, 8))
    assert llm.engine.stats().prefix_cache_hits_total > 0  # the second `a` found its own blocks


def with_embedding_delta(adapter: Path, out: Path) -> Path:
    """A copy of `adapter` that also trains the embeddings (PEFT's lora_embedding_A/B), which
    the engine does not serve: served without them, the adapter would be silently wrong."""
    from safetensors.torch import load_file, save_file

    out.mkdir()
    shutil.copy(adapter / "adapter_config.json", out / "adapter_config.json")
    tensors = load_file(str(adapter / "adapter_model.safetensors"))
    tensors["base_model.model.model.embed_tokens.lora_embedding_A"] = torch.zeros(8, 203)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    return out


def test_runtime_load_unload_and_refusals(tiny_zoo: TinyZoo, tmp_path: Path) -> None:
    spec = SPECS[0]
    base, made = tiny_zoo.folder(spec), adapters(tiny_zoo, spec)
    llm = LLM(model=str(base), enable_lora=True, max_loras=1, max_lora_rank=8, max_model_len=128,
              kv_cache_dtype="fp32", quantization="none")
    engine = llm.engine
    with pytest.raises(LoraError, match="rank 16, above --max-lora-rank 8"):
        engine.load_lora_adapter("b", str(made["b"][0]))
    with pytest.raises(LoraError, match="not a PEFT adapter folder"):
        engine.load_lora_adapter("x", str(tmp_path))
    with pytest.raises(LoraError, match="tensors other than LoRA matrices"):
        engine.load_lora_adapter("emb", str(with_embedding_delta(made["a"][0], tmp_path / "emb")))
    engine.load_lora_adapter("a", str(made["a"][0]))
    assert engine.lora_adapters() == {"a": str(made["a"][0])}
    with pytest.raises(LoraError, match="--max-loras"):
        engine.load_lora_adapter("a2", str(made["a"][0]))
    prompt = prompts(1)[0]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    out = llm.generate([prompt], params, lora_name="a")[0]
    assert out.outputs[0].token_ids == cached_greedy(made["a"][1], prompt, 8)
    engine.unload_lora_adapter("a")
    with pytest.raises(InvalidRequestError, match="does not exist"):
        llm.generate([prompt], params, lora_name="a")
    cfg = json.loads((made["b"][0] / "adapter_config.json").read_text())
    assert cfg["r"] == 16 and cfg["use_rslora"] is True  # what the rank refusal read


def test_fused_step_adds_each_rows_adapter(tiny_zoo: TinyZoo) -> None:
    """On int8 weights the fused C++ decode step takes decode steps with adapter rows too,
    each row adding its own adapter's deltas (the same C++ function the layer-by-layer path
    calls): a mixed batch of base, `a` and `b` rows gives the layer-by-layer path's tokens,
    and the adapters' tokens agree with transformers + PEFT merged in fp32 within int8's
    rounding of the base weights, where the base's own tokens do not."""
    from engine import native

    if native.decode_step() is None:
        pytest.skip("no C++ compiler")
    spec = SPECS[0]
    base, made = tiny_zoo.folder(spec), adapters(tiny_zoo, spec)
    llm = LLM(model=str(base), quantization="int8", fused_decode_limit=8, enable_lora=True, max_loras=2,
              max_lora_rank=16, lora_modules={name: str(path) for name, (path, _) in made.items()},
              max_model_len=128, kv_cache_dtype="fp32", enable_prefix_caching=False)
    runner = llm.engine.runner
    step = runner.decode_step
    assert step is not None
    calls: list[int] = []
    step.register_forward_hook(lambda mod, args, out: calls.append(out.shape[0]))
    ids = prompts(6)
    loras: list[str | None] = [None, "a", "b", "a", None, "b"]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    model = runner.model
    with pinned_path(model, "kernel"):  # the prefills on the block kernel too, as the fused step
        fused = [o.outputs[0].token_ids for o in llm.generate(ids, params, lora_name=loras)]
        assert calls, "decode steps with adapter rows were meant to take the fused step"
        runner.decode_step = None  # the same engine, layer by layer
        try:
            layered = [o.outputs[0].token_ids for o in llm.generate(ids, params, lora_name=loras)]
            on_base = [o.outputs[0].token_ids for o in llm.generate(ids, params)]
        finally:
            runner.decode_step = step
    assert fused == layered
    adapted = [i for i, lora in enumerate(loras) if lora is not None]
    refs = {"a": made["a"][1], "b": made["b"][1]}
    expected = {i: cached_greedy(refs[str(loras[i])], ids[i], 12) for i in adapted}

    def agreement(outs: list[list[int]]) -> float:
        return float(np.mean([x == y for i in adapted for x, y in zip(outs[i], expected[i], strict=True)]))

    # int8's rounding flips near-ties and a flip changes the rest of its row, so the gate is
    # most tokens, against the base weights alone, which agree on few.
    assert agreement(fused) >= 0.6 and agreement(on_base) < 0.3, (agreement(fused), agreement(on_base))


def test_speculative_drafts_run_on_their_adapter(tiny_zoo: TinyZoo) -> None:
    """n-gram drafts split a sequence into one attention row per token: each of those rows
    still gets its sequence's adapter, and the verified tokens equal the merged reference."""
    from engine.speculative_config import parse_speculative_config

    spec = SPECS[0]
    base, made = tiny_zoo.folder(spec), adapters(tiny_zoo, spec)
    ids = [p * 3 for p in prompts(3, seed=5)]  # repeats give the n-gram drafter matches
    loras: list[str | None] = ["a", None, "b"]
    llm = LLM(model=str(base), enable_lora=True, max_loras=2, max_lora_rank=16, max_model_len=256,
              lora_modules={name: str(path) for name, (path, _) in made.items()}, kv_cache_dtype="fp32",
              speculative_config=parse_speculative_config({"method": "ngram", "num_speculative_tokens": 3,
                                                           "prompt_lookup_min": 1, "prompt_lookup_max": 3}),
                                                           quantization="none")
    outs = llm.generate(ids, SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True), lora_name=loras)
    refs = {None: tiny_zoo.reference(spec), "a": made["a"][1], "b": made["b"][1]}
    for prompt, lora, out in zip(ids, loras, outs, strict=True):
        ref = refs[lora]
        assert_greedy_match(ref, prompt, out.outputs[0].token_ids, cached_greedy(ref, prompt, NEW_TOKENS))
    counters = llm.engine.stats().spec_decode
    assert counters is not None and counters.num_draft_tokens > 0, "no drafts were verified"


def test_stacked_and_grouped_deltas_are_the_same_sums() -> None:
    """The two forms of a step's deltas (engine/lora/delta.py): the stacked one (one product
    over every loaded adapter, masked per row) equals the grouped one (rows gathered per
    adapter) and a per-row reference, on a fused q/k/v projection with ranks 8 and 16, an
    adapter that leaves v alone, base rows, and a loaded adapter no row uses."""
    from engine.lora.delta import STACKED_MAX_ROWS, LoraProjection, LoraRows, Shard

    gen = torch.Generator().manual_seed(0)
    ranges = ((0, 64), (64, 80), (80, 96))  # q, k, v
    projection = LoraProjection()
    for slot, rank, covered in ((0, 8, ranges), (1, 16, ranges[:2]), (2, 8, ranges)):
        projection.attach(slot, [Shard(torch.randn(rank, 32, generator=gen),
                                       torch.randn(stop - start, rank, generator=gen), start, stop)
                                 for start, stop in covered])
    slots = np.array([1, -1, 0, 1, 1, -1, 0, 1, 0, -1, 1], dtype=np.int64)
    x = torch.randn(len(slots), 32, generator=gen)
    base = torch.randn(len(slots), 96, generator=gen)
    rows = LoraRows.from_slots(slots)
    expected = base.clone()
    for i, slot in enumerate(slots):
        for shard in projection.shards.get(int(slot), []):
            expected[i, shard.start:shard.stop] += shard.b @ (shard.a @ x[i])
    assert len(rows.groups) > 1 and rows.num_rows <= STACKED_MAX_ROWS  # the stacked form runs
    stacked = projection.add_deltas(x, base.clone(), rows)
    grouped = base.clone()
    projection._add_grouped(x, grouped, rows)
    torch.testing.assert_close(stacked, expected, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(grouped, expected, rtol=1e-5, atol=1e-4)
    projection.detach(0)  # rows of an unloaded slot are not asked for; the others are unchanged
    kept = slots != 0
    again = projection.add_deltas(x[kept], base[kept].clone(), LoraRows.from_slots(slots[kept]))
    torch.testing.assert_close(again, expected[kept], rtol=1e-5, atol=1e-4)


def test_kv_events_carry_the_adapter(tiny_zoo: TinyZoo) -> None:
    """An engine publishing KV events (map layout) to a real ZMQ subscriber: one prompt on the
    base and on adapter `a` stores blocks under different hashes; the adapter's event names it
    (lora_id, lora_name, [name] per block) and its hashes chain vLLM's sha256_cbor with the
    extra key ("lora", name, path), the base's with none (tests/vllm_block_hash.py)."""
    import time

    import msgspec
    import vllm_block_hash as vllm
    import zmq

    from engine.kv_events_config import parse_kv_events_config
    from loadgen.server_process import free_port

    spec = SPECS[0]
    made = adapters(tiny_zoo, spec)
    port = free_port()
    config = parse_kv_events_config({"enable_kv_cache_events": True, "endpoint": f"tcp://*:{port}",
                                     "event_layout": "map"})
    llm = LLM(model=str(tiny_zoo.folder(spec)), enable_lora=True, max_loras=2, max_lora_rank=16,
              lora_modules={name: str(path) for name, (path, _) in made.items()}, kv_events_config=config,
              kv_cache_memory="8MiB", max_model_len=128, kv_cache_dtype="fp32", quantization="none")
    context = zmq.Context()
    sub = context.socket(zmq.SUB)
    try:
        sub.connect(f"tcp://127.0.0.1:{port}")
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        time.sleep(0.5)  # the subscription reaches the publisher before anything is sent
        prompt = list(range(10, 50))  # two full blocks of 16
        for lora in (None, "a"):
            llm.generate([prompt], SamplingParams(temperature=0, max_tokens=1), lora_name=lora)
        stored: list[dict[str, object]] = []
        deadline = time.monotonic() + 30
        while len(stored) < 2 and time.monotonic() < deadline:
            if sub.poll(200):
                _, _, payload = sub.recv_multipart()
                stored += [e for e in msgspec.msgpack.decode(payload)[1] if e["type"] == "BlockStored"]
    finally:
        sub.close(linger=0)
        context.term()
    base, adapter = stored[:2]
    vllm.init_none_hash(vllm.sha256_cbor)
    keys = (("lora", "a", str(made["a"][0])),)
    chained: list[int] = []
    parent = None
    for start in (0, 16):
        parent = vllm.hash_block_tokens(vllm.sha256_cbor, parent, prompt[start:start + 16], keys)
        chained.append(vllm.maybe_convert_block_hash(parent))
    assert base["block_hashes"] == vllm.request_block_hashes(prompt, 16)
    assert base["lora_id"] is None and base["lora_name"] is None and "extra_keys" not in base
    assert adapter["block_hashes"] == chained and adapter["token_ids"] == prompt[:32]
    assert (adapter["lora_id"], adapter["lora_name"], adapter["extra_keys"]) == (1, "a", [["a"], ["a"]])
