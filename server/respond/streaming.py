"""Sending a request's deltas: SSE events as they come, or one JSON body at the end.

Streaming: one `data: {json}` event per engine delta, a usage chunk when asked, then
`data: [DONE]`. An error after the stream has started is sent as `data: {"error": ...}`
followed by `[DONE]`. When the client disconnects, sse-starlette cancels the body
generator at once; closing the ChoiceStream then cancels the pumps, which abort their
engine requests. Non-streaming requests watch for the disconnect themselves.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from sse_starlette import EventSourceResponse
from starlette.background import BackgroundTask

from server.api.protocol import SamplingFields
from server.api.request_ids import echo_request_id
from server.respond.builders import ResponseBuilder, consume_event
from server.runtime.generation import ChoiceStream
from server.runtime.state import ServerState
from server.translate.engine_requests import EngineRequests

DISCONNECT_POLL_S = 0.2


class RequestGuard:
    """Ends one HTTP generation request exactly once, however it ends."""

    def __init__(self, state: ServerState, stream: ChoiceStream) -> None:
        self.state = state
        self.stream = stream
        self.closed = False
        state.begin_request()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.stream.close()
            self.state.end_request()


def to_json(data: dict[str, Any]) -> str:
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"))


async def sse_events(stream: ChoiceStream, builder: ResponseBuilder, include_usage: bool,
                     guard: RequestGuard) -> AsyncIterator[str]:
    try:
        failed = False
        async for event in stream:
            if event.error is not None:
                guard.state.count_response(event.error.status)
                yield to_json(event.error.body())
                failed = True
                break
            start = time.perf_counter()
            chunk = builder.chunk(event)
            if chunk is not None and builder.continuous_usage:  # stream_options.continuous_usage_stats
                chunk["usage"] = builder.usage().model_dump(mode="json")
            data = None if chunk is None else to_json(chunk)
            guard.state.encode_seconds += time.perf_counter() - start
            if data is not None:
                yield data
        if include_usage and not failed:
            yield to_json(builder.usage_chunk())
        yield "[DONE]"
    finally:
        guard.close()  # synchronous: this may run inside a cancelled scope


def stream_response(state: ServerState, stream: ChoiceStream, builder: ResponseBuilder,
                    include_usage: bool) -> EventSourceResponse:
    guard = RequestGuard(state, stream)
    # sep="\n": frames are "data: ...\n\n", byte for byte what OpenAI and vLLM send.
    # send_timeout: a client that stops reading is cut, and its request aborted (guard).
    return EventSourceResponse(sse_events(stream, builder, include_usage, guard), sep="\n",
                               background=BackgroundTask(guard.close),
                               send_timeout=state.settings.sse_send_timeout_s)


async def wait_for_disconnect(request: Request) -> None:
    while not await request.is_disconnected():
        await asyncio.sleep(DISCONNECT_POLL_S)


async def collect(stream: ChoiceStream, builder: ResponseBuilder) -> dict[str, Any]:
    async for event in stream:
        consume_event(builder, event)
    return builder.response()


async def full_response(state: ServerState, request: Request, stream: ChoiceStream,
                        builder: ResponseBuilder) -> Response:
    """Wait for every choice; abort them all if the client goes away first."""
    guard = RequestGuard(state, stream)
    collector = asyncio.create_task(collect(stream, builder))
    watcher = asyncio.create_task(wait_for_disconnect(request))
    try:
        await asyncio.wait({collector, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if not collector.done():
            # Nobody will read this; 499 is nginx's "client closed request".
            return Response(status_code=499)
        return JSONResponse(collector.result())
    finally:
        watcher.cancel()
        collector.cancel()
        guard.close()


async def respond(state: ServerState, request: Request, body: SamplingFields,
                  requests: EngineRequests, builder: ResponseBuilder) -> Response:
    """Start the engine requests (429 if the queue filled meanwhile), then stream their
    deltas or send one body, with the request id echoed."""
    stream = state.start_generation(requests.subs)
    builder.continuous_usage = bool(body.stream_options
                                    and body.stream_options.continuous_usage_stats)
    response: Response
    if body.stream:
        response = stream_response(state, stream, builder, body.include_usage())
    else:
        response = await full_response(state, request, stream, builder)
    return echo_request_id(response, requests.client_id)
