"""Per-request state beside the Sequence: detokenizer, RNG, and the stopping rules."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.bad_words import banned_now
from engine.core.detokenizer import IncrementalDetokenizer
from engine.core.sampling_row import SamplingRow
from engine.core.sequence import Sequence
from engine.structured_output import GrammarState, StructuredOutputError
from engine.thinking_budget import ThinkingTracker
from engine.types.outputs import StreamDelta, TokenLogprob


@dataclass
class RequestState:
    seq: Sequence
    detokenizer: IncrementalDetokenizer
    generator: torch.Generator | None
    max_tokens: int
    eos_ids: frozenset[int]
    grammar: GrammarState | None = None  # set when the output is constrained
    prompt_logprobs: list[TokenLogprob | None] | None = None  # collected during prefill
    prompt_logprobs_sent: bool = False
    thinking: ThinkingTracker | None = None  # set when the thinking has a budget

    def sampling_row(self) -> SamplingRow:
        p = self.seq.params
        blocked: list[int] = []
        if self.seq.num_output_tokens < p.min_tokens:
            blocked = sorted(set(p.stop_token_ids) | (set() if p.ignore_eos else set(self.eos_ids)))
        forced = self.thinking.forced() if self.thinking is not None else None
        banned = banned_now(p.bad_words_token_ids, self.seq.output_token_ids) \
            if p.bad_words_token_ids else []
        if not p.needs_penalties:  # the sampler reads the token lists only for penalties
            return SamplingRow(p, [], [], self.generator, blocked, forced, banned)
        return SamplingRow(p, self.seq.prompt_token_ids, self.seq.output_token_ids, self.generator,
                           blocked, forced, banned)

    def append(self, token_id: int, max_model_len: int) -> str | None:
        """Add a generated token; return the finish reason if this token ends the request."""
        seq, p = self.seq, self.seq.params
        seq.append_token(token_id)
        if self.thinking is not None:
            self.thinking.observe(token_id)
        if self.grammar is not None:
            if not self.grammar.accept(token_id):
                raise StructuredOutputError(f"token {token_id} was sampled against the grammar")
            if self.grammar.is_terminated:  # it took a stop token: done, even with ignore_eos
                return "stop"
        # A stop token ends the output without its text, as in vLLM.
        if not p.ignore_eos and token_id in self.eos_ids:
            return "stop"
        if token_id in p.stop_token_ids:
            seq.stop_reason = token_id
            return "stop"
        before = len(self.detokenizer.text)
        self.detokenizer.add(token_id)
        if seq.num_output_tokens >= p.min_tokens:
            matched = self.detokenizer.find_stop(len(self.detokenizer.text) - before)
            if matched is not None:
                seq.stop_reason = matched
                return "stop"
        if seq.num_output_tokens >= self.max_tokens or len(seq) >= max_model_len:
            return "length"
        return None

    def delta(self, new_ids: list[int], logprobs: list[TokenLogprob] | None) -> StreamDelta:
        seq = self.seq
        finished = seq.finish_reason is not None
        return StreamDelta(
            request_id=seq.request_id,
            text=self.detokenizer.take_new_text(finished),
            token_ids=new_ids,
            finished=finished,
            finish_reason=seq.finish_reason,
            stop_reason=seq.stop_reason,
            logprobs=logprobs,
            prompt_token_ids=seq.prompt_token_ids,
            num_output_tokens=seq.num_output_tokens,
            times=seq.times,
            error=seq.error,
            error_param=seq.error_param,
            num_cached_tokens=seq.num_cached_tokens,
            prompt_logprobs=self.take_prompt_logprobs(),
        )

    def take_prompt_logprobs(self) -> list[TokenLogprob | None] | None:
        if self.prompt_logprobs is None or self.prompt_logprobs_sent:
            return None
        self.prompt_logprobs_sent = True
        return self.prompt_logprobs
