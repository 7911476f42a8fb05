"""Sliding-window families: greedy output equals transformers' on a prompt longer than the
window (where windowed attention differs from full attention), and a long windowed
generation holds a bounded number of KV blocks."""

from __future__ import annotations

import copy
import dataclasses
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from reference import assert_greedy_match, reference_greedy
from tiny_models import TinyZoo, assert_engine_matches, one_torch_thread, prompts, tiny_spec

if not torch.cuda.is_available():  # the Triton kernels run interpreted: chosen before they are defined
    os.environ.setdefault("TRITON_INTERPRET", "1")

WINDOW = 24  # shorter than most prompts, and not a multiple of the 16-position block
MISTRAL = tiny_spec("mistral-window", "MistralConfig", "MistralForCausalLM", sliding_window=WINDOW)


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    with one_torch_thread():
        yield


def full_attention_twin(model: torch.nn.Module) -> torch.nn.Module:
    """The same weights with no window: what a server that ignores the window computes."""
    twin = copy.deepcopy(model)
    unbounded = 1 << 20  # a window past every position: full attention (some caches need an int)
    twin.config.sliding_window = unbounded
    for module in twin.modules():
        if isinstance(getattr(module, "sliding_window", None), int):
            module.sliding_window = unbounded
    return twin


def assert_windowed_engine_matches(path: Path, reference: torch.nn.Module) -> None:
    """Freed window blocks let every prompt run at once in the usual cache; a cache just over
    the longest sequence still forces preemptions, with windowed blocks among those freed."""
    from engine.model.loader import read_config, resolve_model
    from engine.runner.kv_cache import bytes_per_block

    block_bytes = bytes_per_block(read_config(resolve_model(str(path))), 16, torch.float32)
    llm = assert_engine_matches(path, reference, kv_cache_memory=7 * block_bytes, max_model_len=112)
    assert llm.engine.block_manager.window == WINDOW
    assert llm.engine.stats().num_preemptions_total > 0


def test_mistral_window_matches_transformers_and_differs_from_full_attention(tiny_zoo: TinyZoo) -> None:
    reference = tiny_zoo.reference(MISTRAL)
    assert_windowed_engine_matches(tiny_zoo.folder(MISTRAL), reference)
    twin = full_attention_twin(reference)
    longest = max(prompts(), key=len)
    assert len(longest) > WINDOW
    assert reference_greedy(twin, longest, 32, None) != reference_greedy(reference, longest, 32, None)


