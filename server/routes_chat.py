"""POST /v1/chat/completions: messages rendered with the model's chat template."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from server.builders import ChatBuilder
from server.errors import bad_request
from server.prompts import PromptInput, render_chat
from server.protocol import ChatCompletionRequest
from server.request_ids import echo_request_id, request_id_for
from server.routes_common import (
    check_model,
    fan_out,
    get_state,
    log_unknown_fields,
    respond,
)
from server.structured import compile_spec, constrain, spec_from_request
from server.tools import render_chat_with_tools, tool_mode, tool_spec, uses_tools

router = APIRouter()


@router.post("/v1/chat/completions")
async def create_chat_completion(body: ChatCompletionRequest, request: Request) -> Response:
    state = get_state(request)
    engine = state.require_engine()
    check_model(state, body.model)
    request_id, client_id = request_id_for(request, "chatcmpl")
    log_unknown_fields(request_id, body)
    if uses_tools(body):
        prompt = render_chat_with_tools(engine.tokenizer, body)
    else:
        prompt = render_chat(engine.tokenizer, body.messages, body.add_generation_prompt,
                             body.continue_final_message)
    if body.model_extra and body.model_extra.get("prompt_logprobs") is not None:
        raise bad_request("prompt_logprobs is served on /v1/completions", "prompt_logprobs")
    spec = tool_spec(body) or spec_from_request(body)
    await compile_spec(engine, spec)
    requested = body.max_completion_tokens or body.max_tokens

    def max_tokens_for(prompt: PromptInput) -> int:
        # Neither given: whatever the context leaves (the prompt check comes first).
        return requested or max(engine.max_model_len - len(prompt.token_ids), 1)

    top = body.top_logprobs or 0
    subs = fan_out(request_id, [prompt], body, max_tokens_for, top if body.logprobs else None,
                   state.settings.log_requests_text, engine.max_model_len)
    constrain(engine, subs, spec, body.priority)
    builder = ChatBuilder(request_id, state.served_model_name, prompt, body.n, body.logprobs,
                          top, tool_mode(body))
    return echo_request_id(await respond(state, request, body, subs, builder), client_id)
