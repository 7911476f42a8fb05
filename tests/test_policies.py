"""The source article's three ways of serving (EngineConfig.batching) behave as defined
(tiny real model)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny_models import save_tiny_model

from engine.config import Batching, EngineConfig
from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams

MAX_MODEL_LEN = 64
KV_MEMORY = 32 * 8192  # 32 blocks of 16 positions for the tiny model (8 KiB a block)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny-llama")
    save_tiny_model(path)
    return path


def _engine(tiny_dir: Path, batching: Batching, **kwargs: object) -> LLMEngine:
    config = EngineConfig(model=str(tiny_dir), batching=batching, kv_cache_memory=KV_MEMORY,
                          max_model_len=MAX_MODEL_LEN, max_num_batched_tokens=256,
                          kv_cache_dtype="fp32", quantization="none", **kwargs)  # type: ignore[arg-type]
    engine = LLMEngine(config)
    assert engine.num_blocks == 32
    for i in range(24):
        prompt = [1] + [3 + (i * 7 + j) % 200 for j in range(4 + i % 9)]
        engine.add_request(f"r{i}", prompt, SamplingParams(max_tokens=4 + (i * 5) % 36, ignore_eos=True,
                                                           temperature=0))
    return engine


def _run(engine: LLMEngine) -> list[tuple[set[str], set[str]]]:
    """Per step: the running set before the step, and the requests admitted by it."""
    seen: set[str] = set()
    history = []
    while engine.has_unfinished():
        before = {s.request_id for s in engine.scheduler.running}
        finished = {d.request_id for d in engine.step() if d.finished}
        now = {s.request_id for s in engine.scheduler.running} | finished
        history.append((before, now - seen))
        seen |= now
        engine.check_invariants()
    assert len(seen) == 24
    return history


def test_static_admits_nobody_while_its_batch_runs(tiny_dir: Path) -> None:
    history = _run(_engine(tiny_dir, "static"))
    batches = [admitted for before, admitted in history if admitted]
    assert len(batches) >= 3  # 24 requests, at most 32 // 4 = 8 at a time
    for before, admitted in history:
        if admitted:
            assert not before, f"{sorted(admitted)} joined while {sorted(before)} ran"


def test_continuous_joins_in_flight_but_reserves_the_context(tiny_dir: Path) -> None:
    engine = _engine(tiny_dir, "continuous")
    history = _run(engine)
    limit = 32 * 16 // MAX_MODEL_LEN
    assert engine.scheduler.max_concurrent == limit
    assert any(before and admitted for before, admitted in history)  # joins a running batch


def test_paged_runs_more_at_once_on_the_same_budget(tiny_dir: Path) -> None:
    continuous = _engine(tiny_dir, "continuous")
    _run(continuous)
    paged = _engine(tiny_dir, "paged")
    _run(paged)
    assert paged.scheduler.max_concurrent > continuous.scheduler.max_concurrent


def test_paged_preempts_the_newest_and_recomputes(tiny_dir: Path) -> None:
    engine = _engine(tiny_dir, "paged", watermark=0.0)
    _run(engine)
    assert engine.stats().num_preemptions_total > 0


def test_chunked_prefill_never_exceeds_the_token_budget(tiny_dir: Path) -> None:
    engine = _engine(tiny_dir, "paged", max_num_seqs=6)
    engine.scheduler.config.max_num_batched_tokens = 7
    outputs = []
    schedule = engine.scheduler.schedule

    def recording_schedule():  # type: ignore[no-untyped-def]
        outputs.append(schedule())
        return outputs[-1]

    engine.scheduler.schedule = recording_schedule  # type: ignore[method-assign]
    _run(engine)
    assert any(s.num_new_tokens > 1 and not s.completes_prefill for o in outputs for s in o.scheduled)
    for out in outputs:
        assert 0 < out.num_batched_tokens <= 7 and len(out.scheduled) <= 6
        decodes = [s for s in out.scheduled if s.num_new_tokens == 1]
        assert out.scheduled[:len(decodes)] == decodes  # decodes lead the batch
    assert engine.block_manager.num_used == 0