def test_long_windowed_generation_holds_bounded_blocks(tiny_zoo: TinyZoo) -> None:
    """Blocks that fell out of the window go back to the pool as the sequence grows, and
    the usage the engine reports is what it holds."""
    from engine import LLM, SamplingParams

    reference = tiny_zoo.reference(MISTRAL)
    prompt, new_tokens = prompts()[0], 160
    llm = LLM(model=str(tiny_zoo.folder(MISTRAL)), max_model_len=256, kv_cache_dtype="fp32", quantization="none")
    bm = llm.engine.block_manager
    held: list[int] = []

    def record(_: Any) -> None:
        held.append(bm.num_used)
        assert bm.usage == bm.num_used / bm.num_blocks

    llm.engine.step_listeners.append(record)
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True))[0]
    assert_greedy_match(reference, prompt, out.token_ids, reference_greedy(reference, prompt, new_tokens, None))
    total_blocks = -(-(len(prompt) + new_tokens) // 16)
    window_blocks = -(-WINDOW // 16) + 1  # the window straddles at most one more block
    assert max(held) <= window_blocks + 1 < total_blocks  # +1: the block the next token goes to
    assert bm.num_used == 0


LAYERS = ["sliding_attention", "full_attention", "sliding_attention", "sliding_attention"]
GEMMA2 = tiny_spec("gemma2", "Gemma2Config", "Gemma2ForCausalLM", num_hidden_layers=4, head_dim=16,
                   query_pre_attn_scalar=24, sliding_window=WINDOW, layer_types=LAYERS,
                   attn_logit_softcapping=2.0, final_logit_softcapping=3.0)
GEMMA3 = tiny_spec("gemma3", "Gemma3TextConfig", "Gemma3ForCausalLM", num_hidden_layers=4, head_dim=16,
                   query_pre_attn_scalar=24, sliding_window=WINDOW, layer_types=LAYERS,
                   rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
                                    "sliding_attention": {"rope_type": "default", "rope_theta": 100.0}})


@pytest.mark.parametrize("spec", [GEMMA2, GEMMA3], ids=lambda s: s.name)
def test_gemma_folder_matches_transformers_past_the_window(tiny_zoo: TinyZoo, spec: Any) -> None:
    """Prompts and generations longer than the sliding layers' window, in a cache that forces
    preemption (global layers keep every block, so none is freed early)."""
    reference = tiny_zoo.reference(spec)
    llm = assert_engine_matches(tiny_zoo.folder(spec), reference)
    assert llm.engine.block_manager.window is None
    twin = full_attention_twin(reference)
    longest = max(prompts(), key=len)
    assert reference_greedy(twin, longest, 32, None) != reference_greedy(reference, longest, 32, None)
    if spec is GEMMA2:  # and the soft-caps matter too
        uncapped = copy.deepcopy(reference)
        uncapped.config.final_logit_softcapping = None
        for module in uncapped.modules():
            if hasattr(module, "attn_logit_softcapping"):
                module.attn_logit_softcapping = None
        assert reference_greedy(uncapped, longest, 32, None) != reference_greedy(reference, longest, 32, None)


# Qwen2/Qwen3: a window only with use_sliding_window, and only on layers >= max_window_layers.
QWEN_WINDOW = dict(num_hidden_layers=3, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1)
QWEN2 = tiny_spec("qwen2-window", "Qwen2Config", "Qwen2ForCausalLM", **QWEN_WINDOW)
QWEN3 = tiny_spec("qwen3-window", "Qwen3Config", "Qwen3ForCausalLM", head_dim=32, **QWEN_WINDOW)


@pytest.mark.parametrize("spec", [QWEN2, QWEN3], ids=lambda s: s.name)
def test_qwen_window_layers_match_transformers_past_the_window(tiny_zoo: TinyZoo, spec: Any) -> None:
    """Layer 0 attends fully, layers 1 and 2 by the window, whether the config lists
    layer_types (as save_pretrained writes them) or leaves them to max_window_layers; and
    with use_sliding_window false the same sliding_window applies nowhere."""
    import json

    from engine.model.hf_config import config_from_hf

    reference = tiny_zoo.reference(spec)
    llm = assert_engine_matches(tiny_zoo.folder(spec), reference)
    assert [layer.self_attn.attn.window for layer in llm.engine.runner.model.layers] == [None, WINDOW, WINDOW]
    assert llm.engine.block_manager.window is None  # layer 0 keeps every block
    longest = max(prompts(), key=len)
    assert reference_greedy(full_attention_twin(reference), longest, 32, None) != \
        reference_greedy(reference, longest, 32, None)
    saved = json.loads((tiny_zoo.folder(spec) / "config.json").read_text())
    unlisted = config_from_hf({k: v for k, v in saved.items() if k != "layer_types"})
    assert unlisted.layer_types == config_from_hf(saved).layer_types == reference.config.layer_types
    off = config_from_hf({**saved, "use_sliding_window": False, "layer_types": None})
    assert off.sliding_window is None and off.layer_types is None


def test_the_fused_decode_step_takes_a_windowed_model(tiny_zoo: TinyZoo) -> None:
    """The C++ fused step passes each layer's window to its attention call, so a windowed model
    takes it (tests/test_decode_step_families.py holds its tokens to the layer-by-layer path's)."""
    from engine import LLM, native
    from engine.model import decode_step

    if native.decode_step() is None:
        pytest.skip("no C++ compiler")
    llm = LLM(model=str(tiny_zoo.folder(MISTRAL)), quantization="int8", max_model_len=128, kv_cache_dtype="fp32")
    runner = llm.engine.runner
    assert decode_step.unsupported(runner.model, runner.kv_caches, runner.backend) is None
    assert runner.decode_step is not None


@pytest.mark.parametrize("spec", [MISTRAL, GEMMA2, GEMMA3], ids=lambda s: s.name)
def test_triton_backend_matches_transformers_past_the_window(tiny_zoo: TinyZoo, spec: Any) -> None:
    """The Triton kernels' window and soft-cap (under the interpreter without CUDA), on a
    34-token prompt prefilled in 16-token chunks over a 24-position window."""
    import cuda_kernels
    from engine import LLM, SamplingParams

    if not cuda_kernels.triton_available():
        pytest.skip("triton missing")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    prompt = max(prompts(), key=len)
    llm = LLM(model=str(tiny_zoo.folder(spec)), attention_backend="triton", device=device, dtype="float32",
              kv_cache_memory="4MiB", max_model_len=128, max_num_batched_tokens=16, kv_cache_dtype="fp32",
              quantization="none")
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))[0]
    reference = tiny_zoo.reference(spec)
    assert_greedy_match(reference, prompt, out.token_ids, reference_greedy(reference, prompt, 8, None))


