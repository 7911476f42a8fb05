"""Drafts are verified in the fused C++ decode step, and stay exact there.

On the CPU a drafted sequence's positions run as decode rows (ModelRunner.prepare): a step
of decodes and drafts only takes the fused step. With every projection pinned to the block
kernel's integer body, a row computes what a plain decode at that position computes, so one stream's
speculated output equals the plain one to the bit, logprobs included; a batch mixing
drafted, undrafted and sampled requests, through preemptions, gives the same tokens.

One engine: the real default model, int4 weights, a small fp32 cache that preempts. The
drafter's cost curve is flat, so that every draft found is verified whatever this
machine's timings, and the fused step's limit is pinned above the token budget, so that
every decode-and-draft step fits it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from test_spec_decode import COPY, COUNT, FLAT, OPEN, SPEC, off
from tiny_models import one_torch_thread

from engine import LLM, SamplingParams, native
from engine.core.scheduler import SchedulerOutput
from engine.model.decode_step import FusedDecodeStep
from engine.quant.linear import pinned_path
from engine.types.outputs import RequestOutput
from engine.types.stats import StepStats

pytestmark = [pytest.mark.slow, pytest.mark.skipif(native.decode_step() is None, reason="no C++ compiler")]

BUDGET = 64


@dataclass
class StepPath:
    """One engine step as the test sees it: its drafts, prefill tokens, and the rows the
    fused step ran (0: it ran layer by layer)."""

    num_tokens: int
    num_draft_tokens: int
    num_prefill_tokens: int
    fused_rows: int


@pytest.fixture(scope="module")
def spec() -> Iterator[LLM]:
    # Steps of every size on the integer body: the tile body (amx builds) is closer to exact,
    # but a verify step of several rows would then round otherwise than a plain decode.
    with one_torch_thread(), pytest.MonkeyPatch.context() as env:
        env.setenv("PAGODE_QUANT_TILES", "0")
        # No prefix cache: the plain run's prefills must compute what the speculated run's
        # did, not extend over its cached blocks (another attention shape, other roundings).
        llm = LLM(quantization="int4", kv_cache_memory="12MiB", max_model_len=256, kv_cache_dtype="fp32",
                  max_num_batched_tokens=BUDGET, speculative_config=SPEC, enable_prefix_caching=False)
        drafter = llm.engine.scheduler.drafter
        assert drafter is not None
        drafter.cost = FLAT
        step = llm.engine.runner.decode_step
        assert isinstance(step, FusedDecodeStep)
        step.max_tokens = BUDGET
        with pinned_path(llm.engine.runner.model, "kernel"):
            yield llm


def run(llm: LLM, prompts: list[str], params: list[SamplingParams]) -> tuple[list[RequestOutput], list[StepPath]]:
    """Generate, and say which steps ran fused with how many rows."""
    step = llm.engine.runner.decode_step
    assert step is not None
    rows: list[int] = []
    paths: list[StepPath] = []

    def record(stats: StepStats) -> None:
        paths.append(StepPath(stats.num_tokens, stats.num_draft_tokens, stats.num_prefill_tokens,
                              rows.pop() if rows else 0))

    scheduler = llm.engine.scheduler
    schedule = scheduler.schedule

    def ordered() -> SchedulerOutput:
        """The packed layout's order: one-token decodes, drafted decodes, prefill chunks."""
        out = schedule()
        kinds = [0 if s.num_new_tokens == 1 else 1 if s.num_draft else 2 for s in out.scheduled]
        assert kinds == sorted(kinds), kinds
        return out

    hook = step.register_forward_hook(lambda mod, args, out: rows.append(out.shape[0]))
    llm.engine.step_listeners.append(record)
    scheduler.schedule = ordered  # type: ignore[method-assign]
    try:
        outs = llm.generate(prompts, params)
    finally:
        scheduler.schedule = schedule  # type: ignore[method-assign]
        llm.engine.step_listeners.remove(record)
        hook.remove()
    return outs, paths


def assert_drafts_ran_fused(paths: list[StepPath]) -> None:
    """Every step of decodes and drafts only ran as one fused call over all its tokens."""
    verify_only = [p for p in paths if p.num_draft_tokens and not p.num_prefill_tokens]
    assert verify_only, paths
    assert all(p.fused_rows == p.num_tokens for p in verify_only), verify_only


