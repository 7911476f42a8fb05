"""A generation request that ServerState.admit let in: past the 503, the 404, its own checks
and the queue bound, it holds the engine that serves it and what its checks found (`plan`),
and starts its choices once they are translated."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from server.runtime.admission import Admission
from server.runtime.engine_client import EngineClient
from server.runtime.generation import Choice, ChoiceStream, GenerationService


class Plan(Protocol):
    """What a request's checks found before tokenizing; the queue bound reads its size."""

    @property
    def num_seqs(self) -> int: ...


P = TypeVar("P", bound=Plan)


@dataclass
class Admitted(Generic[P]):
    engine: EngineClient
    plan: P
    queue: Admission
    generation: GenerationService

    def start_choices(self, choices: Sequence[Choice]) -> ChoiceStream:
        """Take the queue slots (429 if the queue filled while this request was tokenized)
        and run the choices."""
        slots = self.queue.take_slots(len(choices))
        return self.generation.start(choices, slots)