@pytest.mark.parametrize("spec", [MISTRAL, GEMMA2], ids=lambda s: s.name)
def test_drafts_verified_past_the_window_are_exact(tiny_zoo: TinyZoo, spec: Any) -> None:
    """Speculated greedy output equals the plain one where the drafted positions attend by
    the window (and Gemma 2's soft-cap): each drafted position is a decode row of its own,
    whose window ends at itself. A prompt that repeats itself gives the proposer matches."""
    from engine import LLM, SamplingParams
    from engine.speculative_config import parse_speculative_config
    from engine.tuning.step_cost import StepCost

    config = parse_speculative_config('{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1}')
    llm = LLM(model=str(tiny_zoo.folder(spec)), max_model_len=128, kv_cache_dtype="fp32", speculative_config=config,
              quantization="none")
    drafter = llm.engine.scheduler.drafter
    assert drafter is not None
    drafter.cost = StepCost((1, 2), (1.0, 1.0))  # flat: every draft found is verified
    base = prompts()[1]
    prompt = base + base[1:]
    assert len(prompt) > WINDOW
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    got = llm.generate([prompt, base], params)
    want = llm.generate([prompt, base], dataclasses.replace(params, speculative=False))
    assert drafter.counters.num_draft_tokens > 0
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    llm.engine.check_invariants()


# llama.cpp's gemma graphs fix what the file does not say: gemma2's even layers slide, gemma3's
# every 6th layer is global (so all 4 here slide) with a local RoPE base of 10000, and the
# softmax scale is the head size's.
GGUF_META = (("add_sliding_window", WINDOW),)
GEMMA2_GGUF = tiny_spec("gemma2-gguf", "Gemma2Config", "Gemma2ForCausalLM", "gemma2", num_hidden_layers=4,
                        head_dim=16, query_pre_attn_scalar=16, sliding_window=WINDOW,
                        layer_types=["sliding_attention", "full_attention"] * 2, attn_logit_softcapping=2.0,
                        final_logit_softcapping=3.0,
                        gguf_meta=(*GGUF_META, ("add_attn_logit_softcapping", 2.0),
                                   ("add_final_logit_softcapping", 3.0)))
GEMMA3_GGUF = tiny_spec("gemma3-gguf", "Gemma3TextConfig", "Gemma3ForCausalLM", "gemma3", num_hidden_layers=4,
                        head_dim=16, query_pre_attn_scalar=16, sliding_window=WINDOW,
                        layer_types=["sliding_attention"] * 4,
                        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                                         "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}},
                        gguf_meta=GGUF_META)


@pytest.mark.parametrize("spec", [GEMMA2_GGUF, GEMMA3_GGUF], ids=lambda s: s.name)
def test_gemma_gguf_matches_transformers_past_the_window(tiny_zoo: TinyZoo, spec: Any) -> None:
    """F32 GGUFs with llama.cpp's names and its (1 + w) norm weights."""
    path, reference = tiny_zoo.gguf(spec, "F32")
    if spec is GEMMA3_GGUF:  # every layer slides: its old blocks are freed
        assert_windowed_engine_matches(path, reference)
    else:
        assert_engine_matches(path, reference)
