"""POST /v1/chat/completions: messages rendered with the model's chat template."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from server.body import openapi_body, parse_body
from server.builders import ChatBuilder
from server.offload import run_blocking
from server.prompts import PromptInput, render_chat
from server.protocol import ChatCompletionRequest
from server.request_ids import echo_request_id, request_id_for
from server.routes_common import check_model, get_state, respond
from server.structured import compile_spec, constrain, spec_from_request
from server.tools import render_chat_with_tools, tool_mode, tool_spec, uses_tools
from server.validation import check_fields, checked_fan_out, fan_out

router = APIRouter()


@router.post("/v1/chat/completions", openapi_extra=openapi_body(ChatCompletionRequest))
async def create_chat_completion(request: Request) -> Response:
    state = get_state(request)
    body = await parse_body(request, ChatCompletionRequest, state.settings)
    engine = state.require_engine()
    check_model(state, body.model)
    request_id, client_id = request_id_for(request, "chatcmpl")
    check_fields(request_id, body)
    checked_fan_out(1, body.n, engine.limits)
    state.refuse_if_full(body.n)
    if uses_tools(body):
        prompt = await run_blocking(render_chat_with_tools, engine.tokenizer, state.text_encoder,
                                    body, engine.limits)
    else:
        prompt = await run_blocking(render_chat, engine.tokenizer, state.text_encoder,
                                    body.messages, engine.limits, body.add_generation_prompt,
                                    body.continue_final_message)
    spec = tool_spec(body) or spec_from_request(body)
    await compile_spec(engine, spec)
    requested = body.max_completion_tokens or body.max_tokens

    def max_tokens_for(prompt: PromptInput) -> int | None:
        # Neither given: whatever the context leaves (check_prompt resolves None).
        return requested

    top = body.top_logprobs or 0
    subs = fan_out(request_id, [prompt], body, max_tokens_for, top if body.logprobs else None,
                   state.settings.log_requests_text, engine.limits)
    constrain(engine, subs, spec, body.priority)
    builder = ChatBuilder(request_id, state.served_model_name, prompt, body.n, body.logprobs,
                          top, tool_mode(body))
    return echo_request_id(await respond(state, request, body, subs, builder), client_id)
