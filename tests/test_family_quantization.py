"""--quantization int8/int4 on every dense family, held to the quality gate of SmolLM2's
quantized modes (tests/test_quantization.py: perplexity rise and top-1 agreement), and the
fused C++ decode step taken by each (tests/test_moe_family.py checks the MoE refusal).

The gate compares the quantized engine with the fp32 engine on the very weights the blocks
stand for (each projection quantized and dequantized): random tiny weights lose far more to
4-bit rounding than a trained model does, so the rounding is taken out and what is measured
is whether the family's quantized path computes the same model. The text read is the
model's own greedy continuation, so each position has a clear top-1.
"""

from __future__ import annotations

import copy as copy_module
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from test_families import SPECS
from test_quantization import GATE
from test_window_models import GEMMA2, GEMMA3
from tiny_models import (
    TinySpec,
    TinyZoo,
    cached_greedy,
    one_torch_thread,
    prompts,
    save_tokenizer,
)

from benchmarks.teacher_forcing import Reading, read_text
from engine import LLM
from engine.model import decode_step
from engine.quant import formats
from engine.quant.linear import QuantLinear, pinned_path
from engine.quant.modes import weight_kind
from engine.tuning import kernel_crossover

GATED = ("llama", "qwen2", "qwen3", "phi3-long", "granite", "olmo2", "smollm3", "gemma2", "gemma3")
# What decode_step.unsupported() must name for each family the C++ step cannot compute: none of
# these dense families (tests/test_moe_family.py checks the MoE refusal).
REASONS: dict[str, str | None] = {name: None for name in GATED}
TEXT_TOKENS = 192
ARGS = dict(kv_cache_memory="4MiB", max_model_len=256, kv_cache_dtype="fp32")


def read(llm: LLM, ids: list[int]) -> Reading:
    with torch.inference_mode():
        return read_text(llm.engine.runner, llm.engine.block_manager, ids)


def dequantized_folder(tiny_zoo: TinyZoo, spec: TinySpec, mode: str,
                       reference: torch.nn.Module | None = None, label: str = "") -> Path:
    """The spec's checkpoint (or `reference`'s weights) with every projection rounded through
    `mode`'s blocks."""
    path = tiny_zoo.root / f"{spec.name}-{spec.key}{label}-dequantized-{mode}"
    if (path / "config.json").exists():
        return path
    reference = reference if reference is not None else tiny_zoo.reference(spec)
    config = copy_module.deepcopy(reference.config)
    # A tied lm_head is quantized while the embedding stays fp32: untie them here.
    config.tie_word_embeddings = False
    copy = type(reference)(config)
    state = {}
    for name, tensor in reference.state_dict().items():
        tensor = tensor.clone()
        if tensor.dim() == 2 and "embed_tokens" not in name and formats.quantizable(tensor.shape[1]):
            blocks = formats.quantize(tensor.float(), weight_kind(mode, is_lm_head=name == "lm_head.weight"))
            tensor = formats.dequantize(blocks)
        state[name] = tensor
    copy.load_state_dict(state)
    copy.save_pretrained(path)
    save_tokenizer(path)
    return path


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    with one_torch_thread():
        yield


@pytest.mark.parametrize("spec", [s for s in [*SPECS, GEMMA2, GEMMA3] if s.name in GATED], ids=lambda s: s.name)
def test_quantized_family_passes_the_quality_gate(tiny_zoo: TinyZoo, spec: TinySpec,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # Keep both kernels in every layer, whatever this machine's measured crossover.
    monkeypatch.setattr(kernel_crossover, "_cache", {})
    monkeypatch.setenv("PAGODE_QUANT_CROSSOVER", "16")
    # The gate measures the block formats. Which dense GEMM the big steps take is a race per
    # machine (bf16 where it wins, and its AMX kernel wins even these tiny shapes); bf16's own
    # gate is tests/test_quantization.py's, on the real model, where its rounding of a tiny
    # random model's near-tied logits does not stand in for a real model's.
    monkeypatch.setenv("PAGODE_QUANT_GEMM", "fp32")
    folder, reference = tiny_zoo.folder(spec), tiny_zoo.reference(spec)
    prompt = prompts(1, seed=1)[0]
    ids = prompt + cached_greedy(reference, prompt, TEXT_TOKENS)
    for mode in ("int8", "int4"):
        rounded = read(LLM(model=str(dequantized_folder(tiny_zoo, spec, mode)), quantization="none", **ARGS), ids)
        llm = LLM(model=str(folder), quantization=mode, **ARGS)  # type: ignore[arg-type]
        assert_passes_gate(llm, ids, rounded, f"{spec.name} {mode}", mode)
        assert_fused_step_reason(llm, REASONS[spec.name])


def assert_passes_gate(llm: LLM, ids: list[int], rounded: Reading, label: str, mode: str) -> None:
    """The gate through the block kernel on every position, then through each layer's own choice."""
    assert_every_linear_quantized(llm)
    for path in ("kernel", None):
        with pinned_path(llm.engine.runner.model, path):
            got = read(llm, ids)
        rise, agreement = got.perplexity / rounded.perplexity - 1, got.agreement(rounded)
        print(f"{label} path={path or 'crossover'}: perplexity {got.perplexity:.3f} vs "
              f"{rounded.perplexity:.3f} in fp32 on the rounded weights ({rise:+.2%}), "
              f"top-1 agreement {agreement:.2%}")
        max_rise, min_agreement = GATE[mode]
        assert abs(rise) <= max_rise and agreement >= min_agreement


def assert_every_linear_quantized(llm: LLM) -> None:
    """No projection left in fp32: a family whose layers the quantizer missed would still pass
    the gate against weights rounded once (4-bit rounding moves a tiny model's perplexity less
    than the gate allows)."""
    modules = list(llm.engine.runner.model.modules())
    assert not any(isinstance(m, torch.nn.Linear) for m in modules)
    assert sum(isinstance(m, QuantLinear) for m in modules) > 0


def assert_fused_step_reason(llm: LLM, expected: str | None) -> None:
    runner = llm.engine.runner
    why = decode_step.unsupported(runner.model, runner.kv_caches, runner.backend)
    if expected is None:
        assert why is None
    else:
        assert why is not None and expected in why and runner.decode_step is None
