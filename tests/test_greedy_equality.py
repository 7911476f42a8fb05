"""Greedy output equals transformers' greedy generate on the same weights, token for token.

The KV cache is pinned to fp32 here; the fp16 cache (the CPU default) is held to a
quality gate instead (tests/test_kv_cache_dtype.py).
"""

from __future__ import annotations

import pytest
import torch
from reference import assert_greedy_match, reference_greedy_batch
from tests_support import PROMPTS, SHARED_PREFIX

from engine import LLM, SamplingParams, native

MAX_TOKENS = 40


@pytest.fixture(scope="module")
def references(hf_reference: torch.nn.Module, llm_paged: LLM) -> dict[str, list[int]]:
    tok, eos = llm_paged.tokenizer, llm_paged.engine.model_config.eos_token_ids[0]
    prompts = PROMPTS + [SHARED_PREFIX + tail for tail in ("Summarize it.", "Translate it.")]
    outputs = reference_greedy_batch(hf_reference, [tok(p).input_ids for p in prompts], MAX_TOKENS, eos)
    return dict(zip(prompts, outputs, strict=True))


@pytest.fixture(scope="module")
def llm_paged() -> LLM:
    return LLM(kv_cache_memory="128MiB", max_model_len=1024, kv_cache_dtype="fp32", quantization="none")


def _check(llm: LLM, model: torch.nn.Module, refs: dict[str, list[int]], prompts: list[str]) -> None:
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=MAX_TOKENS))
    for p, out in zip(prompts, outs, strict=True):
        assert_greedy_match(model, out.prompt_token_ids, out.token_ids, refs[p])


def test_paged_batch_of_eight(llm_paged: LLM, hf_reference: torch.nn.Module, references: dict) -> None:
    assert len({len(llm_paged.tokenizer(p).input_ids) for p in PROMPTS}) == len(PROMPTS) >= 8
    _check(llm_paged, hf_reference, references, PROMPTS)


@pytest.mark.parametrize("batching", ["continuous", "static"])
def test_reserving_policies(batching: str, hf_reference: torch.nn.Module, references: dict) -> None:
    # 91 blocks, 16 a sequence: five run at once, so the eight prompts still take two batches.
    llm = LLM(batching=batching, kv_cache_memory="64MiB", max_model_len=256, kv_cache_dtype="fp32", quantization="none")
    _check(llm, hf_reference, references, PROMPTS)


def test_under_preemption(hf_reference: torch.nn.Module, references: dict) -> None:
    # ~31 blocks of 16: the eight sequences cannot all grow at once.
    llm = LLM(kv_cache_memory="22MiB", max_model_len=400, kv_cache_dtype="fp32", quantization="none")
    _check(llm, hf_reference, references, PROMPTS)
    assert llm.engine.stats().num_preemptions_total > 0


def test_chunked_prefill(hf_reference: torch.nn.Module, references: dict) -> None:
    llm = LLM(kv_cache_memory="64MiB", max_model_len=512, max_num_batched_tokens=24,
              kv_cache_dtype="fp32", quantization="none")
    _check(llm, hf_reference, references, PROMPTS)
    longest = max(len(llm.tokenizer(p).input_ids) for p in PROMPTS)
    assert longest > 24  # so at least one prompt was prefilled in several chunks


def test_prefix_cache_hits(llm_paged: LLM, hf_reference: torch.nn.Module, references: dict) -> None:
    prompts = [SHARED_PREFIX + tail for tail in ("Summarize it.", "Translate it.")]
    before = llm_paged.engine.stats().prefix_cache_hits_total
    _check(llm_paged, hf_reference, references, prompts[:1])
    _check(llm_paged, hf_reference, references, prompts[1:])
    assert llm_paged.engine.stats().prefix_cache_hits_total - before >= 16 * 4


def test_fused_prefill_kernel(hf_reference: torch.nn.Module, references: dict,
                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The fused C++ prefill kernel forced on, over chunks that extend cached positions and
    a prompt that extends a prefix-cache hit, on unquantized weights."""
    if native.prefill_attention() is None:
        pytest.skip("the fused prefill kernel is not built here")
    monkeypatch.setenv("PAGODE_PREFILL_KERNEL", "kernel")
    llm = LLM(kv_cache_memory="64MiB", max_model_len=512, max_num_batched_tokens=24, kv_cache_dtype="fp32",
              quantization="none")
    _check(llm, hf_reference, references, PROMPTS)
    shared = [SHARED_PREFIX + tail for tail in ("Summarize it.", "Translate it.")]
    _check(llm, hf_reference, references, shared[:1])
    _check(llm, hf_reference, references, shared[1:])
    assert llm.engine.stats().prefix_cache_hits_total >= 16 * 4
