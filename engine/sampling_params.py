"""Per-request sampling and stopping parameters, with vLLM's field names and ranges.

Every number must be finite. A temperature under GREEDY_EPSILON is greedy, as in vLLM:
dividing logits by 1e-50 overflows and samples garbage. A choice of n > 1 is expanded into
n single-choice parameter sets in one place (`expand_choices`), with one seed rule for the
offline LLM and the server alike.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from engine.structured_output.spec import StructuredOutputSpec
from engine.thinking_budget import ThinkingBudget
from engine.types.errors import InvalidRequestError

MAX_LOGPROBS = 20
GREEDY_EPSILON = 1e-5  # vLLM's _SAMPLING_EPS: a smaller temperature means greedy
LOGIT_BIAS_LIMIT = 100.0  # values are clamped to +-100, as OpenAI does
# Below this the penalty divides logits into infinities (NaN logprobs); above it, the reverse.
REPETITION_PENALTY_RANGE = (0.01, 100.0)
SEED_MODULUS = 2**63  # torch generators take seeds in [0, 2**64); any integer maps here stably


def choice_seed(seed: int | None, index: int) -> int | None:
    """The seed of choice `index` of a request: n choices differ yet stay reproducible."""
    return None if seed is None else (seed + index) % SEED_MODULUS


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: off
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int | None = 16  # None: up to the context
    min_tokens: int = 0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None  # number of top alternatives besides the chosen token
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    skip_special_tokens: bool = True
    structured_outputs: StructuredOutputSpec | None = None  # constrained decoding (xgrammar)
    speculative: bool = True  # may draft when the server speculates (greedy only; docs/speculative.md)
    prompt_logprobs: int | None = None  # logprobs of the prompt's tokens, with N alternatives
    priority: int = 0  # --scheduling-policy priority: lower runs earlier (vLLM's request field)
    thinking_budget: ThinkingBudget | None = None  # the thinking is closed after this many tokens
    allowed_token_ids: list[int] | None = None  # vLLM's: only these may be sampled
    bad_words_token_ids: list[list[int]] = field(default_factory=list)  # vLLM's bad_words, encoded

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        if self.top_k == -1:
            self.top_k = 0
        self.logit_bias = {int(k): float(v) for k, v in (self.logit_bias or {}).items()}
        self.validate()
        if self.temperature < GREEDY_EPSILON:
            self.temperature = 0.0
        self.logit_bias = {k: max(-LOGIT_BIAS_LIMIT, min(LOGIT_BIAS_LIMIT, v))
                           for k, v in self.logit_bias.items()}

    def validate(self) -> None:
        """Raise InvalidRequestError (a ValueError) naming the field, with a message a user
        can act on that begins with it: a server answers it as a 400 as it comes."""
        self._check_finite()
        if self.n < 1:
            raise InvalidRequestError(f"n must be at least 1, got {self.n}", "n")
        if not 0.0 <= self.temperature <= 2.0:
            raise InvalidRequestError(f"temperature must be in [0, 2], got {self.temperature}", "temperature")
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidRequestError(f"top_p must be in (0, 1], got {self.top_p}", "top_p")
        if self.top_k < 0:
            raise InvalidRequestError(f"top_k must be 0 or -1 (off) or positive, got {self.top_k}", "top_k")
        if not 0.0 <= self.min_p <= 1.0:
            raise InvalidRequestError(f"min_p must be in [0, 1], got {self.min_p}", "min_p")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise InvalidRequestError(f"max_tokens must be at least 1, got {self.max_tokens}", "max_tokens")
        if self.min_tokens < 0:
            raise InvalidRequestError(f"min_tokens must be non-negative, got {self.min_tokens}", "min_tokens")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise InvalidRequestError(f"min_tokens ({self.min_tokens}) must not exceed max_tokens "
                                      f"({self.max_tokens})", "min_tokens")
        if any(not s for s in self.stop):
            raise InvalidRequestError("stop strings must not be empty", "stop")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise InvalidRequestError(f"logprobs must be in [0, {MAX_LOGPROBS}], got {self.logprobs}", "logprobs")
        if self.prompt_logprobs is not None and not 0 <= self.prompt_logprobs <= MAX_LOGPROBS:
            raise InvalidRequestError(f"prompt_logprobs must be in [0, {MAX_LOGPROBS}], "
                                      f"got {self.prompt_logprobs}", "prompt_logprobs")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise InvalidRequestError(f"{name} must be in [-2, 2], got {getattr(self, name)}", name)
        low, high = REPETITION_PENALTY_RANGE
        if not low <= self.repetition_penalty <= high:
            raise InvalidRequestError(f"repetition_penalty must be in [{low}, {high}], "
                                      f"got {self.repetition_penalty}", "repetition_penalty")
        if self.seed is not None and not -(2**63) <= self.seed < 2**64:
            raise InvalidRequestError("seed must be in [-2**63, 2**64)", "seed")
        if self.allowed_token_ids is not None and not self.allowed_token_ids:
            raise InvalidRequestError("allowed_token_ids must not be empty", "allowed_token_ids")
        if any(not word for word in self.bad_words_token_ids):
            raise InvalidRequestError("bad_words must not be empty", "bad_words")

    def _check_finite(self) -> None:
        for name in ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty",
                     "repetition_penalty"):
            if not math.isfinite(getattr(self, name)):
                raise InvalidRequestError(f"{name} must be a finite number, got {getattr(self, name)}", name)
        if any(not math.isfinite(v) for v in self.logit_bias.values()):
            raise InvalidRequestError("logit_bias values must be finite numbers", "logit_bias")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def restricts_tokens(self) -> bool:
        """Whether some tokens are ruled out by the request itself (not by a grammar)."""
        return self.allowed_token_ids is not None or bool(self.bad_words_token_ids)

    @property
    def needs_penalties(self) -> bool:
        return (self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
                or self.repetition_penalty != 1.0)


def expand_choices(params: SamplingParams) -> list[SamplingParams]:
    """n single-choice parameter sets; choice i samples with choice_seed(seed, i)."""
    return [dataclasses.replace(params, n=1, seed=choice_seed(params.seed, i))
            for i in range(params.n)]
