"""Running one HTTP request's choices on the engine and merging their deltas.

A request with several prompts or n > 1 fans out into choices (translate/engine_requests.py
builds them), each pumped by its own task into a shared queue. Cancelling a pump (client
gone, shutdown) aborts its engine request at once, so its KV blocks are freed within one
engine step, and ends the choice with finish_reason "abort". Every choice, however it ends,
is accounted exactly once: one request-log line and one set of metric observations. A
request is in flight from its start until its ChoiceStream is closed; the shutdown drain
waits for none to be.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from engine.sampling_params import SamplingParams
from engine.types.errors import InvalidRequestError, RequestFailedError
from engine.types.outputs import StreamDelta
from server.api.errors import APIError, api_error_from
from server.runtime.admission import QueueSlot
from server.runtime.engine_client import EngineClient
from server.runtime.metrics import ServerMetrics
from server.runtime.request_adapter import requested_adapter

request_logger = logging.getLogger("pagode.requests")


class Choice(Protocol):
    """One choice of a request, as it runs on the engine."""

    @property
    def index(self) -> int: ...  # the choice index in the response

    @property
    def request_id(self) -> str: ...  # the engine's request id

    @property
    def prompt_ids(self) -> list[int]: ...

    @property
    def params(self) -> SamplingParams: ...

    @property
    def prompt_text(self) -> str: ...  # for the request log, with --log-requests-text


@dataclass
class ChoiceEvent:
    index: int
    delta: StreamDelta | None = None
    error: APIError | None = None

    @property
    def ends_choice(self) -> bool:
        return self.error is not None or (self.delta is not None and self.delta.finished)


@dataclass
class RequestRecord:
    """What the server saw of one choice, for the request log and the metrics."""

    sub: Choice
    arrival: float = field(default_factory=time.monotonic)
    first_token: float | None = None
    last_token: float | None = None
    num_output_tokens: int = 0
    finish_reason: str = "abort"
    last_delta: StreamDelta | None = None
    output_text: list[str] = field(default_factory=list)

    def add(self, delta: StreamDelta, now: float) -> float | None:
        """Record a delta; return the per-token gap since the previous tokens, if any."""
        gap = None
        new_tokens = len(delta.token_ids)
        if new_tokens:
            if self.last_token is not None:
                gap = (now - self.last_token) / new_tokens
            if self.first_token is None:
                self.first_token = now
            self.last_token = now
        self.num_output_tokens = max(self.num_output_tokens + new_tokens,
                                     delta.num_output_tokens)
        self.last_delta = delta
        self.output_text.append(delta.text)
        if delta.finished:
            self.finish_reason = delta.finish_reason or "stop"
        return gap

    def timings(self) -> tuple[float | None, float | None, float]:
        """(queue time, TTFT, e2e), from the engine's clock where it gave them."""
        now = time.monotonic()
        times = self.last_delta.times if self.last_delta else None
        queue_time = times.queue_time if times else None
        ttft = times.ttft if times and times.ttft is not None else (
            None if self.first_token is None else self.first_token - self.arrival)
        e2e = times.e2e if times and times.e2e is not None else now - self.arrival
        return queue_time, ttft, e2e


def failure(delta: StreamDelta) -> Exception:
    """The engine failed this choice: a 400 where the request was at fault (a grammar that
    allows no next token), otherwise a 500 whose details stay in the log."""
    if delta.error_param is not None:
        return InvalidRequestError(delta.error or "invalid request", delta.error_param)
    return RequestFailedError(delta.error)


def abort_delta(sub: Choice, record: RequestRecord) -> StreamDelta:
    return StreamDelta(request_id=sub.request_id, text="", token_ids=[], finished=True,
                       finish_reason="abort", prompt_token_ids=sub.prompt_ids,
                       num_output_tokens=record.num_output_tokens,
                       times=record.last_delta.times if record.last_delta else None)


def format_seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}s"


