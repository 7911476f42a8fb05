"""What one request may ask of the engine, checked in one place.

The server checks every request against these limits before any response starts, and the
engine checks again when it admits a request (an offline caller of LLMEngine skips the
server). Both use the one RequestLimits the engine builds from its model and its cache, so
the vocabulary size and the context length have a single source: token ids must index the
embedding table *and* decode with the tokenizer, so the vocabulary is the smaller of the two.

`RequestCaps` are the knobs (each is a `pagode serve` flag); `RequestLimits` adds what the
loaded model and cache fix. Every refusal is an InvalidRequestError naming the field and,
for a cap, the flag that raises it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.sampling_params import SamplingParams
from engine.types.errors import InvalidRequestError

REFLECT_CHARS = 100  # reflected user input is cut to this many characters


@dataclass(frozen=True)
class RequestCaps:
    """Per-request caps; 0 for max_prompt_chars means "derived from max_model_len"."""

    max_n: int = 128  # OpenAI's own limit for n
    max_seqs_per_request: int = 256  # prompts x n
    max_stop: int = 16  # stop strings (OpenAI allows 4; vLLM has no limit)
    max_stop_chars: int = 256  # length of one stop string
    max_stop_token_ids: int = 256
    max_logit_bias: int = 1024  # entries in logit_bias
    max_prompt_chars: int = 0  # characters of one text prompt, checked before tokenizing

    def __post_init__(self) -> None:
        for name in ("max_n", "max_seqs_per_request", "max_stop", "max_stop_chars",
                     "max_stop_token_ids", "max_logit_bias"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if self.max_prompt_chars < 0:
            raise ValueError("max_prompt_chars must be non-negative (0: derived)")


CHARS_PER_TOKEN_BOUND = 32  # a prompt longer than this many characters per token cannot fit


@dataclass(frozen=True)
class RequestLimits:
    vocab_size: int
    max_model_len: int
    max_prompt_tokens: int  # the longest prompt the KV cache can admit
    caps: RequestCaps = field(default_factory=RequestCaps)

    @property
    def max_prompt_chars(self) -> int:
        return self.caps.max_prompt_chars or self.max_model_len * CHARS_PER_TOKEN_BOUND


def clip(text: object, limit: int = REFLECT_CHARS) -> str:
    """User input for an error message, cut so that a huge value is never echoed whole."""
    value = text if isinstance(text, str) else repr(text)
    value = value.encode("utf-8", "backslashreplace").decode("utf-8")
    return value if len(value) <= limit else f"{value[:limit]}... ({len(value)} characters)"


def too_many(what: str, count: int, cap: int, flag: str, param: str) -> InvalidRequestError:
    return InvalidRequestError(f"{what}: {count} exceeds the limit of {cap} (--{flag})", param)


def check_prompt_chars(text: str, limits: RequestLimits, param: str = "prompt") -> None:
    if len(text) > limits.max_prompt_chars:
        flag = "max-prompt-chars" if limits.caps.max_prompt_chars else \
            "max-prompt-chars (default: 32 x max_model_len)"
        raise too_many("prompt characters", len(text), limits.max_prompt_chars, flag, param)


def check_token_ids(token_ids: list[int], limits: RequestLimits, param: str) -> None:
    vocab = limits.vocab_size
    bad = [t for t in token_ids if not 0 <= t < vocab]
    if bad:
        raise InvalidRequestError(
            f"{param}: token ids must be in [0, {vocab}), got {clip(bad[:5])}", param)


def check_sampling(params: SamplingParams, limits: RequestLimits) -> None:
    """The sampling fields that depend on the model or on a cap (ranges are SamplingParams')."""
    caps = limits.caps
    if len(params.stop) > caps.max_stop:
        raise too_many("stop strings", len(params.stop), caps.max_stop, "max-stop", "stop")
    longest = max((len(s) for s in params.stop), default=0)
    if longest > caps.max_stop_chars:
        raise too_many("characters in a stop string", longest, caps.max_stop_chars,
                       "max-stop-chars", "stop")
    if len(params.stop_token_ids) > caps.max_stop_token_ids:
        raise too_many("stop_token_ids", len(params.stop_token_ids), caps.max_stop_token_ids,
                       "max-stop-token-ids", "stop_token_ids")
    check_token_ids(params.stop_token_ids, limits, "stop_token_ids")
    if len(params.logit_bias) > caps.max_logit_bias:
        raise too_many("logit_bias entries", len(params.logit_bias), caps.max_logit_bias,
                       "max-logit-bias", "logit_bias")
    check_token_ids(list(params.logit_bias), limits, "logit_bias")
    check_token_ids(params.allowed_token_ids or [], limits, "allowed_token_ids")


def check_prompt(token_ids: list[int], max_tokens: int | None, limits: RequestLimits) -> int:
    """Check a tokenized prompt against the vocabulary and the context; return the effective
    max_tokens."""
    if not token_ids:
        raise InvalidRequestError("the prompt is empty", "prompt")
    check_token_ids(token_ids, limits, "prompt")
    return check_context(len(token_ids), max_tokens, limits.max_model_len, limits.max_prompt_tokens)


def check_context(n: int, max_tokens: int | None, limit: int, max_prompt_tokens: int) -> int:
    """Can a prompt of n tokens and max_tokens more ever be served, in a context of `limit`
    positions and a cache that admits at most `max_prompt_tokens` (Scheduler.max_prompt_tokens)?
    Returns the effective max_tokens; the planner's simulator asks the same question."""
    if n >= limit:
        raise InvalidRequestError(
            f"This model's maximum context length is {limit} tokens. However, your request has "
            f"{n} input tokens. Please reduce the length of the input messages.", "input_tokens")
    if max_tokens is not None and n + max_tokens > limit:
        raise InvalidRequestError(
            f"'max_tokens' is too large: {max_tokens}. This model's maximum context length "
            f"is {limit} tokens and your request has {n} input tokens "
            f"({max_tokens} > {limit} - {n}).", "max_tokens")
    if n > max_prompt_tokens:
        raise InvalidRequestError(f"the prompt of {n} tokens does not fit in the KV cache",
                                  "input_tokens")
    return max_tokens if max_tokens is not None else limit - n


def check_request(token_ids: list[int], params: SamplingParams, limits: RequestLimits) -> int:
    """Everything the engine needs to know before admitting a request; returns max_tokens."""
    params.validate()
    check_sampling(params, limits)
    return check_prompt(token_ids, params.max_tokens, limits)
