"""POST /v1/completions."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from server.body import openapi_body, parse_body
from server.builders import CompletionBuilder
from server.errors import bad_request
from server.offload import run_blocking
from server.prompts import PromptInput, check_prompt_items, encode_prompts, split_prompts
from server.protocol import CompletionRequest
from server.routes_common import check_model, get_state, new_request_id, respond
from server.validation import check_fields, checked_fan_out, fan_out

router = APIRouter()


@router.post("/v1/completions", openapi_extra=openapi_body(CompletionRequest))
async def create_completion(request: Request) -> Response:
    state = get_state(request)
    body = await parse_body(request, CompletionRequest, state.settings)
    engine = state.require_engine()
    check_model(state, body.model)
    request_id = new_request_id("cmpl")
    check_fields(request_id, body)
    if body.echo and body.logprobs is not None:
        # Prompt logprobs would need a prefill that scores the prompt; the engine does not.
        raise bad_request("echo together with logprobs is not supported", "echo")
    items = split_prompts(body.prompt)
    checked_fan_out(len(items), body.n, engine.limits)
    check_prompt_items(items, engine.limits)
    state.refuse_if_full(len(items) * body.n)
    prompts = await run_blocking(encode_prompts, engine.tokenizer, items)

    def max_tokens_for(prompt: PromptInput) -> int | None:
        # An explicit null means "up to the context" (check_prompt resolves it).
        return body.max_tokens

    subs = fan_out(request_id, prompts, body, max_tokens_for, body.logprobs,
                   state.settings.log_requests_text, engine.limits)
    builder = CompletionBuilder(request_id, state.served_model_name, prompts, body.n,
                                body.echo, body.logprobs)
    return await respond(state, request, body, subs, builder)
