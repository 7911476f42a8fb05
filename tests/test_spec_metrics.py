"""Speculative decoding's counters reach /metrics under vLLM's names, and loadgen turns
their deltas over a run into vLLM's acceptance rate and mean acceptance length."""

from __future__ import annotations

from engine.observers.profiler import StepProfiler
from engine.types.spec_counters import SpecCounters
from engine.types.stats import EngineStats, StepStats
from loadgen.scrape import Sample, extract_fields, parse_prometheus, spec_summary
from server.runtime.metrics import ServerMetrics

SPEC = SpecCounters(num_drafts=5, num_draft_tokens=18, num_accepted_tokens=9, accepted_per_pos=[4, 3, 2, 0])


def render(stats: EngineStats) -> str:
    metrics = ServerMetrics("m", 512, 512, lambda: stats, lambda: 0)
    return metrics.render().decode()


def test_counters_are_exported_with_vllms_names() -> None:
    values = parse_prometheus(render(EngineStats(spec_decode=SPEC)))
    assert values["pagode:spec_decode_num_drafts_total"] == SPEC.num_drafts
    assert values["pagode:spec_decode_num_draft_tokens_total"] == SPEC.num_draft_tokens
    assert values["pagode:spec_decode_num_accepted_tokens_total"] == SPEC.num_accepted_tokens
    # Summed over positions the per-position counter is the accepted count.
    assert values["pagode:spec_decode_num_accepted_tokens_per_pos_total"] == SPEC.num_accepted_tokens
    text = render(EngineStats(spec_decode=SPEC))
    for position, count in enumerate(SPEC.accepted_per_pos):
        assert f'pagode:spec_decode_num_accepted_tokens_per_pos_total{{model_name="m",position="{position}"}} ' \
               f'{float(count)}' in text


def test_no_spec_series_when_the_engine_does_not_speculate() -> None:
    assert "spec_decode" not in render(EngineStats())


def test_loadgen_reads_the_run_delta_and_vllms_ratios() -> None:
    before = SpecCounters(2, 8, 3, [2, 1, 0, 0])
    samples = []
    for counters in (before, SPEC):
        fields = extract_fields(parse_prometheus(render(EngineStats(spec_decode=counters))))
        samples.append(Sample(t=0.0, **fields))
    run = spec_summary(samples[0], samples[-1])
    delta = SPEC.minus(before)
    assert run["spec_drafts"] == delta.num_drafts
    assert run["spec_draft_tokens"] == delta.num_draft_tokens
    assert run["spec_accepted_tokens"] == delta.num_accepted_tokens
    assert run["spec_acceptance_rate"] == delta.acceptance_rate
    assert run["spec_mean_acceptance_length"] == delta.mean_acceptance_length


def test_loadgen_reports_none_without_speculation() -> None:
    fields = extract_fields(parse_prometheus(render(EngineStats())))
    sample = Sample(t=0.0, **fields)
    assert all(v is None for v in spec_summary(sample, sample).values())


class NoModules:
    """A runner with nothing to hook: the profile's spec line comes from the step stats alone."""

    def timed_modules(self) -> list[tuple[str, object]]:
        return []


def test_step_profile_states_the_acceptance() -> None:
    tables: list[str] = []
    profiler = StepProfiler(NoModules(), 2, tables.append)  # type: ignore[arg-type]
    for drafts, draft_tokens, accepted in ((2, 7, 3), (1, 4, 4)):
        profiler.on_step(StepStats(num_tokens=9, num_prompt_tokens=0, num_generation_tokens=5, num_preemptions=0,
                                   num_running=2, num_waiting=0, kv_cache_usage=0.1, step_time=0.01,
                                   num_drafts=drafts, num_draft_tokens=draft_tokens, num_accepted_tokens=accepted))
    assert len(tables) == 1
    assert f"acceptance rate {7 / 11:.1%}" in tables[0] and f"mean acceptance length {1 + 7 / 3:.2f}" in tables[0]
