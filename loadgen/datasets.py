"""Prompt sampling: spans of prose (`text`), word salad (`random`), ShareGPT turns, or
prompts that share prefixes (`shared-system`, `multiturn`: conversations.py).

Prompt lengths are exact token counts when the server has a /tokenize endpoint: each
span is cut by bisection on words, then on characters, until the server counts exactly
the drawn length (spans.py). Without /tokenize, lengths are estimated and a warning says so.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from loadgen.conversations import sample_multiturn, sample_shared_system
from loadgen.prose import load_words
from loadgen.spans import CountTokens, PromptSpec, build_prompt, draw_lengths, gather_bounded
from loadgen.tokenizer import TOKENS_PER_WORD, estimate_tokens

NO_TOKENIZE_WARNING = (
    "the server has no /tokenize endpoint: prompt lengths are estimated "
    f"({TOKENS_PER_WORD} tokens per word), not exact"
)


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
        prompts = await sample_shared_system(load_words(None), n, input_range, output_range, seed, count,
                                             int(path) if path else 256)
    elif kind == "multiturn":
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
