"""POST /v1/chat/completions: parse, translate into engine requests (messages rendered with
the model's chat template), respond."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from server.api.body import openapi_body, parse_body
from server.api.protocol import ChatCompletionRequest
from server.respond.builders import ChatBuilder
from server.respond.streaming import respond
from server.runtime.state import get_state
from server.translate.engine_requests import chat_requests
from server.translate.tool_prompt import tool_mode

router = APIRouter()


@router.post("/v1/chat/completions", openapi_extra=openapi_body(ChatCompletionRequest))
async def create_chat_completion(request: Request) -> Response:
    state = get_state(request)
    body = await parse_body(request, ChatCompletionRequest, state.settings)
    requests = await chat_requests(state, request, body)
    builder = ChatBuilder(requests.request_id, state.served_model_name, requests.prompts[0],
                          body.n, body.logprobs, body.top_logprobs or 0, tool_mode(body))
    return await respond(state, request, body, requests, builder)
