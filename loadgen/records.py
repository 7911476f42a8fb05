"""The per-request record: what the client saw, in seconds from the moment it sent the POST."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class RequestRecord:
    index: int
    prompt_len: int  # tokens planned for the prompt (exact when cut with /tokenize)
    max_tokens: int  # output tokens requested
    arrival: float  # scheduled send time, seconds from the run start
    start: float | None = None  # actual send time, seconds from the run start
    # Times of the SSE events whose choices carry text, seconds after `start`.
    content_times: list[float] = field(default_factory=list)
    last_event_time: float | None = None  # any SSE event, seconds after `start`
    output_tokens: int | None = None  # usage.completion_tokens
    prompt_tokens: int | None = None  # usage.prompt_tokens
    usage_reported: bool = False
    generated_chars: int = 0
    finish_reason: str | None = None
    queue_time: float | None = None  # only when the server reports it per request
    success: bool = False
    error: str | None = None
    http_status: int | None = None

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(ttft=self.ttft, e2e=self.e2e, tpot=self.tpot)
        return out

    @property
    def ttft(self) -> float | None:
        """Time to the first event whose choices carry text."""
        return self.content_times[0] if self.content_times else None

    @property
    def itls(self) -> list[float]:
        """Gaps between consecutive content events."""
        t = self.content_times
        return [b - a for a, b in zip(t, t[1:], strict=False)]

    @property
    def e2e(self) -> float | None:
        """Time of the last event minus the start."""
        return self.last_event_time

    @property
    def tpot(self) -> float | None:
        """(e2e - ttft) / (output_tokens - 1), defined for requests of two tokens or more."""
        n = self.counted_output_tokens
        if self.ttft is None or self.e2e is None or n < 2:
            return None
        return (self.e2e - self.ttft) / (n - 1)

    @property
    def counted_output_tokens(self) -> int:
        """usage.completion_tokens; the number of content events when usage is missing."""
        return self.output_tokens if self.output_tokens is not None else len(self.content_times)
