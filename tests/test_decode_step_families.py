"""The fused C++ decode step on families beyond Llama: Qwen3's per-head q/k norms, SmolLM3's
layers without RoPE, sliding-window layers (Qwen2-style and Mistral), Gemma 2 and 3 (their
(1 + w) norms before and after each sublayer, tanh-GELU, soft-caps, query_pre_attn_scalar,
local and global layers with their own RoPE bases), OLMo 2 (norms after each sublayer, q/k
norms over the whole projections), Phi-3 (partial rotary, LongRoPE, fused checkpoint
projections), Granite (its multipliers), and converter-written K-quant files (mixed
Q4_K/Q6_K parts). With every projection pinned to the block kernel both paths call the same
C++ functions, so they must pick the same tokens with the same log-probs, to the bit, with
every decode step fused; and the tokens must be transformers' on the weights the blocks
stand for."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from converter_files import quantize
from reference import assert_greedy_match
from test_converter_gguf import FAMILIES as CONVERTER_FAMILIES
from test_converter_gguf import QWEN3_256
from test_families import SPECS
from test_family_quantization import dequantized_folder
from test_window_models import GEMMA2, GEMMA3, MISTRAL, QWEN3
from tiny_models import TinySpec, TinyZoo, cached_greedy, one_torch_thread, prompts

from engine import native
from engine.llm import LLM
from engine.model.decode_step import FusedDecodeStep
from engine.quant.linear import pinned_path
from engine.sampling_params import SamplingParams

pytestmark = pytest.mark.skipif(native.decode_step() is None, reason="no C++ compiler")
BY_NAME = {s.name: s for s in SPECS}
CASES: list[TinySpec] = [BY_NAME["qwen3"], BY_NAME["smollm3"], QWEN3, MISTRAL, GEMMA2, GEMMA3, BY_NAME["olmo2"],
                         BY_NAME["phi3-short"], BY_NAME["phi3-long"], BY_NAME["granite"]]
# Converter-written, llama-quantize'd files run on their own blocks: Qwen3 at K-quant widths
# (mixed Q4_K/Q6_K parts), Gemma 3 with the (1 + w) norm weights llama.cpp stores (at 64 wide
# llama-quantize falls back to Q5_0/Q8_0). Held to the layer-by-layer path only: over their
# 49,152-token vocabulary the activations' rounding, pinned on every position here, flips
# logits that transformers does not see as near ties (FILE_GATE in test_converter_gguf, which
# holds these files to transformers).
FILES = [QWEN3_256, next(s for s in CONVERTER_FAMILIES if s.gguf_arch == "gemma3")]
NEW_TOKENS = 24
_references: dict[Path, torch.nn.Module] = {}


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    with one_torch_thread():
        yield


def assert_fused_equals_layered(path: Path, mode: str, reference: torch.nn.Module | None = None) -> None:
    """Fused and layer-by-layer greedy outputs equal to the bit (and equal to `reference`'s,
    transformers on the weights the blocks stand for, where given)."""
    llm = LLM(model=str(path), quantization=mode, kv_cache_dtype="fp32", kv_cache_memory="16MiB",
              max_model_len=128, max_num_seqs=8, enable_prefix_caching=False)
    runner = llm.engine.runner
    step = runner.decode_step
    assert isinstance(step, FusedDecodeStep), "the family should take the fused step"
    step.max_tokens = 8
    batches: list[int] = []
    hook = step.register_forward_hook(lambda mod, args, out: batches.append(out.shape[0]))
    # Past Mistral's, Qwen's and Gemma's windows (WINDOW in test_window_models); within Phi-3's
    # short-factor context (128), where transformers' LongRoPE keeps the short factors as the
    # engine does for a max_model_len within it.
    ids = [p * 3 for p in prompts(3)]
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True, logprobs=5)
    try:
        with pinned_path(llm.engine.runner.model, "kernel"):
            fused = llm.generate(ids, params)
            runner.decode_step = None
            layered = llm.generate(ids, params)
    finally:
        runner.decode_step = step
        hook.remove()
    assert batches == [3] * (NEW_TOKENS - 1), batches
    for a, b in zip(fused, layered, strict=True):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        assert a.outputs[0].logprobs == b.outputs[0].logprobs
    if reference is not None:
        for prompt, out in zip(ids, fused, strict=True):
            ref = cached_greedy(reference, prompt, NEW_TOKENS)
            assert_greedy_match(reference, prompt, out.outputs[0].token_ids, ref)


def rounded_reference(tiny_zoo: TinyZoo, spec: TinySpec, mode: str) -> torch.nn.Module:
    """transformers' model on the spec's weights rounded through `mode`'s blocks."""
    path = dequantized_folder(tiny_zoo, spec, mode)
    if path not in _references:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
        model.generation_config.eos_token_id = None  # the engine runs with ignore_eos
        _references[path] = model.eval()
    return _references[path]


@pytest.mark.parametrize("spec", CASES, ids=lambda s: s.name)
def test_family_takes_the_fused_step_and_matches_layer_by_layer(tiny_zoo: TinyZoo, spec: TinySpec) -> None:
    assert_fused_equals_layered(tiny_zoo.folder(spec), "int4", rounded_reference(tiny_zoo, spec, "int4"))


@pytest.mark.parametrize("spec", FILES, ids=lambda s: s.name)
def test_a_q4_k_m_file_takes_the_fused_step_on_its_own_blocks(tiny_zoo: TinyZoo, spec: TinySpec) -> None:
    assert_fused_equals_layered(quantize(tiny_zoo, spec, "Q4_K_M"), "auto")
