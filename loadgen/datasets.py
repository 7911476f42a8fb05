"""Prompt sampling: spans of prose (`text`), word salad (`random`) or ShareGPT turns.

Prompt lengths are exact token counts when the server has a /tokenize endpoint: each
span is cut by bisection on words, then on characters, until the server counts exactly
the drawn length. Without /tokenize, lengths are estimated and a warning says so.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from loadgen.tokenizer import TOKENS_PER_WORD, estimate_tokens

CountTokens = Callable[[str], Awaitable[int | None]]

NO_TOKENIZE_WARNING = (
    "the server has no /tokenize endpoint: prompt lengths are estimated "
    f"({TOKENS_PER_WORD} tokens per word), not exact"
)


@dataclass
class PromptSpec:
    prompt: str
    prompt_len: int  # tokens, as the server counts them when `exact`
    output_len: int
    exact: bool  # prompt_len was counted by the server's /tokenize
    target_len: int | None = None  # the drawn length; a cut may miss it by a token


@dataclass
class PromptSet:
    prompts: list[PromptSpec]
    dataset: str
    warnings: list[str] = field(default_factory=list)

    @property
    def exact(self) -> bool:
        return all(p.exact for p in self.prompts)

    @property
    def num_off_target(self) -> int:
        """Prompts whose counted length differs from the drawn one."""
        return sum(1 for p in self.prompts if p.target_len is not None and p.prompt_len != p.target_len)


def parse_range(text: str) -> tuple[int, int]:
    """'16:128' -> (16, 128); '64' -> (64, 64)."""
    lo, sep, hi = text.partition(":")
    low, high = int(lo), int(hi) if sep else int(lo)
    if low < 1 or high < low:
        raise ValueError(f"bad length range {text!r}: use MIN:MAX with 1 <= MIN <= MAX")
    return low, high


def extract_prose(text: str, min_words: int = 12) -> str:
    """The running prose of a document: paragraphs of words, without code or headings."""
    kept = []
    for para in re.split(r"\n\s*\n", text):
        lines = para.split("\n")
        if any(line[:1].isspace() for line in lines if line):
            continue  # indented: code, grammar or a table
        words = para.split()
        letters = sum(ch.isalpha() for ch in para)
        if len(words) >= min_words and letters > 0.7 * len(para.replace(" ", "").replace("\n", "")):
            kept.append(" ".join(words))
    return " ".join(kept)


def default_prose() -> str:
    """The English documentation Python ships with itself."""
    from pydoc_data.topics import topics

    return extract_prose("\n\n".join(topics[key] for key in sorted(topics)))


def load_words(path: str | None) -> list[str]:
    text = default_prose() if path is None else Path(path).read_text(encoding="utf-8")
    words = text.split()
    if len(words) < 1000:
        raise ValueError(f"text dataset too small: {len(words)} words")
    return words


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


async def sample_text(
    words: list[str], n: int, input_range: tuple[int, int], output_range: tuple[int, int],
    seed: int, count: CountTokens | None,
) -> list[PromptSpec]:
    """Spans of prose starting at seeded word offsets."""
    rng = np.random.default_rng(seed)
    inputs, outputs = draw_lengths(rng, n, input_range, output_range)
    span = 4 * input_range[1] + 16  # words enough for any length
    starts = rng.integers(0, max(1, len(words) - span), size=n)
    jobs = [
        build_prompt(words[s : s + span], int(i), int(o), count)
        for s, i, o in zip(starts, inputs, outputs, strict=True)
    ]
    return await gather_bounded(jobs)


async def sample_random(
    words: list[str], n: int, input_range: tuple[int, int], output_range: tuple[int, int],
    seed: int, count: CountTokens | None,
) -> list[PromptSpec]:
    """Words drawn uniformly from the prose's vocabulary: no shared prefixes, no meaning."""
    rng = np.random.default_rng(seed)
    inputs, outputs = draw_lengths(rng, n, input_range, output_range)
    vocab = sorted({w for w in words if w.isalpha()})
    span = 4 * input_range[1] + 16
    jobs = [
        build_prompt([vocab[k] for k in rng.integers(0, len(vocab), size=span)], int(i), int(o), count)
        for i, o in zip(inputs, outputs, strict=True)
    ]
    return await gather_bounded(jobs)


def load_sharegpt(path: str) -> list[tuple[str, str]]:
    """(first turn, its answer) of each conversation with at least two turns."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    pairs = []
    for entry in data:
        turns = entry.get("conversations") or entry.get("conversation") or []
        if len(turns) >= 2:
            first = turns[0].get("value") or turns[0].get("content") or ""
            answer = turns[1].get("value") or turns[1].get("content") or ""
            if first.strip() and answer.strip():
                pairs.append((first, answer))
    return pairs


async def sample_sharegpt(
    path: str, n: int, input_range: tuple[int, int], output_range: tuple[int, int],
    seed: int, count: CountTokens | None,
) -> list[PromptSpec]:
    """Whole first turns, shuffled by the seed, each with its real answer's length as the
    output length (as vLLM does); prompts over the input maximum and answers outside the
    output range are skipped."""
    rng = np.random.default_rng(seed)
    candidates = load_sharegpt(path)
    order = rng.permutation(len(candidates))
    prompts: list[PromptSpec] = []
    for k in order:
        if len(prompts) == n:
            break
        text, answer = candidates[int(k)]
        counted = await count(text) if count is not None else None
        length = counted if counted is not None else estimate_tokens(text)
        if not 4 <= length <= input_range[1]:
            continue
        answer_count = await count(answer) if count is not None else None
        out = answer_count if answer_count is not None else estimate_tokens(answer)
        if max(4, output_range[0]) <= out <= output_range[1]:
            prompts.append(PromptSpec(text, length, out, exact=counted is not None))
    if len(prompts) < n:
        raise ValueError(f"ShareGPT file {path} has only {len(prompts)} usable prompts, {n} asked")
    return prompts


async def sample_prompts(
    dataset: str, n: int, input_range: tuple[int, int], output_range: tuple[int, int],
    seed: int, count: CountTokens | None,
) -> PromptSet:
    """Prompts for `text[:PATH]`, `random` or `sharegpt:PATH`, fixed by the seed."""
    kind, _, path = dataset.partition(":")
    if kind == "text":
        prompts = await sample_text(load_words(path or None), n, input_range, output_range, seed, count)
    elif kind == "random":
        prompts = await sample_random(load_words(path or None), n, input_range, output_range, seed, count)
    elif kind == "shared-system":
        from loadgen.conversations import sample_shared_system

        prompts = await sample_shared_system(load_words(None), n, input_range, output_range, seed, count,
                                             int(path) if path else 256)
    elif kind == "multiturn":
        from loadgen.conversations import sample_multiturn

        prompts = await sample_multiturn(load_words(None), n, input_range, output_range, seed, count,
                                         int(path) if path else 4)
    elif kind == "sharegpt" and path:
        prompts = await sample_sharegpt(path, n, input_range, output_range, seed, count)
    else:
        raise ValueError(f"unknown dataset {dataset!r}: use text[:PATH], random, sharegpt:PATH, "
                         "shared-system[:TOKENS] or multiturn[:TURNS]")
    result = PromptSet(prompts, dataset)
    if not result.exact:
        result.warnings.append(NO_TOKENIZE_WARNING)
    return result
