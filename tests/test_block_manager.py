"""The block manager's invariants hold after every step of random workloads (hypothesis)."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.config import Batching, EngineConfig
from engine.core.block_manager import FREED, BlockManager
from engine.core.scheduler import Scheduler
from engine.core.sequence import Sequence
from engine.sampling_params import SamplingParams
from engine.types.outputs import RequestTimes

BLOCK = 4


def _seq(i: int, tokens: list[int]) -> Sequence:
    return Sequence(f"r{i}", list(tokens), SamplingParams(max_tokens=64), RequestTimes(0.0))


def _simulate_step(sched: Scheduler, rng: random.Random, max_len: int) -> None:
    """What the engine does around the model: advance, append a token, finish some."""
    out = sched.schedule()
    sampled = [s.seq for s in out.scheduled if s.completes_prefill]
    sched.advance(out)
    for seq in sampled:
        seq.append_token(rng.randrange(8))  # a tiny vocabulary makes prefix hits likely
        if len(seq) >= max_len or rng.random() < 0.1:
            sched.remove(seq)


@settings(max_examples=60, deadline=None)
@given(
    batching=st.sampled_from(["paged", "continuous", "static"]),
    num_blocks=st.integers(min_value=8, max_value=40),
    budget=st.integers(min_value=1, max_value=24),
    prefix_caching=st.booleans(),
    prompts=st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=12), min_size=1, max_size=14),
    seed=st.integers(0, 2**16),
    window=st.one_of(st.none(), st.integers(1, 11)),  # blocks freed out of a sliding window
)
def test_invariants_hold_after_every_step(batching: Batching, num_blocks: int, budget: int,
                                          prefix_caching: bool, prompts: list[list[int]],
                                          seed: int, window: int | None) -> None:
    rng = random.Random(seed)
    max_len = 6 * BLOCK
    config = EngineConfig(batching=batching, block_size=BLOCK, max_num_seqs=6,
                          max_num_batched_tokens=budget, enable_prefix_caching=prefix_caching, quantization="none")
    bm = BlockManager(num_blocks, BLOCK, prefix_caching, window=window)
    sched = Scheduler(config, bm, max_model_len=max_len)
    alive: list[Sequence] = []
    for step in range(200):
        if prompts and rng.random() < 0.5:
            seq = _seq(step, prompts.pop())
            sched.add(seq)
            alive.append(seq)
        if alive and rng.random() < 0.05:  # abort, as a client disconnect does
            sched.remove(alive.pop(rng.randrange(len(alive))))
        _simulate_step(sched, rng, max_len)
        alive = [s for s in alive if not s.is_finished]
        bm.check_invariants(list(sched.running) + list(sched.waiting))
        if window is not None:  # a running sequence holds only blocks its last step's window saw
            for s in sched.running:  # that step's first query was at most `budget` positions back
                dead = max(0, s.num_computed_tokens - budget - window + 1) // BLOCK
                assert all(b == FREED for b in s.block_table[:dead])
        if batching == "continuous":  # every running sequence holds its whole context's blocks
            assert all(len(s.block_table) * BLOCK >= max_len for s in sched.running)
            if not prefix_caching and window is None:  # shared prefix blocks, or blocks freed
                # out of a window, let more sequences fit than this
                assert len(sched.running) <= num_blocks // (max_len // BLOCK)
        if not sched.has_unfinished() and not prompts:
            break
    for seq in list(sched.running) + list(sched.waiting):
        sched.remove(seq)
    bm.check_invariants([])
    assert bm.num_used == 0 and bm.num_free == num_blocks


def test_freed_prefix_stays_reusable_until_reallocated() -> None:
    bm = BlockManager(num_blocks=4, block_size=BLOCK)
    a = _seq(0, [1, 2, 3, 4, 5, 6, 7, 8, 9])
    bm.allocate(a, len(a))
    a.num_computed_tokens = len(a)
    bm.commit_full_blocks(a)
    bm.free(a)
    assert bm.num_cached_idle == 2  # two full blocks keep their hashes while free
    b = _seq(1, [1, 2, 3, 4, 5, 6, 7, 8, 0])
    bm.allocate(b, len(b))
    assert b.num_cached_tokens == 8 and bm.prefix_hits == 8
    bm.free(b)
    # Take every block: the cached ones are evicted only now, least recently freed first.
    c = _seq(2, list(range(100, 116)))
    bm.allocate(c, len(c))
    assert bm.num_cached_idle == 0
    d = _seq(3, [1, 2, 3, 4, 5, 6, 7, 8, 9])
    bm.free(c)
    bm.allocate(d, len(d))
    assert d.num_cached_tokens == 0
    bm.check_invariants([d])


def test_last_prompt_token_is_always_recomputed() -> None:
    bm = BlockManager(num_blocks=4, block_size=BLOCK)
    a = _seq(0, [1, 2, 3, 4, 5, 6, 7, 8])
    bm.allocate(a, len(a))
    a.num_computed_tokens = len(a)
    bm.commit_full_blocks(a)
    b = _seq(1, [1, 2, 3, 4, 5, 6, 7, 8])  # identical prompt: 8 tokens, two full blocks
    bm.allocate(b, len(b))
    assert b.num_cached_tokens == 4  # not 8: the last token must produce logits
    bm.check_invariants([a, b])
    assert bm.blocks[a.block_table[0]].ref_count == 2


def test_blocks_out_of_the_window_return_to_the_pool_and_are_never_prefix_hits() -> None:
    """A window of 6 over blocks of 4: once the next query is at position 13 it sees 8..13,
    so blocks 0 (0-3) and 1 (4-7) are released, and a prompt sharing them misses."""
    bm = BlockManager(num_blocks=8, block_size=BLOCK, window=6)
    a = _seq(0, list(range(13)))
    bm.allocate(a, 14)
    a.num_computed_tokens = 13
    bm.commit_full_blocks(a)
    held = bm.num_used
    bm.free_outside_window(a, 12)  # a query at 12 still sees 7, in block 1
    assert a.block_table[0] == FREED and a.block_table[1] != FREED and bm.num_used == held - 1
    bm.free_outside_window(a, 13)
    assert a.block_table[:2] == [FREED, FREED] and bm.num_used == held - 2
    bm.check_invariants([a])
    b = _seq(1, list(range(13)))
    assert bm.match_prefix(b) == []  # the released blocks were taken out of the prefix cache
    bm.free(a)
    bm.check_invariants([])
    assert bm.num_used == 0 and bm.num_free == 8
