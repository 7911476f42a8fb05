"""What the scheduler asks of a drafter: drafts for a step's decodes, weighed against the
step's load, and the verification of what the model sampled for them. engine/spec/drafter.py's
Drafter is the one; the engine hands it to the scheduler at construction, so core/ names no
module of engine/spec/ and speculative decoding stays a layer above the bookkeeping."""

from __future__ import annotations

from typing import Any, Protocol

from engine.core.sequence import Sequence
from engine.core.step_result import Picked, Request, RowLogprob
from engine.types.spec_counters import SpecCounters


class DraftSource(Protocol):
    counters: SpecCounters  # read by the statistics (engine/observers/stats_recorder.py)

    def start_step(self, tokens: int, outputs: int) -> Any:
        """The step's load, which propose and take weigh each draft against."""
        ...

    def propose(self, seq: Sequence, budget: int, load: Any) -> list[int]: ...

    def take(self, seq: Sequence, num_draft: int, load: Any) -> None: ...

    def verify(self, request: Request, draft: list[int], rows: list[Picked | BaseException],
               max_model_len: int) -> tuple[list[int], list[RowLogprob] | None, str | None]:
        """(the tokens emitted, their logprobs when asked for, the finish reason or None)."""
        ...
