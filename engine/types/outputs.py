"""What the engine hands back: whole outputs offline, deltas when streaming."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TokenLogprob:
    token_id: int
    token: str
    logprob: float
    top: list[tuple[int, str, float]] = field(default_factory=list)  # (id, text, logprob)
    rank: int | None = None  # 1 = the most likely token (prompt logprobs)


@dataclass
class RequestTimes:
    """Monotonic timestamps (time.monotonic()) of a request's life."""

    arrival: float
    scheduled: float | None = None  # first admitted into a batch
    first_token: float | None = None
    last_token: float | None = None
    finished: float | None = None

    @property
    def queue_time(self) -> float | None:
        return None if self.scheduled is None else self.scheduled - self.arrival

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.arrival

    @property
    def e2e(self) -> float | None:
        return None if self.finished is None else self.finished - self.arrival


@dataclass
class CompletionOutput:
    """One choice (index) of a finished request, as `LLM.generate` returns it."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None  # stop | length | abort
    stop_reason: str | int | None = None  # the stop string or token id that matched
    logprobs: list[TokenLogprob] | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    times: RequestTimes | None = None
    prompt_logprobs: list[TokenLogprob | None] | None = None  # with SamplingParams.prompt_logprobs

    # Single-choice conveniences: output.text, output.token_ids, output.finish_reason.
    @property
    def text(self) -> str:
        return self.outputs[0].text

    @property
    def token_ids(self) -> list[int]:
        return self.outputs[0].token_ids

    @property
    def finish_reason(self) -> str | None:
        return self.outputs[0].finish_reason


@dataclass
class StreamDelta:
    """What one engine step produced for one request (one choice)."""

    request_id: str
    text: str  # new text, safe to show (no partial stop string, no broken UTF-8)
    token_ids: list[int]  # new token ids this step
    finished: bool
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    logprobs: list[TokenLogprob] | None = None
    prompt_token_ids: list[int] = field(default_factory=list)
    num_output_tokens: int = 0  # total generated so far
    times: RequestTimes | None = None
    error: str | None = None  # set when this request failed inside the engine
    error_param: str | None = None  # the field at fault, when the request itself was (a 400)
    num_cached_tokens: int = 0  # prompt tokens found in the prefix cache
    prompt_logprobs: list[TokenLogprob | None] | None = None  # first delta only; [0] is None
