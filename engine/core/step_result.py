"""What crosses the step's seams: the executor's result, which the scheduler's update reads,
and the update's account of each request, which the output processor turns into outputs.

The result holds plain tokens, not tensors, so that a fake executor (the planner's
simulator) can produce it as the model runner does, and the same scheduler update runs on
both.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from engine.core.sequence import Sequence

# A row's logprobs as sampled: (the token's logprob, the top (token, logprob) pairs).
RowLogprob = tuple[float, list[tuple[int, float]]]
# One sampled row: its token and, when asked for, its logprobs; or the error that failed it.
Picked = tuple[int, RowLogprob | None]


class Request(Protocol):
    """What the update needs of a request: its sequence, and the one place that adds a token
    and says whether the token ends it (the engine's RequestState, the simulator's request)."""

    @property
    def seq(self) -> Sequence: ...

    def append(self, token_id: int, max_model_len: int) -> str | None: ...


R = TypeVar("R", bound=Request)


@dataclass(slots=True)
class StepResult(Generic[R]):
    """The sequences that yield tokens this step, in the batch's order, with one row per
    position checked (1 + the draft's length) in `picks`. When the whole batch was lost,
    `error` says why and `requests` lists every scheduled request, all to fail."""

    requests: list[R] = field(default_factory=list)
    drafts: list[list[int]] = field(default_factory=list)  # each request's draft to verify
    picks: list[Picked | BaseException] = field(default_factory=list)
    error: BaseException | None = None
    prepare_time: float = 0.0
    forward_time: float = 0.0
    sample_time: float = 0.0


@dataclass(slots=True)
class SeqUpdate(Generic[R]):
    """What the step added to one request: its new tokens and, when asked for, their logprobs.
    The request's sequence says whether it finished (and why, or with which error)."""

    request: R
    token_ids: list[int]
    logprobs: list[RowLogprob] | None = None