def test_one_stream_verifies_in_the_fused_step_to_the_bit(spec: LLM) -> None:
    params = SamplingParams(temperature=0, max_tokens=24, logprobs=3, ignore_eos=True)
    (got,), paths = run(spec, [COPY], [params])
    (want,), plain_paths = run(spec, [COPY], [off(params)])
    assert_drafts_ran_fused(paths)
    assert len(paths) < len(plain_paths)  # the drafts were accepted: fewer steps for the same tokens
    assert got.outputs[0].token_ids == want.outputs[0].token_ids
    assert got.outputs[0].logprobs == want.outputs[0].logprobs


def test_a_mixed_batch_verifies_fused_and_stays_exact_to_the_bit(spec: LLM) -> None:
    """Drafted, undrafted and sampled requests in one batch, in a cache they all fit: the
    drafted rows compute what plain decodes compute, fused or, beside a prefill chunk, layer
    by layer (the same C++ functions), so the logprobs agree to the bit."""
    greedy = SamplingParams(temperature=0, max_tokens=16, logprobs=2, ignore_eos=True)
    sampled = dataclasses.replace(greedy, temperature=0.8, seed=1, logprobs=None)
    # Prompt logprobs of a prefill packed behind drafted rows: each sequence's rows are found
    # by where it starts in the step, not by its index among attention rows.
    scored = SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=1)
    preempted = spec.engine.scheduler.num_preemptions
    got, paths = run(spec, [COPY, COUNT, COPY, OPEN, COUNT], [greedy, greedy, off(greedy), sampled, scored])
    assert spec.engine.scheduler.num_preemptions == preempted  # the batch fits: no recompute
    assert_drafts_ran_fused(paths)
    assert any(p.num_draft_tokens and p.num_prefill_tokens and not p.fused_rows for p in paths)  # layer by layer
    want, _ = run(spec, [COPY, COUNT], [off(greedy)] * 2)
    (alone,), _ = run(spec, [COUNT], [off(scored)])
    # Chunked otherwise than alone, the prefill rounds otherwise in the last bits, which
    # int4 steps amplify; rows read from the wrong positions would score other tokens.
    got_pl, want_pl = got[4].prompt_logprobs or [], alone.prompt_logprobs or []
    assert len(got_pl) == len(want_pl) > 1 and got_pl[0] is want_pl[0] is None
    assert [p.token_id for p in got_pl[1:] if p] == [p.token_id for p in want_pl[1:] if p]
    # A token ranked in the thousands sits among neighbours a rounding apart, so its rank may
    # move by one or two; the logprobs below hold what a wrong position would change.
    for g, w in zip(got_pl[1:], want_pl[1:], strict=True):
        assert g and w and g.rank and w.rank and abs(g.rank - w.rank) <= max(2, w.rank // 50), (g, w)
    assert [p.logprob for p in got_pl[1:] if p] == pytest.approx([p.logprob for p in want_pl[1:] if p], abs=0.02)
    for g, w in zip(got, want, strict=False):
        assert g.outputs[0].token_ids == w.outputs[0].token_ids
        assert g.outputs[0].logprobs == w.outputs[0].logprobs
    assert got[2].outputs[0].logprobs == got[0].outputs[0].logprobs  # the undrafted twin in the same batch
    assert len(got[3].outputs[0].token_ids) == 16  # the sampled request decoded in the same steps


def test_exact_through_preemption(spec: LLM) -> None:
    """Preempted sequences recompute their context as a prefill, whose K/V differ from the
    decodes' in the last bits, and int4 steps amplify that: the tokens are compared here."""
    preempted = spec.engine.scheduler.num_preemptions
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    prompts = [f"{i}. {COPY}" for i in range(4)] + [COUNT]
    got, paths = run(spec, prompts, [params] * len(prompts))
    assert spec.engine.scheduler.num_preemptions > preempted  # the cache really ran out
    assert_drafts_ran_fused(paths)
    want, _ = run(spec, prompts, [off(params)] * len(prompts))
    assert [g.outputs[0].token_ids for g in got] == [w.outputs[0].token_ids for w in want]
    spec.engine.check_invariants()
