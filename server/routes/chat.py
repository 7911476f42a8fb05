"""POST /v1/chat/completions: parse, admit, translate (the messages rendered with the model's
chat template), run, respond, each once and in this order."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from server.api.body import openapi_body, parse_body
from server.api.protocol import ChatCompletionRequest
from server.api.request_ids import request_id_for
from server.respond.builders import ChatBuilder
from server.respond.chat_format import chat_format
from server.respond.streaming import respond
from server.runtime.state import State
from server.translate.engine_requests import chat_requests, check_chat
from server.worker_pool import run_blocking

router = APIRouter()


@router.post("/v1/chat/completions", openapi_extra=openapi_body(ChatCompletionRequest))
async def create_chat_completion(request: Request, state: State) -> Response:
    body = await parse_body(request, ChatCompletionRequest, state.settings)
    request_id, client_id = request_id_for(request, "chatcmpl")
    admitted = state.admit(body.model, lambda engine: check_chat(
        request_id, body, engine.limits, engine.config))
    engine = admitted.engine
    settings = state.settings
    fmt = chat_format(settings.tool_call_parser, settings.reasoning_parser,
                      engine.tokenizer.chat_template, settings.structured_outputs_in_reasoning)
    requests = await run_blocking(chat_requests, request_id, body, engine.tokenizer,
                                  engine.limits, engine.compile_grammar, fmt.grammar_start(body),
                                  fmt.tools().keeps_special_tokens)
    builder = ChatBuilder(request_id, state.served_model_name, requests.prompts[0], body, fmt)
    stream = admitted.start_choices(requests.subs)
    return await respond(request, body, stream, builder, client_id,
                         state.settings.sse_send_timeout_s, state.responses)
