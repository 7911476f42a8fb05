"""The n-gram proposer follows vLLM's rule: longest suffix match in [min, max], earliest wins."""

from __future__ import annotations

import random

import pytest

from engine.spec.ngram import NgramProposer


def _brute_force(tokens: list[int], min_n: int, max_n: int, k: int) -> list[int]:
    """The rule written out plainly: try the longest n first, then the earliest start."""
    length = len(tokens)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        suffix = tokens[length - n:]
        for start in range(0, length - n):
            if tokens[start:start + n] == suffix:
                return tokens[start + n:start + n + k]
    return []


def test_proposes_the_continuation_of_a_repeated_passage() -> None:
    passage = [11, 12, 13, 14, 15, 16, 17, 18]
    tokens = [1, 2] + passage + [3, 4] + passage[:4]
    assert NgramProposer(2, 4).propose(tokens, 3) == [15, 16, 17]


def test_longest_match_beats_a_shorter_earlier_one() -> None:
    # [8, 9] occurs first followed by 1; [7, 8, 9] occurs later followed by 2.
    tokens = [8, 9, 1, 0, 7, 8, 9, 2, 5, 7, 8, 9]
    assert NgramProposer(2, 3).propose(tokens, 1) == [2]
    assert NgramProposer(2, 2).propose(tokens, 1) == [1]


def test_earliest_occurrence_wins_a_tie() -> None:
    tokens = [5, 6, 1, 5, 6, 2, 5, 6]
    assert NgramProposer(2, 2).propose(tokens, 1) == [1]


def test_no_match_shorter_than_min_gives_no_draft() -> None:
    tokens = [1, 2, 3, 9, 2, 3]
    assert NgramProposer(3, 5).propose(tokens, 4) == []
    assert NgramProposer(2, 5).propose(tokens, 4) == [9, 2, 3]


def test_draft_is_capped_by_the_tokens_available() -> None:
    tokens = [4, 4, 4]
    assert NgramProposer(1, 2).propose(tokens, 5) == [4]


def test_rejects_min_above_max() -> None:
    with pytest.raises(ValueError, match="prompt_lookup_min"):
        NgramProposer(4, 2)


@pytest.mark.parametrize("seed", range(20))
def test_matches_the_plain_rule_on_random_contexts(seed: int) -> None:
    rng = random.Random(seed)
    min_n = rng.randint(1, 3)
    max_n = rng.randint(min_n, 5)
    k = rng.randint(1, 6)
    tokens = [rng.randrange(4) for _ in range(rng.randint(1, 60))]
    assert NgramProposer(min_n, max_n).propose(tokens, k) == _brute_force(tokens, min_n, max_n, k)
