"""Which sequences draft this step, how many tokens, and the counters of what was accepted.

Drafts are exact only for greedy decoding (the target's argmax decides), so only greedy
requests draft; so do they only when nothing else depends on the tokens before them in the
same pass: no penalties (they read the output so far), no grammar (its mask follows each
accepted token), no min_tokens still to reach (the stop-token block changes once it is).
Those requests decode one token at a time in the same step as everyone else.

Load-aware: the scheduler offers drafts only from the budget left once every decode and
prefill of the step is placed. Each draft is then weighed against the start-up cost curves
(engine/tuning/step_cost.py): a step of T tokens that emits B tokens runs at B / cost(T); a
draft of d tokens whose sequence has recently had a fraction r of its draft tokens
accepted makes that (B + r d) / cost(T + d). A step of decodes and drafts only is priced
on the fused decode step's curve while it fits that step (which verifies drafts as decode
rows), on the general path's past it. The draft is kept, at the length that maximises the
rate, only when the rate rises. One stream pays a few percent of a step for drafts that
usually land; a full step, whose cost grows with every token, drafts only what is nearly
certain to be accepted, so saturation turns drafting off by itself.

A sequence whose recent acceptance falls under MIN_ACCEPTANCE stops drafting for
BACKOFF_STEPS steps and then starts afresh: open prose whose n-grams recur by chance does
not keep paying for drafts that never land, yet a sequence that starts copying later is
picked up again.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.core.sequence import Sequence
from engine.core.step_result import Picked, Request, RowLogprob
from engine.spec.ngram import NgramProposer
from engine.spec.verifier import verify
from engine.speculative_config import SpeculativeConfig
from engine.tuning.step_cost import StepCost
from engine.types.spec_counters import SpecCounters

PRIOR_ACCEPTANCE = 0.5  # a sequence's expected acceptance before its first draft is verified
ACCEPTANCE_EMA = 0.5  # weight of the newest draft in a sequence's acceptance average
MIN_ACCEPTANCE = 0.2  # below this average the sequence backs off
BACKOFF_STEPS = 8  # steps without drafts after a back-off
MIN_GAIN = 0.02  # the rate must rise by this fraction, more than the cost curve's noise


@dataclass
class StepLoad:
    """The step being scheduled, as the drafts see it."""

    tokens: int  # tokens in the forward pass, drafts taken so far included
    outputs: float  # tokens it is expected to emit: one per sampled sequence plus expected accepted drafts
    decode_only: bool = False  # no prefill chunk, only decodes and drafts: it may run the fused step


class Drafter:
    def __init__(self, config: SpeculativeConfig, max_model_len: int, cost: StepCost) -> None:
        self.k = config.num_speculative_tokens
        self.proposer = NgramProposer(config.prompt_lookup_min, config.prompt_lookup_max)
        self.max_model_len = max_model_len
        self.cost = cost
        self.counters = SpecCounters(accepted_per_pos=[0] * self.k)

    def eligible(self, seq: Sequence) -> bool:
        p = seq.params
        return (p.greedy and p.speculative and not p.needs_penalties and p.structured_outputs is None
                and p.thinking_budget is None  # its forced tokens are chosen per step, not verified
                and not p.restricts_tokens  # bad_words' bans follow each token drafted
                and seq.num_output_tokens >= p.min_tokens)

    def start_step(self, tokens: int, outputs: int) -> StepLoad:
        return StepLoad(tokens, float(outputs), decode_only=tokens == outputs)

    def propose(self, seq: Sequence, budget: int, load: StepLoad) -> list[int]:
        """The draft for a decoding seq: within the budget, the output limits, and only as
        long as it raises the step's expected tokens per second."""
        if seq.spec_backoff > 0:
            seq.spec_backoff -= 1
            return []
        if not self.eligible(seq):
            return []
        room = min(self.k, budget, self.max_model_len - len(seq) - 1, seq_tokens_left(seq))
        # Weighed before the lookup too: a full step refuses every draft, and then the
        # proposer's few microseconds per sequence would be all that speculation adds.
        room = self.best_length(load, max(room, 0), seq.spec_acceptance)
        if room <= 0:
            return []
        draft = self.proposer.propose(seq.token_ids, room)
        return draft[:self.best_length(load, len(draft), seq.spec_acceptance)]

    def best_length(self, load: StepLoad, longest: int, rate: float) -> int:
        """The draft length up to `longest` with the best expected tokens per second, 0 when
        no length beats the step without it by MIN_GAIN."""
        best_rate = load.outputs / self.cost.step(load.tokens, load.decode_only) * (1.0 + MIN_GAIN)
        best = 0
        for d in range(1, longest + 1):
            rate_d = (load.outputs + rate * d) / self.cost.step(load.tokens + d, load.decode_only)
            if rate_d > best_rate:
                best_rate, best = rate_d, d
        return best

    def take(self, seq: Sequence, num_draft: int, load: StepLoad) -> None:
        """A draft joined the step: later drafts weigh against the bigger step."""
        load.tokens += num_draft
        load.outputs += seq.spec_acceptance * num_draft

    def verify(self, request: Request, draft: list[int], rows: list[Picked | BaseException],
               max_model_len: int) -> tuple[list[int], list[RowLogprob] | None, str | None]:
        """The draft checked against the rows the model sampled for it (engine/spec/verifier.py);
        the sequence's acceptance learns how much of it held."""
        tokens, logprobs, reason = verify(request, draft, rows, max_model_len)
        self.record(request.seq, len(draft), sum(1 for t, d in zip(tokens, draft, strict=False) if t == d))
        return tokens, logprobs, reason

    def record(self, seq: Sequence, num_draft: int, num_accepted: int) -> None:
        """Count a verified draft and update the sequence's acceptance average."""
        self.counters.count(num_draft, num_accepted)
        rate = num_accepted / num_draft
        seq.spec_acceptance = (1 - ACCEPTANCE_EMA) * seq.spec_acceptance + ACCEPTANCE_EMA * rate
        if seq.spec_acceptance < MIN_ACCEPTANCE:
            seq.spec_backoff = BACKOFF_STEPS
            seq.spec_acceptance = PRIOR_ACCEPTANCE  # start afresh after the back-off


def seq_tokens_left(seq: Sequence) -> int:
    """Drafts past max_tokens would be computed for nothing (they are never emitted)."""
    max_tokens = seq.params.max_tokens
    if max_tokens is None:
        return 1 << 30
    return max_tokens - seq.num_output_tokens - 1