class GenerationService:
    """Starts choices on the engine and keeps the live ones, for shutdown."""

    def __init__(self, engine: EngineClient, metrics: ServerMetrics,
                 log_text: bool = False) -> None:
        self.engine = engine
        self.metrics = metrics
        self.log_text = log_text
        self.active: dict[str, asyncio.Task[None]] = {}
        self.in_flight = 0  # requests whose response is not complete yet
        self.idle = asyncio.Event()
        self.idle.set()

    def start(self, choices: Sequence[Choice], slots: list[QueueSlot]) -> ChoiceStream:
        self.in_flight += 1
        self.idle.clear()
        return ChoiceStream(self, choices, slots)

    def end_request(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self.idle.set()

    def abort_all(self) -> int:
        """Cancel every live choice (each ends with finish_reason "abort")."""
        tasks = list(self.active.values())
        for task in tasks:
            task.cancel()
        return len(tasks)

    async def pump(self, sub: Choice, slot: QueueSlot,
                   queue: asyncio.Queue[ChoiceEvent]) -> None:
        record = RequestRecord(sub)
        final: ChoiceEvent | None = None  # the choice's last event, sent after accounting
        try:
            stream = self.engine.generate(sub.prompt_ids, sub.params, sub.request_id,
                                          lora_name=requested_adapter())
            async with contextlib.aclosing(stream):
                async for delta in stream:
                    slot.release()  # it produced output: it is running, no longer queued
                    self.observe_delta(record, delta)
                    if delta.error:
                        raise failure(delta)
                    if delta.finished:
                        final = ChoiceEvent(sub.index, delta)
                        break
                    queue.put_nowait(ChoiceEvent(sub.index, delta))
            if final is None:  # the engine ended the stream without a final delta
                final = ChoiceEvent(sub.index, abort_delta(sub, record))
        except asyncio.CancelledError:
            # Client gone or shutdown: abort now (in `finally`) and end the choice.
            record.finish_reason = "abort"
            final = ChoiceEvent(sub.index, abort_delta(sub, record))
        except Exception as exc:  # noqa: BLE001 - every failure becomes an error event
            record.finish_reason = "error"
            final = ChoiceEvent(sub.index, error=api_error_from(exc, sub.request_id))
            if isinstance(exc, RequestFailedError):
                self.metrics.observe_engine_failure()
        finally:
            slot.release()
            if final is None or final.error is not None or (
                    final.delta is not None and final.delta.finish_reason == "abort"):
                self.abort_in_engine(sub.request_id)
            self.active.pop(sub.request_id, None)
            # Log and count before the last event goes out, so that a client that has
            # its response finds the request in the log and the metrics.
            self.account(record)
            if final is not None:
                queue.put_nowait(final)

    def abort_in_engine(self, request_id: str) -> None:
        try:
            self.engine.abort(request_id)
        except Exception:  # noqa: BLE001 - a dead engine holds no blocks to free
            request_logger.debug("abort of %s failed", request_id, exc_info=True)

    def observe_delta(self, record: RequestRecord, delta: StreamDelta) -> None:
        gap = record.add(delta, time.monotonic())
        if gap is not None:
            self.metrics.observe_itl(gap, len(delta.token_ids))

    def account(self, record: RequestRecord) -> None:
        queue_time, ttft, e2e = record.timings()
        self.metrics.observe_finished(record.finish_reason, len(record.sub.prompt_ids),
                                      record.num_output_tokens, queue_time, ttft, e2e)
        line = (f"request finished id={record.sub.request_id} "
                f"prompt_tokens={len(record.sub.prompt_ids)} "
                f"output_tokens={record.num_output_tokens} "
                f"queue_time={format_seconds(queue_time)} ttft={format_seconds(ttft)} "
                f"e2e={format_seconds(e2e)} finish_reason={record.finish_reason}")
        if self.log_text:
            line += f" prompt={record.sub.prompt_text!r} output={''.join(record.output_text)!r}"
        request_logger.info(line)


class ChoiceStream:
    """The merged deltas of one HTTP request's choices, in arrival order."""

    def __init__(self, service: GenerationService, choices: Sequence[Choice],
                 slots: list[QueueSlot]) -> None:
        self.service = service
        self.queue: asyncio.Queue[ChoiceEvent] = asyncio.Queue()
        self.remaining = len(choices)
        self.closed = False
        self.tasks: list[asyncio.Task[None]] = []
        for sub, slot in zip(choices, slots, strict=True):
            task = asyncio.create_task(service.pump(sub, slot, self.queue),
                                       name=f"pump-{sub.request_id}")
            task.add_done_callback(self.make_cleanup(service, sub, slot))
            service.active[sub.request_id] = task
            self.tasks.append(task)

    def make_cleanup(self, service: GenerationService, sub: Choice,
                     slot: QueueSlot) -> Callable[[asyncio.Task[None]], None]:
        def cleanup(task: asyncio.Task[None]) -> None:
            # A pump cancelled before its first step never ran its own `finally`.
            if task.cancelled():
                slot.release()
                service.active.pop(sub.request_id, None)
                record = RequestRecord(sub)
                self.queue.put_nowait(ChoiceEvent(sub.index, abort_delta(sub, record)))
                service.account(record)
        return cleanup

    def __aiter__(self) -> AsyncIterator[ChoiceEvent]:
        return self

    async def __anext__(self) -> ChoiceEvent:
        if self.remaining == 0:
            raise StopAsyncIteration
        event = await self.queue.get()
        if event.ends_choice:
            self.remaining -= 1
        return event

    def cancel(self) -> None:
        """Stop the engine's work on every choice while the reader goes on: each choice
        ends with finish_reason "abort", which the reader still receives (a client's
        cancel of a running response, unlike its disconnect, still gets an answer)."""
        for task in self.tasks:
            if not task.done():
                task.cancel()

    def close(self) -> None:
        """End the request, once however it ends: abort whatever still runs. Synchronous:
        it is called from cancelled scopes."""
        if self.closed:
            return
        self.closed = True
        for task in self.tasks:
            if not task.done():
                task.cancel()
        self.service.end_request()
