"""A request's thinking budget (chat's `thinking_token_budget`, Anthropic's
`thinking.budget_tokens`) as the engine's ThinkingBudget: the reasoning format's tags as
token ids, and whether the rendered prompt already opened the thinking (a template may
write `<think>` itself). A request that does not think has nothing to cut: no budget."""

from __future__ import annotations

from engine.thinking_budget import ThinkingBudget
from engine.tokenizer import Tokenizer

Markers = tuple[str, str]  # the tags that open and close the thinking


def thinking_budget(max_tokens: int | None, markers: Markers | None, tokenizer: Tokenizer,
                    prompt_text: str) -> ThinkingBudget | None:
    if max_tokens is None or markers is None:
        return None
    start, end = markers
    return ThinkingBudget(max_tokens, token_ids(tokenizer, start), token_ids(tokenizer, end),
                          open_in_prompt=prompt_text.rfind(start) > prompt_text.rfind(end))


def token_ids(tokenizer: Tokenizer, text: str) -> tuple[int, ...]:
    return tuple(tokenizer.encode(text, add_special_tokens=False))
