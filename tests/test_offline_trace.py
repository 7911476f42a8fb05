"""The offline run's step trace (benchmarks/offline_trace.py): what the engine's step listener
hands it, and the split of a run's time against a decode grid."""

from __future__ import annotations

import pytest

from benchmarks.offline_trace import StepTrace, TracedStep, decompose, grid_step_ms
from engine.sampling_params import SamplingParams

GRID = {100: {1: 50.0, 8: 200.0, 32: 400.0}, 300: {1: 40.0, 8: 160.0, 32: 320.0}}


def test_grid_step_ms_meets_the_cells_and_interpolates_between() -> None:
    assert grid_step_ms(GRID, 8, 100) == pytest.approx(40.0)  # 8 tokens at 200 tok/s
    assert grid_step_ms(GRID, 32, 300) == pytest.approx(100.0)
    between = grid_step_ms(GRID, 20, 200)
    assert grid_step_ms(GRID, 8, 200) < between < grid_step_ms(GRID, 32, 200)
    assert grid_step_ms(GRID, 8, 50) == grid_step_ms(GRID, 8, 100)  # clamped below the shortest context
    assert grid_step_ms(GRID, 64, 100) == pytest.approx(2 * grid_step_ms(GRID, 32, 100))  # past the biggest batch


def test_the_split_adds_up_to_the_time_of_each_phase() -> None:
    steps = [TracedStep(0, 48, 48, 0.0, 3, 2, 30.0, 29.0),  # prefill only, requests waiting
             TracedStep(3, 40, 400, 60.0, 4, 0, 45.0, 44.0),  # decodes with a chunk, queue empty
             TracedStep(4, 0, 800, 200.0, 4, 0, 70.0, 69.0),
             TracedStep(1, 0, 260, 260.0, 1, 0, 30.0, 29.0)]
    d = decompose(steps, GRID, max_num_seqs=8)
    assert set(d["phases"]) == {"fill", "tail"}
    for p in d["phases"].values():
        parts = p["ideal"] + p["batch"] + p["context"] + p["prefill"] + p["overhead"]
        assert parts == pytest.approx(p["seconds"], abs=0.02)
    assert d["phases"]["fill"]["steps"] == 1 and d["phases"]["tail"]["prefill_steps"] == 1
    assert d["decode_tokens"] == 8 and d["grid_best_tok_s"] == 400.0
    assert d["phases"]["tail"]["batch"] > 0  # batches of 1-4 run below the 32-batch cell's rate


@pytest.mark.slow
def test_the_trace_sees_every_token_the_engine_computes(small_llm) -> None:  # type: ignore[no-untyped-def]
    engine = small_llm.engine
    prompts = [engine.tokenize(t) for t in ("The cat sat on", "A short one", "Once upon a time there was")]
    trace = StepTrace()
    engine.step_listeners.append(trace)
    try:
        small_llm.generate(prompts, SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))
    finally:
        engine.step_listeners.remove(trace)
    assert sum(s.prefill_tokens for s in trace.steps) == sum(map(len, prompts))
    assert sum(s.decodes for s in trace.steps) == len(prompts) * 4  # the first token comes from the prefill
    for s in trace.steps:
        # each decode reads its context; a prefill chunk reads at least its own tokens
        assert s.positions_read >= round(s.decodes * s.mean_context) + s.prefill_tokens
        if s.prefill_tokens == 0:
            assert s.positions_read == pytest.approx(s.decodes * s.mean_context, abs=0.1 * s.decodes)
        assert s.ms >= s.forward_ms > 0
