"""Sending a request's deltas: SSE events as they come, or one JSON body at the end.

Streaming: one `data: {json}` event per engine delta, a usage chunk when asked, then
`data: [DONE]`. An error after the stream has started is sent as `data: {"error": ...}`
followed by `[DONE]`. When the client disconnects, sse-starlette cancels the body
generator at once; closing the ChoiceStream then cancels the pumps, which abort their
engine requests. Non-streaming requests watch for the disconnect themselves. However a
response ends, its ChoiceStream is closed (once), which ends the request.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from sse_starlette import EventSourceResponse
from starlette.background import BackgroundTask
from starlette.types import Scope

from server.api.protocol import SamplingFields
from server.api.request_ids import echo_request_id
from server.respond.builders import ResponseBuilder, consume_event
from server.runtime.generation import ChoiceStream
from server.runtime.response_stats import ResponseStats

DISCONNECT_POLL_S = 0.2


def to_json(data: dict[str, Any]) -> str:
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"))


async def sse_events(stream: ChoiceStream, builder: ResponseBuilder, include_usage: bool,
                     stats: ResponseStats, scope: Scope) -> AsyncIterator[str]:
    try:
        failed = False
        async for event in stream:
            if event.error is not None:
                stats.count(event.error.status, scope, in_stream=True)
                yield to_json(event.error.body())
                failed = True
                break
            start = time.perf_counter()
            chunk = builder.chunk(event)
            if chunk is not None and builder.continuous_usage:  # stream_options.continuous_usage_stats
                chunk["usage"] = builder.usage().model_dump(mode="json")
            data = None if chunk is None else to_json(chunk)
            stats.add_encode_time(time.perf_counter() - start)
            if data is not None:
                yield data
        if include_usage and not failed:
            yield to_json(builder.usage_chunk())
        yield "[DONE]"
    finally:
        stream.close()  # synchronous: this may run inside a cancelled scope


def stream_response(stream: ChoiceStream, builder: ResponseBuilder, include_usage: bool,
                    send_timeout_s: float, stats: ResponseStats, scope: Scope
                    ) -> EventSourceResponse:
    # sep="\n": frames are "data: ...\n\n", byte for byte what OpenAI and vLLM send.
    # send_timeout: a client that stops reading is cut, and its request aborted (close).
    return EventSourceResponse(sse_events(stream, builder, include_usage, stats, scope), sep="\n",
                               background=BackgroundTask(stream.close),
                               send_timeout=send_timeout_s)


async def wait_for_disconnect(request: Request) -> None:
    while not await request.is_disconnected():
        await asyncio.sleep(DISCONNECT_POLL_S)


async def collect(stream: ChoiceStream, builder: ResponseBuilder) -> dict[str, Any]:
    async for event in stream:
        consume_event(builder, event)
    return builder.response()


async def full_response(request: Request, stream: ChoiceStream, builder: ResponseBuilder,
                        shape: Callable[[dict[str, Any]], dict[str, Any]] | None = None
                        ) -> Response:
    """Wait for every choice; abort them all if the client goes away first. `shape` turns
    the body into another API's (server/respond/dialect_streaming.py)."""
    collector = asyncio.create_task(collect(stream, builder))
    watcher = asyncio.create_task(wait_for_disconnect(request))
    try:
        await asyncio.wait({collector, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if not collector.done():
            # Nobody will read this; 499 is nginx's "client closed request".
            return Response(status_code=499)
        body = collector.result()
        return JSONResponse(shape(body) if shape is not None else body)
    finally:
        watcher.cancel()
        collector.cancel()
        stream.close()


async def respond(request: Request, body: SamplingFields, stream: ChoiceStream,
                  builder: ResponseBuilder, client_id: str, send_timeout_s: float,
                  stats: ResponseStats) -> Response:
    """Stream the running request's deltas or send one body, with the client's request id
    (`client_id`) echoed."""
    builder.continuous_usage = bool(body.stream_options
                                    and body.stream_options.continuous_usage_stats)
    response: Response
    if body.stream:
        response = stream_response(stream, builder, body.include_usage(), send_timeout_s, stats,
                                   request.scope)
    else:
        response = await full_response(request, stream, builder)
    return echo_request_id(response, client_id)
