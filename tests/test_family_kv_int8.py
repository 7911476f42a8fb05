"""--kv-cache-dtype int8 beyond the default model: the int8 cache passes the KV quality gate
(tests/test_kv_cache_dtype.py: perplexity within 3% of the fp32 cache's, top-1 agreement of
at least 95%) on other families, and serves a batch that preempts, shares prefixes and, for
Gemma 2, slides a window and soft-caps its scores.

Qwen2 has biased K/V projections (rows of uneven magnitude) and grouped queries; Gemma 2
alternates sliding-window and global layers with a logit soft-cap, so its prefill chunks and
its decodes read int8 rows through the C++ kernels' window and cap, where they build. The
text read is each model's own greedy continuation, so that each position has a clear top-1.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from test_families import SPECS
from test_kv_cache_dtype import GATE
from test_window_models import GEMMA2
from tiny_models import TinySpec, TinyZoo, cached_greedy, one_torch_thread, preempting_cache_bytes, prompts

from benchmarks.teacher_forcing import Reading, read_text
from engine import LLM, SamplingParams
from engine.model.loader import read_config, resolve_model
from engine.runner.kv_cache import bytes_per_block

FAMILIES = [s for s in SPECS if s.name == "qwen2"] + [GEMMA2]
TEXT_TOKENS, CHUNK = 192, 48  # chunks, so that attention reads earlier chunks back from the cache
ARGS = dict(kv_cache_memory="4MiB", max_model_len=256, quantization="none")


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    with one_torch_thread():
        yield


def read(llm: LLM, ids: list[int]) -> Reading:
    with torch.inference_mode():
        return read_text(llm.engine.runner, llm.engine.block_manager, ids, chunk=CHUNK)


@pytest.mark.slow
@pytest.mark.parametrize("spec", FAMILIES, ids=lambda s: s.name)
def test_int8_cache_passes_the_gate_and_serves(tiny_zoo: TinyZoo, spec: TinySpec) -> None:
    folder = str(tiny_zoo.folder(spec))
    prompt = prompts(1, seed=2)[0]
    ids = prompt + cached_greedy(tiny_zoo.reference(spec), prompt, TEXT_TOKENS)
    fp32 = read(LLM(model=folder, kv_cache_dtype="fp32", **ARGS), ids)  # type: ignore[arg-type]
    llm = LLM(model=folder, kv_cache_dtype="int8", **ARGS)  # type: ignore[arg-type]
    assert llm.engine.runner.kv_caches[0].dtype == torch.int8
    int8 = read(llm, ids)
    change, agreement = int8.perplexity / fp32.perplexity - 1, int8.agreement(fp32)
    print(f"{spec.name}: perplexity fp32 KV {fp32.perplexity:.3f}, int8 KV {int8.perplexity:.3f} "
          f"({change:+.2%}), top-1 agreement {agreement:.2%}")
    max_change, min_agreement = GATE
    assert abs(change) <= max_change and agreement >= min_agreement
    assert_serves_with_preemption_and_prefix_hits(folder)


def assert_serves_with_preemption_and_prefix_hits(folder: str) -> None:
    """A batch in a cache too small for all of it (sequences preempted and recomputed) and a
    second run of the same prompts (their blocks found in the prefix cache) give the same
    greedy tokens: no block is reused or shared without its rows' scales."""
    ids = prompts()
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    cfg = read_config(resolve_model(folder))
    blocks_wanted = preempting_cache_bytes(Path(folder), ids, 48) // bytes_per_block(cfg, 16, torch.float32)
    llm = LLM(model=folder, kv_cache_dtype="int8", kv_cache_memory=blocks_wanted * bytes_per_block(cfg, 16, torch.int8),
              max_model_len=128, quantization="none")
    first = [o.outputs[0].token_ids for o in llm.generate(ids, params)]
    blocks = llm.engine.block_manager
    hits_before = blocks.prefix_hits
    second = [o.outputs[0].token_ids for o in llm.generate(ids, params)]
    assert blocks.prefix_hits > hits_before
    assert second == first
    assert llm.engine.stats().num_preemptions_total > 0  # the cache was small enough to preempt
