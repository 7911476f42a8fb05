"""One constrained request's position in its grammar.

The matcher advances only on tokens the sampler generated, never on tokens read again
after a preemption-by-recompute: recomputing rebuilds K/V, not the output, so the matcher
is already where the sequence stands and needs no rollback.
"""

from __future__ import annotations

from typing import Any


class GrammarState:
    def __init__(self, matcher: Any) -> None:
        self.matcher = matcher
        self.num_accepted = 0

    @property
    def is_terminated(self) -> bool:
        return bool(self.matcher.is_terminated())

    def accept(self, token_id: int) -> bool:
        """Advance on a generated token; False if the grammar forbids it."""
        if self.matcher.is_terminated():
            return False
        accepted = bool(self.matcher.accept_token(token_id))
        self.num_accepted += accepted
        return accepted
