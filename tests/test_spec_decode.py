"""Speculative decoding is exact for greedy: the same tokens, logprobs and stops as without it.

One engine serves every test: a request with `speculative=False` takes the plain decode
path of the same engine, so it is the reference. The drafter's cost curve is set flat, so
that every draft the proposer finds is verified whatever this machine's timings; the
switch itself is tested in test_spec_switch.py. The KV cache is small enough that the
batch test preempts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest
from tiny_models import one_torch_thread

from engine import LLM, SamplingParams
from engine.core.block_manager import BlockManager
from engine.core.sequence import Sequence
from engine.speculative_config import parse_speculative_config
from engine.tuning.step_cost import StepCost
from engine.types.outputs import RequestTimes
from engine.types.stats import StepStats

SPEC = parse_speculative_config('{"method": "ngram", "num_speculative_tokens": 4, '
                                '"prompt_lookup_min": 2, "prompt_lookup_max": 4}')
PASSAGE = "The quick brown fox jumps over the lazy dog near the river bank, while the farmer watches. "
COPY = "Repeat this text exactly: " + PASSAGE * 2 + "\nRepeat: " + PASSAGE[:30]
COUNT = "Count: one two three four five one two three four five one two three"
OPEN = "Hello, my name is"
FLAT = StepCost((1, 2), (1.0, 1.0))


@pytest.fixture(scope="module")
def spec() -> Iterator[LLM]:
    """On one torch thread: the steps here are small, and on a shared machine a thread pool
    spends longer waking its threads than computing."""
    with one_torch_thread():
        llm = LLM(kv_cache_memory="12MiB", max_model_len=256, kv_cache_dtype="fp32", max_num_batched_tokens=64,
                  speculative_config=SPEC, quantization="none")
        drafter = llm.engine.scheduler.drafter
        assert drafter is not None
        drafter.cost = FLAT
        yield llm


def off(params: SamplingParams) -> SamplingParams:
    return dataclasses.replace(params, speculative=False)


def test_greedy_tokens_and_logprobs_equal_without_speculation(spec: LLM) -> None:
    counters = spec.engine.scheduler.drafter.counters
    before = counters.copy()
    steps: list[StepStats] = []
    spec.engine.step_listeners.append(steps.append)
    greedy = SamplingParams(temperature=0, max_tokens=12, logprobs=2)
    sampled = SamplingParams(temperature=0.8, max_tokens=8, seed=1)
    prompts = [COPY, COUNT, OPEN, COPY]
    # Drafted and undrafted sequences in one batch: greedy ones, one with speculation off, a sampled one.
    try:
        got = spec.generate([*prompts, COPY], [greedy, greedy, greedy, off(greedy), sampled])
    finally:
        spec.engine.step_listeners.remove(steps.append)
    want = spec.generate(prompts, [off(greedy)] * len(prompts))
    for g, w in zip(got, want, strict=False):
        assert g.token_ids == w.token_ids
        got_lp, want_lp = g.outputs[0].logprobs or [], w.outputs[0].logprobs or []
        assert [lp.token_id for lp in got_lp] == g.token_ids
        assert [lp.logprob for lp in got_lp] == pytest.approx([lp.logprob for lp in want_lp], abs=1e-4)
        assert [[t[0] for t in lp.top] for lp in got_lp] == [[t[0] for t in lp.top] for lp in want_lp]
    assert len(got[-1].token_ids) == 8  # the sampled request decoded in the same steps
    run = counters.minus(before)
    assert run.num_drafts > 0 and 0 < run.num_accepted_tokens <= run.num_draft_tokens
    assert run.accepted_per_pos == sorted(run.accepted_per_pos, reverse=True)
    assert sum(run.accepted_per_pos) == run.num_accepted_tokens
    # The step stats (the profile's source) and the engine's stats (/metrics') agree with the drafter.
    assert sum(st.num_drafts for st in steps) == run.num_drafts
    assert sum(st.num_accepted_tokens for st in steps) == run.num_accepted_tokens
    assert spec.engine.stats().spec_decode == counters
    spec.engine.check_invariants()


def test_stop_string_inside_a_draft_ends_the_output_there(spec: LLM) -> None:
    plain = spec.generate([COPY], off(SamplingParams(temperature=0, max_tokens=20)))[0].text
    stop = plain[len(plain) // 2:len(plain) // 2 + 6]  # in the repeated run that drafts predict
    params = SamplingParams(temperature=0, max_tokens=20, stop=[stop])
    want = spec.generate([COPY], off(params))[0]
    got = spec.generate([COPY], params)[0]
    assert got.text == want.text and got.finish_reason == want.finish_reason == "stop"


def test_max_tokens_and_n_are_kept(spec: LLM) -> None:
    for max_tokens in (1, 6):
        params = SamplingParams(temperature=0, max_tokens=max_tokens, n=2)
        got, want = spec.generate([COPY], params)[0], spec.generate([COPY], off(params))[0]
        assert len(got.outputs) == len(want.outputs) == 2
        for g, w in zip(got.outputs, want.outputs, strict=True):
            assert g.token_ids == w.token_ids and len(g.token_ids) == max_tokens


def test_speculative_false_turns_drafting_off(spec: LLM) -> None:
    before = spec.engine.scheduler.drafter.counters.num_drafts
    spec.generate([COPY], off(SamplingParams(temperature=0, max_tokens=12)))
    assert spec.engine.scheduler.drafter.counters.num_drafts == before


def test_exact_through_preemption(spec: LLM) -> None:
    preempted = spec.engine.scheduler.num_preemptions
    # 17 blocks of KV: four prompts of ~55 tokens growing by 48 each cannot all fit (no shared
    # prefix either: each starts differently).
    prompts = [f"{i}. {COPY}" for i in range(4)] + [COUNT]
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    got = spec.generate(prompts, params)
    assert spec.engine.scheduler.num_preemptions > preempted  # the cache really ran out
    want = spec.generate(prompts, off(params))
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    spec.engine.check_invariants()


def test_trim_frees_a_rejected_drafts_blocks_and_never_hashes_them() -> None:
    bm = BlockManager(8, 4, enable_prefix_caching=True)
    seq = Sequence("r", [1, 2, 3, 4, 5, 6], SamplingParams(), RequestTimes(0.0))
    bm.allocate(seq, 6)
    seq.num_computed_tokens = 5
    seq.draft = [7, 8, 9, 10]
    seq.token_ids.extend(seq.draft)
    bm.append_slots(seq, 5)  # the newest token and the draft: positions 5..9, 3 blocks
    assert len(seq.block_table) == 3
    seq.drop_draft()
    seq.append_token(7)  # the target kept the first draft token, then disagreed
    seq.append_token(0)
    seq.num_computed_tokens = len(seq) - 1
    bm.trim(seq, len(seq))
    bm.commit_full_blocks(seq)
    assert len(seq.block_table) == 2 and bm.num_used == 2
    hashed = [bm.blocks[b].token_ids for b in seq.block_table if bm.blocks[b].hash is not None]
    assert hashed == [(1, 2, 3, 4)]  # the second block holds 5, 6, 7, 0 but is not yet computed
    bm.check_invariants([seq])
