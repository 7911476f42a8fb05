"""The Triton attention backend runs each dense family's attention features (head_dim of its
own, q/k norms, partial rotary, NoPE layers, a softmax scale of its own, post-norm layers) to
the same greedy tokens as the CPU backend. Without CUDA its kernels run under Triton's
interpreter, as in tests/test_kernels_model.py, so a few short generations suffice."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch
from test_families import SPECS
from tiny_models import TinySpec, TinyZoo, one_torch_thread, prompts

import cuda_kernels

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

pytestmark = pytest.mark.skipif(not cuda_kernels.triton_available(), reason="triton missing")

FEATURES = ("qwen3", "phi3-long", "granite", "olmo2", "smollm3")


def greedy(spec_folder: str, backend: str) -> list[list[int]]:
    from engine import LLM, SamplingParams

    device = "cuda" if torch.cuda.is_available() else "cpu"
    llm = LLM(model=spec_folder, attention_backend=backend, device=device, dtype="float32",
              kv_cache_memory="4MiB", max_model_len=128, max_num_batched_tokens=16, kv_cache_dtype="fp32",
              quantization="none")
    outs = llm.generate(prompts(2), SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    return [out.token_ids for out in outs]


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    with one_torch_thread():
        yield


@pytest.mark.parametrize("spec", [s for s in SPECS if s.name in FEATURES], ids=lambda s: s.name)
def test_triton_backend_matches_cpu_backend(tiny_zoo: TinyZoo, spec: TinySpec) -> None:
    folder = str(tiny_zoo.folder(spec))
    assert greedy(folder, "triton") == greedy(folder, "cpu")
