"""The fp16 KV cache (the CPU default) and the int8 one pass the int8 quality gate, and report
their capacity.

Quality gate, on 2048 positions of English prose (Python's own documentation text, in
four windows of 512 tokens read in chunks of 128, so that attention reads earlier
chunks back from the cache): perplexity within 3% of the fp32 cache's, and greedy
top-1 agreement with it of at least 95%. tests/test_family_kv_int8.py holds the int8 cache
to the same gate on other families.
"""

from __future__ import annotations

import math

import httpx
import pytest
import torch
from server_fixtures import ServerProcess, metric_value

from engine import LLM
from engine.core.scheduler import ScheduledSeq
from engine.core.sequence import Sequence
from engine.sampling_params import SamplingParams
from engine.types.outputs import RequestTimes

WINDOWS, WINDOW, CHUNK = 4, 512, 128
GATE = (0.03, 0.95)  # the largest perplexity change against the fp32 cache, the least top-1 agreement


def prose_windows(llm: LLM) -> list[list[int]]:
    from pydoc_data.topics import topics

    text = "\n".join(topics[k] for k in sorted(topics))[:60_000]
    ids = llm.tokenizer(text).input_ids
    stride = len(ids) // WINDOWS
    return [ids[i * stride:i * stride + WINDOW] for i in range(WINDOWS)]


@torch.inference_mode()
def teacher_forced_logits(llm: LLM, tokens: list[int]) -> torch.Tensor:
    """Logits at every position of `tokens`, prefilled in chunks through the paged cache."""
    engine, runner = llm.engine, llm.engine.runner
    seq = Sequence("gate", list(tokens), SamplingParams(), RequestTimes(0.0))
    engine.block_manager.allocate(seq, len(tokens))
    out = []
    try:
        for start in range(0, len(tokens), CHUNK):
            seq.num_computed_tokens = start
            inputs = runner.prepare([ScheduledSeq(seq, min(CHUNK, len(tokens) - start))])
            hidden = runner.model(inputs.input_ids, inputs.positions, inputs.meta, runner.kv_caches)
            out.append(runner.model.compute_logits(hidden))
    finally:
        engine.block_manager.free(seq)
    return torch.cat(out)


def nll_and_top1(llm: LLM, windows: list[list[int]]) -> tuple[float, torch.Tensor]:
    losses, picks = [], []
    for w in windows:
        logits = teacher_forced_logits(llm, w)[:-1]
        target = torch.tensor(w[1:])
        losses.append(torch.nn.functional.cross_entropy(logits, target, reduction="sum"))
        picks.append(logits.argmax(-1))
    positions = sum(len(w) - 1 for w in windows)
    return float(sum(losses)) / positions, torch.cat(picks)


# 40 fp32 blocks of 16 positions (30 layers x K/V x 3 heads x 64 dims x 4 bytes each).
KV_BYTES = 40 * 16 * 30 * 2 * 3 * 64 * 4


@pytest.fixture(scope="module")
def llm32() -> LLM:
    return LLM(kv_cache_memory=KV_BYTES, max_model_len=600, kv_cache_dtype="fp32", quantization="none")


@pytest.fixture(scope="module")
def llm16() -> LLM:
    return LLM(kv_cache_memory=KV_BYTES, max_model_len=600, kv_cache_dtype="fp16", quantization="none")


@pytest.fixture(scope="module")
def llm8() -> LLM:
    return LLM(kv_cache_memory=KV_BYTES, max_model_len=600, kv_cache_dtype="int8", quantization="none")


Reading = tuple[list[list[int]], float, torch.Tensor]  # the windows, the mean NLL, the top-1 picks


@pytest.fixture(scope="module")
def fp32_reading(llm32: LLM) -> Reading:
    """The gate's windows read once through the fp32 cache."""
    windows = prose_windows(llm32)
    assert sum(len(w) - 1 for w in windows) >= 2000
    return (windows, *nll_and_top1(llm32, windows))


def assert_passes_gate(llm: LLM, fp32_reading: Reading, label: str) -> None:
    windows, nll32, top32 = fp32_reading
    nll, top = nll_and_top1(llm, windows)
    ppl32, ppl = math.exp(nll32), math.exp(nll)
    agreement = float((top == top32).float().mean())
    print(f"perplexity fp32 KV {ppl32:.3f}, {label} KV {ppl:.3f} ({ppl / ppl32 - 1:+.3%}); "
          f"top-1 agreement {agreement:.2%} over {len(top32)} positions")
    max_change, min_agreement = GATE
    assert abs(ppl / ppl32 - 1) <= max_change
    assert agreement >= min_agreement


def test_fp16_cache_passes_the_quality_gate(llm16: LLM, fp32_reading: Reading) -> None:
    assert llm16.engine.runner.kv_caches[0].dtype == torch.float16
    assert_passes_gate(llm16, fp32_reading, "fp16")


@pytest.mark.slow
def test_int8_cache_passes_the_quality_gate(llm8: LLM, fp32_reading: Reading) -> None:
    cache = llm8.engine.runner.kv_caches[0]
    assert cache.dtype == torch.int8 and cache.shape[-1] == 64 + 4  # each row's values, then its scale
    assert_passes_gate(llm8, fp32_reading, "int8")


def test_fp16_cache_holds_twice_the_tokens(llm32: LLM, llm16: LLM) -> None:
    fp32, fp16 = llm32.engine.describe(), llm16.engine.describe()
    assert (fp32.kv_cache_dtype, fp16.kv_cache_dtype) == ("fp32", "fp16")
    assert fp32.kv_tokens == 40 * 16
    assert fp16.kv_tokens == 2 * fp32.kv_tokens
    assert fp16.kv_tokens_per_gib == 2 * fp32.kv_tokens_per_gib


def test_int8_cache_holds_nearly_twice_fp16s_tokens(llm16: LLM, llm8: LLM) -> None:
    """30 layers x 2 x 3 KV heads x (64 values + a 4-byte scale) = 12,240 bytes a token."""
    fp16, int8 = llm16.engine.describe(), llm8.engine.describe()
    assert int8.kv_cache_dtype == "int8"
    assert int8.kv_tokens == KV_BYTES // (16 * 12_240) * 16
    assert int8.kv_tokens_per_gib == 2**30 // (16 * 12_240) * 16
    assert 1.85 < int8.kv_tokens / fp16.kv_tokens < 2


def test_unknown_kv_cache_dtype_is_refused() -> None:
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        LLM(kv_cache_memory="16MiB", max_model_len=256, kv_cache_dtype="fp8", quantization="none")


def test_metrics_report_the_real_cache_capacity(server: ServerProcess) -> None:
    text = httpx.get(server.base_url + "/metrics", timeout=10).text
    line = next(x for x in text.splitlines() if x.startswith("pagode:cache_config_info{"))
    labels = dict(part.split("=", 1) for part in line[line.index("{") + 1:line.index("}")].split(","))
    labels = {k: v.strip('"') for k, v in labels.items()}
    assert labels["kv_cache_dtype"] == "fp16"  # the CPU default
    assert int(labels["kv_tokens"]) == int(labels["num_blocks"]) * int(labels["block_size"])
    # 30 layers x 2 x 3 KV heads x 64 dims x 2 bytes = 23,040 bytes a token
    assert int(labels["kv_tokens_per_gib"]) == 2**30 // (23040 * 16) * 16
    assert metric_value(text, "pagode:cache_config_info", {"kv_cache_dtype": "fp16"}) == 1.0
