"""One prompt of an exact token length: a span of words, cut where the server's /tokenize
counts the drawn length (by bisection on words, then on characters). Without /tokenize the
length is estimated from the word count, and the prompt says it is not exact.

Every dataset (datasets.py, conversations.py) builds its prompts here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import numpy as np

from loadgen.tokenizer import TOKENS_PER_WORD

CountTokens = Callable[[str], Awaitable[int | None]]


@dataclass
class PromptSpec:
    prompt: str
    prompt_len: int  # tokens, as the server counts them when `exact`
    output_len: int
    exact: bool  # prompt_len was counted by the server's /tokenize
    target_len: int | None = None  # the drawn length; a cut may miss it by a token


async def cut_exact(words: list[str], target: int, count: CountTokens) -> tuple[str, int] | None:
    """The longest prefix of `words` with at most `target` tokens, refined to exactly
    `target` where a partial next word allows it. None when the server cannot count."""

    async def tokens(k: int) -> int:
        n = await count(" ".join(words[:k]))
        if n is None:
            raise LookupError
        return n

    try:
        hi = min(len(words), max(2, target))
        n_hi = await tokens(hi)
        while n_hi <= target and hi < len(words):
            hi = min(len(words), hi * 2)
            n_hi = await tokens(hi)
        if n_hi <= target:  # the whole span is not long enough
            return " ".join(words), n_hi
        lo, n_lo = 0, 0
        while hi - lo > 1:  # invariant: tokens(lo) <= target < tokens(hi)
            mid = (lo + hi) // 2
            n_mid = await tokens(mid)
            lo, n_lo, hi = (mid, n_mid, hi) if n_mid <= target else (lo, n_lo, mid)
        if lo == 0:
            lo, n_lo = 1, await tokens(1)
        base = " ".join(words[:lo])
        if n_lo == target:
            return base, n_lo
        return await refine_by_chars(base, n_lo, words[lo], target, count)
    except LookupError:
        return None


async def refine_by_chars(
    base: str, n_base: int, word: str, target: int, count: CountTokens
) -> tuple[str, int]:
    """Append a part of the next word when a whole word would overshoot."""
    for j in range(1, len(word)):
        text = f"{base} {word[:j]}"
        n = await count(text)
        if n == target:
            return text, n
        if n is None or n > target:
            break
    return base, n_base


def draw_lengths(
    rng: np.random.Generator, n: int, input_range: tuple[int, int], output_range: tuple[int, int]
) -> tuple[np.ndarray, np.ndarray]:
    inputs = rng.integers(input_range[0], input_range[1] + 1, size=n)
    outputs = rng.integers(output_range[0], output_range[1] + 1, size=n)
    return inputs, outputs


async def build_prompt(words: list[str], target: int, output_len: int, count: CountTokens | None) -> PromptSpec:
    if count is not None:
        best: tuple[str, int] | None = None
        for shift in range(4):  # a BPE may skip a length at one cut; start a word later
            cut = await cut_exact(words[shift:], target, count)
            if cut is None:
                break
            if best is None or abs(cut[1] - target) < abs(best[1] - target):
                best = cut
            if best[1] == target:
                break
        if best is not None:
            return PromptSpec(best[0], best[1], output_len, exact=True, target_len=target)
    k = max(1, round(target / TOKENS_PER_WORD))
    return PromptSpec(" ".join(words[:k]), target, output_len, exact=False)


async def gather_bounded(jobs: Sequence[Awaitable[PromptSpec]], limit: int = 8) -> list[PromptSpec]:
    sem = asyncio.Semaphore(limit)

    async def run(job: Awaitable[PromptSpec]) -> PromptSpec:
        async with sem:
            return await job

    return list(await asyncio.gather(*(run(j) for j in jobs)))
