"""Which sequences draft this step, how many tokens, and the counters of what was accepted.

Drafts are exact only for greedy decoding (the target's argmax decides), so only greedy
requests draft; so do they only when nothing else depends on the tokens before them in the
same pass: no penalties (they read the output so far), no grammar (its mask follows each
accepted token), no min_tokens still to reach (the stop-token block changes once it is).
Those requests decode one token at a time in the same step as everyone else.

Load-aware: a drafted sequence costs k+1 tokens of the step; once the step already carries
`max_batch_tokens` tokens of decodes and drafts, extra positions stop being nearly free, so no
more drafts are made. A sequence whose recent drafts were mostly rejected backs off for a
while, so prose that never repeats its input does not pay for drafts that never land.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.core.sequence import Sequence
from engine.spec.config import SpeculativeConfig
from engine.spec.ngram import NgramProposer

DEFAULT_MAX_BATCH_TOKENS = 64  # a placeholder until the crossover is measured (docs/speculative.md)
ACCEPTANCE_EMA = 0.5  # weight of the newest draft in a sequence's acceptance average
MIN_ACCEPTANCE = 0.2  # below this average the sequence backs off
BACKOFF_STEPS = 8  # steps without drafts after a back-off


@dataclass
class SpecCounters:
    """vLLM's spec-decode counters (v1/spec_decode/metrics.py), cumulative."""

    num_drafts: int = 0  # request-steps with at least one draft token
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)  # index = draft position

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens per drafted step: the accepted drafts plus the one the target adds."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 0.0


class Drafter:
    def __init__(self, config: SpeculativeConfig, max_model_len: int,
                 max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS) -> None:
        self.k = config.num_speculative_tokens
        self.proposer = NgramProposer(config.prompt_lookup_min, config.prompt_lookup_max)
        self.max_model_len = max_model_len
        self.max_batch_tokens = max_batch_tokens
        self.counters = SpecCounters(accepted_per_pos=[0] * self.k)

    def eligible(self, seq: Sequence) -> bool:
        p = seq.params
        return (p.greedy and p.speculative and not p.needs_penalties and p.structured_outputs is None
                and seq.num_output_tokens >= p.min_tokens and seq.spec_backoff == 0)

    def propose(self, seq: Sequence, budget: int, step_tokens: int) -> list[int]:
        """The draft for a decoding seq, within the step's budget and the load threshold."""
        if seq.spec_backoff > 0:
            seq.spec_backoff -= 1
            return []
        if not self.eligible(seq):
            return []
        room = min(self.k, budget - 1, self.max_batch_tokens - step_tokens,
                   self.max_model_len - len(seq) - 1, seq_tokens_left(seq))
        if room <= 0:
            return []
        return self.proposer.propose(seq.token_ids, room)

    def record(self, seq: Sequence, num_draft: int, num_accepted: int) -> None:
        """Count a verified draft and update the sequence's acceptance average."""
        c = self.counters
        c.num_drafts += 1
        c.num_draft_tokens += num_draft
        c.num_accepted_tokens += num_accepted
        for pos in range(num_accepted):
            c.accepted_per_pos[pos] += 1
        rate = num_accepted / num_draft
        seq.spec_acceptance = (1 - ACCEPTANCE_EMA) * seq.spec_acceptance + ACCEPTANCE_EMA * rate
        if seq.spec_acceptance < MIN_ACCEPTANCE:
            seq.spec_backoff = BACKOFF_STEPS
            seq.spec_acceptance = 1.0  # try again afresh after the back-off


def seq_tokens_left(seq: Sequence) -> int:
    """Drafts past max_tokens would be computed for nothing (they are never emitted)."""
    max_tokens = seq.params.max_tokens
    if max_tokens is None:
        return 1 << 30
    return max_tokens - seq.num_output_tokens - 1
