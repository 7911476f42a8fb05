"""POST /v1/messages and /v1/messages/count_tokens: the Anthropic Messages API, translated
once into a chat request (server/translate/messages_to_chat.py) and run by the chat pipeline;
errors come back in Anthropic's shape (server/api/anthropic_errors.py)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from server.api.body import openapi_body, parse_body
from server.api.messages_protocol import CountTokensRequest, MessagesRequest
from server.api.request_ids import echo_request_id, request_id_for
from server.respond.dialect_streaming import respond_in_dialect
from server.respond.messages_events import MessagesDialect
from server.routes.chat_pipeline import start_chat
from server.runtime.state import State
from server.translate.engine_requests import render_chat_prompt
from server.translate.fields import log_unknown_fields
from server.translate.messages_to_chat import chat_from_messages
from server.worker_pool import run_blocking

router = APIRouter()


@router.post("/v1/messages", openapi_extra=openapi_body(MessagesRequest))
async def create_message(request: Request, state: State) -> Response:
    body = await parse_body(request, MessagesRequest, state.settings)
    chat = chat_from_messages(body)
    request_id, client_id = request_id_for(request, "msg")
    log_unknown_fields(request_id, body)  # Claude Code sends fields of Anthropic's own service
    stream, builder = await start_chat(state, chat, request_id, clamp_max_tokens=True)
    dialect = MessagesDialect(f"msg_{client_id}", body.model or state.served_model_name,
                              len(builder.prompts[0].token_ids), chat.stop_list())
    response = await respond_in_dialect(request, body.stream, stream, builder, dialect,
                                        state.settings.sse_send_timeout_s, state.responses)
    return echo_request_id(response, client_id)


@router.post("/v1/messages/count_tokens", openapi_extra=openapi_body(CountTokensRequest))
async def count_tokens(request: Request, state: State) -> dict[str, Any]:
    """The prompt's tokens as /v1/messages would render it, tools included."""
    body = await parse_body(request, CountTokensRequest, state.settings)
    chat = chat_from_messages(body)
    engine = state.engine_for(body.model)
    prompt = await run_blocking(render_chat_prompt, chat, engine.tokenizer, engine.limits)
    return {"input_tokens": len(prompt.token_ids)}
