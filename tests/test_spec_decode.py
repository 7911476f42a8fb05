"""Speculative decoding is exact for greedy: the same tokens, logprobs and stops as without it."""

from __future__ import annotations

import pytest

from engine import LLM, SamplingParams
from engine.core.block_manager import BlockManager
from engine.core.sequence import Sequence
from engine.io.outputs import RequestTimes
from engine.spec.config import parse_speculative_config

SPEC = parse_speculative_config('{"method": "ngram", "num_speculative_tokens": 4, '
                                '"prompt_lookup_min": 2, "prompt_lookup_max": 4}')
PASSAGE = "The quick brown fox jumps over the lazy dog near the river bank, while the farmer watches. "
PROMPTS = [
    "Repeat this text exactly: " + PASSAGE * 2 + "\nRepeat: " + PASSAGE[:30],
    "Count: one two three four five one two three four five one two three",
    "Hello, my name is",
]
GREEDY = SamplingParams(temperature=0, max_tokens=16)


@pytest.fixture(scope="module")
def engines() -> tuple[LLM, LLM]:
    base = LLM(kv_cache_memory="64MiB", max_model_len=512, kv_cache_dtype="fp32")
    spec = LLM(kv_cache_memory="64MiB", max_model_len=512, kv_cache_dtype="fp32", speculative_config=SPEC)
    return base, spec


def test_greedy_tokens_equal_without_speculation(engines: tuple[LLM, LLM]) -> None:
    base, spec = engines
    sampled = SamplingParams(temperature=0.8, max_tokens=8, seed=1)
    want = base.generate(PROMPTS, GREEDY)
    got = spec.generate(PROMPTS + PROMPTS[:1], [GREEDY] * len(PROMPTS) + [sampled])
    for w, g in zip(want, got, strict=False):
        assert g.token_ids == w.token_ids
        assert len(g.token_ids) <= GREEDY.max_tokens
    assert len(got[-1].token_ids) == 8  # the sampled request decoded in the same steps
    c = spec.engine.scheduler.drafter.counters
    assert c.num_drafts > 0 and 0 < c.num_accepted_tokens <= c.num_draft_tokens
    assert c.accepted_per_pos == sorted(c.accepted_per_pos, reverse=True)
    assert sum(c.accepted_per_pos) == c.num_accepted_tokens
    spec.engine.check_invariants()


def test_stop_string_inside_a_draft_ends_the_output_there(engines: tuple[LLM, LLM]) -> None:
    base, spec = engines
    plain = base.generate(PROMPTS[:1], SamplingParams(temperature=0, max_tokens=24))[0].text
    stop = plain[len(plain) // 2:len(plain) // 2 + 6]  # in the repeated run that drafts predict
    params = SamplingParams(temperature=0, max_tokens=24, stop=[stop])
    want = base.generate(PROMPTS[:1], params)[0]
    got = spec.generate(PROMPTS[:1], params)[0]
    assert got.text == want.text and got.finish_reason == want.finish_reason == "stop"


def test_speculative_false_turns_drafting_off(engines: tuple[LLM, LLM]) -> None:
    _, spec = engines
    before = spec.engine.scheduler.drafter.counters.num_drafts
    spec.generate(PROMPTS[:1], SamplingParams(temperature=0, max_tokens=12, speculative=False))
    assert spec.engine.scheduler.drafter.counters.num_drafts == before


def test_exact_with_a_tight_cache() -> None:
    base = LLM(kv_cache_memory="8MiB", max_model_len=128, kv_cache_dtype="fp32")
    spec = LLM(kv_cache_memory="8MiB", max_model_len=128, kv_cache_dtype="fp32", speculative_config=SPEC)
    prompts = [PROMPTS[1], PROMPTS[1] + " four", PROMPTS[2], PROMPTS[1] + " one"]
    params = SamplingParams(temperature=0, max_tokens=40)
    want = base.generate(prompts, params)
    got = spec.generate(prompts, params)
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
