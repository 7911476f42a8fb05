"""The fused C++ decode step on families beyond Llama: Qwen3's per-head q/k norms, SmolLM3's
layers without RoPE, sliding-window layers (Qwen2-style and Mistral), and converter-written
K-quant files (mixed Q4_K/Q6_K parts). With every projection pinned to the block kernel both
paths call the same C++ functions, so they must pick the same tokens with the same
log-probs, to the bit, with every decode step fused."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from converter_files import quantize
from quant_paths import pinned_path
from test_converter_gguf import QWEN3_256
from test_families import SPECS
from test_window_models import MISTRAL, QWEN3
from tiny_models import TinySpec, TinyZoo, one_torch_thread, prompts

from engine import native
from engine.llm import LLM
from engine.model.decode_step import FusedDecodeStep
from engine.sampling_params import SamplingParams

pytestmark = pytest.mark.skipif(native.decode_step() is None, reason="no C++ compiler")
BY_NAME = {s.name: s for s in SPECS}
CASES: list[TinySpec] = [BY_NAME["qwen3"], BY_NAME["smollm3"], QWEN3, MISTRAL]


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    with one_torch_thread():
        yield


def assert_fused_equals_layered(path: Path, mode: str) -> None:
    llm = LLM(model=str(path), quantization=mode, kv_cache_dtype="fp32", kv_cache_memory="16MiB",
              max_model_len=256, max_num_seqs=8, enable_prefix_caching=False)
    runner = llm.engine.runner
    step = runner.decode_step
    assert isinstance(step, FusedDecodeStep), "the family should take the fused step"
    step.max_tokens = 8
    batches: list[int] = []
    hook = step.register_forward_hook(lambda mod, args, out: batches.append(out.shape[0]))
    ids = [p * 3 for p in prompts(3)]  # past Mistral's and Qwen's windows (WINDOW in test_window_models)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=5)
    try:
        with pinned_path(llm, "kernel"):
            fused = llm.generate(ids, params)
            runner.decode_step = None
            layered = llm.generate(ids, params)
    finally:
        runner.decode_step = step
        hook.remove()
    assert batches == [3] * 23, batches
    for a, b in zip(fused, layered, strict=True):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        assert a.outputs[0].logprobs == b.outputs[0].logprobs


@pytest.mark.parametrize("spec", CASES, ids=lambda s: s.name)
def test_family_takes_the_fused_step_and_matches_layer_by_layer(tiny_zoo: TinyZoo, spec: TinySpec) -> None:
    assert_fused_equals_layered(tiny_zoo.folder(spec), "int4")


def test_a_q4_k_m_file_takes_the_fused_step_on_its_own_blocks(tiny_zoo: TinyZoo) -> None:
    assert_fused_equals_layered(quantize(tiny_zoo, QWEN3_256, "Q4_K_M"), "auto")
