"""A reasoning model's thinking, cut at a budget of tokens: once the output has thought for
`max_tokens` tokens after its start marker, the end marker is forced, token by token, and
the answer follows. The same rule as vLLM's thinking-token budget and llama.cpp's
reasoning budget; Anthropic's `thinking.budget_tokens` asks for it.

The budget names its markers by token ids (the tokenizer's `<think>` and `</think>` for
the Qwen3 and DeepSeek-R1 families), so the engine needs no knowledge of any family. A
template that opens the thinking itself (its prompt ends inside it) says so with
`open_in_prompt`.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.types.errors import InvalidRequestError


@dataclass(frozen=True)
class ThinkingBudget:
    max_tokens: int
    start_ids: tuple[int, ...]  # what opens the thinking in the output
    end_ids: tuple[int, ...]  # what closes it: forced once the budget is spent
    open_in_prompt: bool = False  # the prompt ends inside the thinking already

    def __post_init__(self) -> None:
        if self.max_tokens < 0:
            raise InvalidRequestError(f"the thinking budget must be non-negative, got "
                                      f"{self.max_tokens}", "thinking_token_budget")
        if not self.end_ids or (not self.start_ids and not self.open_in_prompt):
            raise InvalidRequestError("the thinking budget needs the tokens that open and "
                                      "close thinking", "thinking_token_budget")


class ThinkingTracker:
    """Where one request's output stands against its budget, advanced token by token (a
    scan of the whole output at every step would grow with its length)."""

    def __init__(self, budget: ThinkingBudget) -> None:
        self.budget = budget
        self.thinking = budget.open_in_prompt
        self.done = False
        self.count = 0  # tokens since the thinking opened, forced ones included
        self.closing = 0  # how many of the end marker's tokens have been written since the budget ran out
        self.tail: list[int] = []  # the last few tokens, to see a marker arrive

    def observe(self, token_id: int) -> None:
        if self.done:
            return
        keep = max(len(self.budget.start_ids), len(self.budget.end_ids))
        self.tail = [*self.tail, token_id][-keep:]
        if not self.thinking:
            if self.ends_with(self.budget.start_ids):
                self.thinking, self.tail = True, []
            return
        self.count += 1
        if self.ends_with(self.budget.end_ids):
            self.done = True
        elif self.count > self.budget.max_tokens:
            # A token other than the one forced (a grammar or allowed_token_ids ruled the end
            # marker out, and outranks the budget) starts the marker over at the next step.
            wanted = self.budget.end_ids[self.closing]
            self.closing = self.closing + 1 if token_id == wanted else 0

    def ends_with(self, marker: tuple[int, ...]) -> bool:
        return bool(marker) and tuple(self.tail[-len(marker):]) == marker

    def forced(self) -> int | None:
        """The token the next step must take, or None while the budget lasts."""
        if not self.thinking or self.done or self.count < self.budget.max_tokens:
            return None
        return self.budget.end_ids[self.closing]
