"""The streaming HTTP client: one POST per request, timed event by event.

It speaks the OpenAI API only (`/v1/completions` or `/v1/chat/completions`), always
with `stream: true` and `stream_options.include_usage`, so the output token count is
the server's own `usage.completion_tokens`.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import httpx

from loadgen.records import RequestRecord
from loadgen.sse import SSEEvent, aiter_events

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"


@dataclass(frozen=True)
class Target:
    base_url: str  # e.g. http://127.0.0.1:8000, without /v1
    endpoint: str = COMPLETIONS_PATH
    model: str | None = None
    api_key: str | None = None

    @property
    def url(self) -> str:
        return self.base_url.rstrip("/") + self.endpoint

    @property
    def is_chat(self) -> bool:
        return self.endpoint.rstrip("/").endswith("/chat/completions")

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


@dataclass
class LiveCounters:
    """What the progress display shows while the run goes on."""

    sent: int = 0
    in_flight: int = 0
    done: int = 0
    failed: int = 0
    content_events: int = 0  # about one per output token


def build_payload(target: Target, prompt: str, max_tokens: int, ignore_eos: bool) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0.0,
    }
    if target.model:
        payload["model"] = target.model
    if target.is_chat:
        payload["messages"] = [{"role": "user", "content": prompt}]
        # Both names: vLLM prefers the new one, older servers know only max_tokens.
        payload["max_completion_tokens"] = max_tokens
        payload["max_tokens"] = max_tokens
    else:
        payload["prompt"] = prompt
        payload["max_tokens"] = max_tokens
    if ignore_eos:
        # A vLLM extension that llama-server honours too: its server docs list `ignore_eos`
        # ("ignore end of stream token and continue generating") among the request options,
        # and its OpenAI-compatible endpoints read the same fields.
        payload["ignore_eos"] = True
    return payload


def extract_text(chunk: dict[str, Any]) -> str:
    """The new text of a stream chunk, whichever dialect carries it."""
    choices = chunk.get("choices")
    if choices:
        choice = choices[0]
        if isinstance(choice.get("text"), str):
            return choice["text"]
        for key in ("delta", "message"):
            content = (choice.get(key) or {}).get("content")
            if isinstance(content, str):
                return content
        return ""
    content = chunk.get("content")  # llama-server's native /completion dialect
    return content if isinstance(content, str) else ""


def error_message(body: bytes, status: int) -> str:
    """The message of an OpenAI-shaped error body, or the raw body."""
    try:
        data = json.loads(body)
        err = data.get("error", data) if isinstance(data, dict) else data
        if isinstance(err, dict) and "message" in err:
            return f"HTTP {status}: {err['message']}"
    except (ValueError, UnicodeDecodeError):
        pass
    return f"HTTP {status}: {body[:300].decode('utf-8', 'replace')}"


class StreamHandler:
    """Applies the SSE events of one response to its record."""

    def __init__(self, record: RequestRecord, counters: LiveCounters | None) -> None:
        self.record = record
        self.counters = counters
        self.done = False

    def handle(self, event: SSEEvent, elapsed: float) -> None:
        record = self.record
        record.last_event_time = elapsed
        if event.data.strip() == "[DONE]":
            self.done = True
            return
        try:
            chunk = json.loads(event.data)
        except ValueError:
            record.error = record.error or f"unparsable SSE data: {event.data[:200]!r}"
            return
        if not isinstance(chunk, dict):
            return
        if "error" in chunk:
            err = chunk["error"]
            msg = err.get("message", str(err)) if isinstance(err, dict) else str(err)
            record.error = record.error or f"stream error: {msg}"
            return
        self._apply_chunk(chunk, elapsed)

    def _apply_chunk(self, chunk: dict[str, Any], elapsed: float) -> None:
        record = self.record
        text = extract_text(chunk)
        if text:
            record.content_times.append(elapsed)
            record.generated_chars += len(text)
            if self.counters:
                self.counters.content_events += 1
        for choice in chunk.get("choices") or []:
            if choice.get("finish_reason"):
                record.finish_reason = choice["finish_reason"]
        usage = chunk.get("usage")
        if isinstance(usage, dict) and usage.get("completion_tokens") is not None:
            record.usage_reported = True
            record.output_tokens = int(usage["completion_tokens"])
            if usage.get("prompt_tokens") is not None:
                record.prompt_tokens = int(usage["prompt_tokens"])
        if chunk.get("stop") is True:  # llama-server's native end of stream
            self.done = True


async def send_request(
    http: httpx.AsyncClient,
    target: Target,
    payload: dict[str, Any],
    record: RequestRecord,
    run_start: float,
    counters: LiveCounters | None = None,
) -> RequestRecord:
    """POST one streaming request and fill its record; never raises for HTTP faults."""
    handler = StreamHandler(record, counters)
    # The clock starts just before the POST.
    t0 = time.perf_counter()
    record.start = t0 - run_start
    try:
        async with http.stream("POST", target.url, json=payload, headers=target.headers()) as resp:
            record.http_status = resp.status_code
            if resp.status_code != 200:
                record.error = error_message(await resp.aread(), resp.status_code)
                return record
            async for event, elapsed in aiter_events(resp, t0):
                handler.handle(event, elapsed)
    except Exception as exc:  # noqa: BLE001 - one failed request must not stop the run
        detail = str(exc)
        record.error = f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__
        return record
    if record.error is None and not handler.done and not record.content_times:
        record.error = "stream ended without any event"
    record.success = record.error is None
    return record
