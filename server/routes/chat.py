"""POST /v1/chat/completions: parse, admit, translate (the messages rendered with the model's
chat template), run, respond, each once and in this order (server/routes/chat_pipeline.py)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from server.api.body import openapi_body, parse_body
from server.api.protocol import ChatCompletionRequest
from server.api.request_ids import request_id_for
from server.respond.streaming import respond
from server.routes.chat_pipeline import start_chat
from server.runtime.state import State

router = APIRouter()


@router.post("/v1/chat/completions", openapi_extra=openapi_body(ChatCompletionRequest))
async def create_chat_completion(request: Request, state: State) -> Response:
    body = await parse_body(request, ChatCompletionRequest, state.settings)
    request_id, client_id = request_id_for(request, "chatcmpl")
    stream, builder = await start_chat(state, body, request_id)
    return await respond(request, body, stream, builder, client_id,
                         state.settings.sse_send_timeout_s, state.responses)
