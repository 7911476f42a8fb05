"""Datasets whose prompts share prefixes, so that prefix caching shows in the results.

- `shared-system[:N]`: every prompt starts with the same system prompt of about N tokens
  (default 256), followed by its own span of prose of the drawn length.
- `multiturn[:K]`: conversations of K turns (default 4). Turn k's prompt is the whole
  conversation so far (the earlier user turns and answers, verbatim) plus a new user
  message of the drawn length, so each turn reuses the previous one as a shared prefix.
  The answers are spans of prose of the drawn output length (the client cannot know the
  model's real answers before the run). Requests are ordered turn by turn: all first
  turns, then all second turns..., so a turn is sent after the one it extends.
"""

from __future__ import annotations

from collections.abc import Awaitable

import numpy as np

from loadgen.spans import CountTokens, PromptSpec, build_prompt, draw_lengths, gather_bounded
from loadgen.tokenizer import TOKENS_PER_WORD, estimate_tokens


async def counted(text: str, count: CountTokens | None) -> tuple[int, bool]:
    n = await count(text) if count is not None else None
    return (n, True) if n is not None else (estimate_tokens(text), False)


async def sample_shared_system(
    words: list[str], n: int, input_range: tuple[int, int], output_range: tuple[int, int],
    seed: int, count: CountTokens | None, system_tokens: int = 256,
) -> list[PromptSpec]:
    rng = np.random.default_rng(seed)
    inputs, outputs = draw_lengths(rng, n, input_range, output_range)
    system = await build_prompt(words, system_tokens, 0, count)
    span = 4 * input_range[1] + 16
    starts = rng.integers(len(words) // 2, max(len(words) // 2 + 1, len(words) - span), size=n)
    users = await gather_bounded([build_prompt(words[s:s + span], int(i), int(o), count)
                                  for s, i, o in zip(starts, inputs, outputs, strict=True)])

    async def join(user: PromptSpec) -> PromptSpec:
        text = f"{system.prompt}\n\n{user.prompt}"
        length, exact = await counted(text, count)
        return PromptSpec(text, length, user.output_len, exact)

    return await gather_bounded([join(u) for u in users])


async def sample_multiturn(
    words: list[str], n: int, input_range: tuple[int, int], output_range: tuple[int, int],
    seed: int, count: CountTokens | None, turns: int = 4,
) -> list[PromptSpec]:
    rng = np.random.default_rng(seed)
    num_conv = -(-n // turns)
    inputs, outputs = draw_lengths(rng, num_conv * turns, input_range, output_range)
    span = 4 * input_range[1] + 16
    starts = rng.integers(0, max(1, len(words) - span), size=num_conv * turns)
    users = await gather_bounded([build_prompt(words[s:s + span], int(i), int(o), count)
                                  for s, i, o in zip(starts, inputs, outputs, strict=True)])
    by_turn: list[list[Awaitable[PromptSpec]]] = [[] for _ in range(turns)]
    for c in range(num_conv):
        history = ""
        for t in range(turns):
            user = users[c * turns + t]
            text = f"{history}User: {user.prompt}\nAssistant:"
            by_turn[t].append(_spec(text, user.output_len, count))
            answer_words = max(1, round(user.output_len / TOKENS_PER_WORD))
            a0 = int(rng.integers(0, max(1, len(words) - answer_words)))
            history = f"{text} {' '.join(words[a0:a0 + answer_words])}\n"
    ordered = [job for turn in by_turn for job in turn][:n]
    return await gather_bounded(ordered)


async def _spec(text: str, output_len: int, count: CountTokens | None) -> PromptSpec:
    length, exact = await counted(text, count)
    return PromptSpec(text, length, output_len, exact)
