"""What the completions and chat routes share: the checks every generation request goes
through, in the order clients expect (400 for a malformed body, 503, 404, 400, then 429;
a full queue is refused before tokenizing, after the cheap checks), and the start of the
response. The checks themselves live in server/validation.py."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import Response

from engine.request_limits import clip
from server.builders import ResponseBuilder
from server.errors import APIError
from server.generation import SubRequest
from server.protocol import SamplingFields
from server.state import ServerState
from server.streaming import full_response, stream_response


def get_state(request: Request) -> ServerState:
    state: ServerState = request.app.state.server
    return state


def check_model(state: ServerState, model: str | None) -> None:
    """Accept the served name (or the engine's own); anything else is a 404."""
    names = {state.served_model_name}
    if state.engine is not None:
        names.add(str(state.engine.model_name))
    if model is not None and model not in names:
        raise APIError(404, f"The model `{clip(model)}` does not exist.", "model")


async def respond(state: ServerState, request: Request, body: SamplingFields,
                  subs: list[SubRequest], builder: ResponseBuilder) -> Response:
    stream = state.start_generation(subs)
    builder.continuous_usage = bool(body.stream_options and body.stream_options.continuous_usage_stats)
    if body.stream:
        return stream_response(state, stream, builder, body.include_usage())
    return await full_response(state, request, stream, builder)
