"""How pooling inputs are packed into forwards: every input exactly once, each batch within
the token budget as padded (rows x longest row), a row longer than the budget alone; waiting
requests taken by priority (concurrent requests over HTTP: tests/test_pooling_http.py)."""

from __future__ import annotations

import asyncio

from hypothesis import given
from hypothesis import strategies as st

from engine.pooling.async_pooling_engine import _Job, priority_groups
from engine.pooling.batching import plan_batches


@given(st.lists(st.integers(1, 300), max_size=60), st.integers(1, 1024))
def test_batches_cover_every_input_within_the_budget(lengths: list[int], budget: int) -> None:
    batches = plan_batches(lengths, budget)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for batch in batches:
        padded = len(batch) * max(lengths[i] for i in batch)
        assert padded <= budget or len(batch) == 1


def test_short_inputs_share_a_forward() -> None:
    assert plan_batches([5, 7, 6, 5], 64) == [[0, 3, 2, 1]]
    assert plan_batches([40, 5, 40], 64) == [[1], [0], [2]]
    assert len(plan_batches([8] * 64, 512)) == 1


def test_waiting_requests_run_by_priority_lower_first() -> None:
    loop = asyncio.new_event_loop()
    try:
        jobs = [_Job("embed", [], loop.create_future(), loop, priority) for priority in (3, 0, 3, -1, 0)]
        groups = priority_groups(jobs)
    finally:
        loop.close()
    assert [[j.priority for j in g] for g in groups] == [[-1], [0, 0], [3, 3]]
    assert groups[1] == [jobs[1], jobs[4]]  # arrival order within a level
