"""vLLM's speculative-decoding counters (v1/spec_decode/metrics.py), kept by the drafter and
exported by the server under pagode's prefix."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SpecCounters:
    """Cumulative since start; a step's share is the difference of two copies."""

    num_drafts: int = 0  # request-steps with at least one draft token
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)  # index = draft position

    def count(self, num_draft: int, num_accepted: int) -> None:
        """One verified draft: accepted tokens are a prefix, so positions 0..accepted-1 count."""
        self.num_drafts += 1
        self.num_draft_tokens += num_draft
        self.num_accepted_tokens += num_accepted
        for pos in range(num_accepted):
            self.accepted_per_pos[pos] += 1

    def copy(self) -> SpecCounters:
        return SpecCounters(self.num_drafts, self.num_draft_tokens, self.num_accepted_tokens,
                            list(self.accepted_per_pos))

    def minus(self, before: SpecCounters) -> SpecCounters:
        return SpecCounters(self.num_drafts - before.num_drafts,
                            self.num_draft_tokens - before.num_draft_tokens,
                            self.num_accepted_tokens - before.num_accepted_tokens,
                            [a - b for a, b in zip(self.accepted_per_pos, before.accepted_per_pos, strict=True)])

    @property
    def acceptance_rate(self) -> float:
        return acceptance_rate(self.num_accepted_tokens, self.num_draft_tokens)

    @property
    def mean_acceptance_length(self) -> float:
        return mean_acceptance_length(self.num_accepted_tokens, self.num_drafts)


def acceptance_rate(accepted: float, draft_tokens: float) -> float:
    """vLLM's definition: accepted draft tokens over proposed draft tokens (0 with no drafts)."""
    return accepted / draft_tokens if draft_tokens else 0.0


def mean_acceptance_length(accepted: float, drafts: float) -> float:
    """vLLM's definition: tokens per drafted request-step, the accepted drafts plus the one
    the target adds itself (0 with no drafts)."""
    return 1.0 + accepted / drafts if drafts else 0.0
