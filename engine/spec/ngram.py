"""N-gram prompt lookup: draft the tokens that followed the last n-gram where it occurred before.

Input-grounded requests (summarise, correct, reformat a given passage) repeat long runs of
their context, so the continuation of an earlier occurrence of the newest n tokens is often
what the model will write next. The rule is vLLM's (v1/spec_decode/ngram_proposer.py): the
longest suffix n-gram with length in [min_n, max_n] that occurs earlier in the context wins;
among occurrences of that length the earliest wins; the draft is up to k tokens after it.

Vectorised with numpy (one comparison per candidate end position per n), since a Python loop
per token would cost milliseconds per sequence per step on long contexts.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class NgramProposer:
    def __init__(self, min_n: int, max_n: int) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= prompt_lookup_min ({min_n}) <= prompt_lookup_max ({max_n})")
        self.min_n = min_n
        self.max_n = max_n

    def propose(self, token_ids: Sequence[int] | np.ndarray, k: int) -> list[int]:
        """Up to k draft tokens that follow the longest earlier match of the context's suffix."""
        ctx = np.asarray(token_ids, dtype=np.int64)
        length = len(ctx)
        if k <= 0 or length < self.min_n + 1:
            return []
        start = find_match_end(ctx, self.min_n, self.max_n)
        if start is None:
            return []
        return [int(t) for t in ctx[start:start + k]]


def find_match_end(ctx: np.ndarray, min_n: int, max_n: int) -> int | None:
    """Index just past the earliest occurrence of the longest matching suffix n-gram, or None.

    An occurrence ends at index e <= len-2 (the suffix itself does not count). The ends that
    match n tokens are a subset of those matching n-1, so each length filters the last.
    """
    length = len(ctx)
    ends = np.flatnonzero(ctx[:length - 1] == ctx[length - 1])  # ends of 1-token matches
    cap = min(max_n, length - 1)
    best: int | None = None
    matched = 1
    while ends.size:
        if matched >= min_n:
            best = int(ends[0])  # ends are sorted: the first is the earliest occurrence
        if matched == cap:
            break
        matched += 1
        ends = ends[ends >= matched - 1]
        ends = ends[ctx[ends - (matched - 1)] == ctx[length - matched]]
    return None if best is None else best + 1
