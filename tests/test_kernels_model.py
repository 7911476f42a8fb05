"""Whole-model check: greedy tokens are identical with the torch and triton backends.

A tiny random-weight Llama (2 layers, 4 query heads over 2 KV heads, head_dim 16)
is saved as a Hugging Face folder with a word-level tokenizer. Without CUDA the
triton backend runs its kernels under Triton's interpreter (this module turns it on
when no GPU is present); the prompts cover chunked prefill, prefix-cache hits
(prefill over cached positions), block boundaries and batched decodes.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from tiny_models import WORDS, save_tiny_model

import cuda_kernels

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

pytestmark = pytest.mark.skipif(not cuda_kernels.triton_available(), reason="triton missing")

DEVICES = [
    pytest.param("cpu", marks=pytest.mark.skipif(
        torch.cuda.is_available(), reason="with CUDA the kernels are compiled for the GPU")),
    pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs CUDA")]),
]
SHARED = [3 + (7 * i) % WORDS for i in range(40)]  # 2.5 blocks
BATCHES = [
    [SHARED + [10, 11, 12],  # 43 tokens: chunked prefill over two steps of 32
     [5],
     list(range(20, 36))],  # exactly one block
    [SHARED + [50, 51]],  # its first two blocks come from the prefix cache
]


def greedy_tokens(model_dir: Path, backend: str, batches: list[list[list[int]]],
                  device: str = "cpu", enforce_eager: bool = True, kv_cache_dtype: str = "auto") -> list[list[int]]:
    """Generate the batches one after another on one engine, so later ones hit its cache."""
    from engine.llm import LLM
    from engine.sampling_params import SamplingParams

    llm = LLM(model=str(model_dir), attention_backend=backend, device=device, dtype="float32",
              kv_cache_memory="4MiB", max_model_len=256, block_size=16,
              max_num_batched_tokens=32, enable_prefix_caching=True, max_num_seqs=8,
              enforce_eager=enforce_eager, kv_cache_dtype=kv_cache_dtype, quantization="none")
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    return [out.outputs[0].token_ids for batch in batches
            for out in llm.generate(batch, params)]


@pytest.mark.parametrize("device", DEVICES)
def test_greedy_generation_matches_cpu_backend(tmp_path: Path, device: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    save_tiny_model(tmp_path)
    expected = greedy_tokens(tmp_path, "cpu", BATCHES, device)
    assert all(len(tokens) == 10 for tokens in expected)

    # Spy on the prefill kernel to make sure the cached-context path really ran.
    from cuda_kernels import prefill_attention

    contexts: list[int] = []
    kernel = prefill_attention.paged_prefill_attention

    def spy(query, kv_cache, cu_seqlens_q, seq_lens, *args, **kwargs):  # type: ignore[no-untyped-def]
        q_lens = (cu_seqlens_q[1:] - cu_seqlens_q[:-1]).tolist()
        contexts.extend(n - q for n, q in zip(seq_lens.tolist(), q_lens, strict=True))
        return kernel(query, kv_cache, cu_seqlens_q, seq_lens, *args, **kwargs)

    monkeypatch.setattr(prefill_attention, "paged_prefill_attention", spy)

    def no_graphs(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise AssertionError("a CPU run touched the CUDA graph API")

    if device == "cpu":
        monkeypatch.setattr(torch.cuda, "CUDAGraph", no_graphs)
        monkeypatch.setattr(torch.cuda, "graph", no_graphs)
    assert greedy_tokens(tmp_path, "triton", BATCHES, device) == expected
    assert 0 in contexts and max(contexts) >= 32, contexts


@pytest.mark.slow
@pytest.mark.parametrize("device", DEVICES)
def test_greedy_generation_over_an_int8_cache_matches_cpu_backend(tmp_path: Path, device: str) -> None:
    """--kv-cache-dtype int8: the Triton write stores the bytes the C++ write stores, and both
    backends read them back to the same greedy tokens, prefix-cache hits included."""
    save_tiny_model(tmp_path)
    expected = greedy_tokens(tmp_path, "cpu", BATCHES, device, kv_cache_dtype="int8")
    assert all(len(tokens) == 10 for tokens in expected)
    assert greedy_tokens(tmp_path, "triton", BATCHES, device, kv_cache_dtype="int8") == expected


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_graph_decode_matches_eager(tmp_path: Path) -> None:
    save_tiny_model(tmp_path)
    eager = greedy_tokens(tmp_path, "triton", BATCHES, "cuda", enforce_eager=True)
    assert greedy_tokens(tmp_path, "triton", BATCHES, "cuda", enforce_eager=False) == eager
