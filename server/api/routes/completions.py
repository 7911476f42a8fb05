"""POST /v1/completions: parse, translate into engine requests, respond."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from server.api.body import openapi_body, parse_body
from server.api.protocol import CompletionRequest
from server.respond.builders import CompletionBuilder
from server.respond.streaming import respond
from server.runtime.state import get_state
from server.translate.engine_requests import completion_requests

router = APIRouter()


@router.post("/v1/completions", openapi_extra=openapi_body(CompletionRequest))
async def create_completion(request: Request) -> Response:
    state = get_state(request)
    body = await parse_body(request, CompletionRequest, state.settings)
    requests = await completion_requests(state, request, body)
    builder = CompletionBuilder(requests.request_id, state.served_model_name, requests.prompts,
                                body.n, body.echo, body.logprobs)
    tokenizer = state.require_engine().tokenizer
    builder.score_prompt(body.max_tokens == 0, body.prompt_logprobs is not None,
                         lambda t: str(tokenizer.decode([t])))
    return await respond(state, request, body, requests, builder)
