"""Greedy verification of a drafted decode, once its rows are sampled.

The target's token is emitted at each checked position until one differs from the draft
(that one is still the target's, so it is kept), or a stop rule ends the output. Each token
goes through the same append as a plain decode, so stop strings, EOS, max_tokens and
logprobs come out exactly as without a draft.
"""

from __future__ import annotations

from engine.core.step_result import Picked, Request, RowLogprob


def verify(request: Request, draft: list[int], rows: list[Picked | BaseException],
           max_model_len: int) -> tuple[list[int], list[RowLogprob] | None, str | None]:
    """(the tokens emitted, their logprobs when asked for, the finish reason or None)."""
    tokens: list[int] = []
    logprobs: list[RowLogprob] = []
    reason = None
    for j, picked in enumerate(rows):
        if isinstance(picked, BaseException):
            raise picked
        token, lp = picked
        reason = request.append(token, max_model_len)
        tokens.append(token)
        if lp is not None:
            logprobs.append(lp)
        if reason is not None or j == len(draft) or token != draft[j]:
            break
    return tokens, logprobs or None, reason
