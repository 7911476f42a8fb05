"""POST /v1/completions."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from server.body import openapi_body, parse_body
from server.builders import CompletionBuilder
from server.offload import run_blocking
from server.prompts import PromptInput, check_prompt_items, encode_prompts, split_prompts
from server.protocol import CompletionRequest
from server.request_ids import echo_request_id, request_id_for
from server.routes_common import check_model, get_state, respond
from server.structured import compile_spec, constrain, spec_from_request
from server.validation import check_fields, checked_fan_out, fan_out

router = APIRouter()


@router.post("/v1/completions", openapi_extra=openapi_body(CompletionRequest))
async def create_completion(request: Request) -> Response:
    state = get_state(request)
    body = await parse_body(request, CompletionRequest, state.settings)
    engine = state.require_engine()
    check_model(state, body.model)
    request_id, client_id = request_id_for(request, "cmpl")
    check_fields(request_id, body)
    items = split_prompts(body.prompt)
    checked_fan_out(len(items), body.n, engine.limits)
    check_prompt_items(items, engine.limits)
    state.refuse_if_full(len(items) * body.n)
    prompts = await run_blocking(encode_prompts, engine.tokenizer, items)
    spec = spec_from_request(body)
    await compile_spec(engine, spec)

    def max_tokens_for(prompt: PromptInput) -> int | None:
        # An explicit null means "up to the context" (check_prompt resolves it); 0 (echo):
        # one token is computed, none is returned.
        return None if body.max_tokens is None else body.max_tokens or 1

    subs = fan_out(request_id, prompts, body, max_tokens_for, body.logprobs,
                   state.settings.log_requests_text, engine.limits)
    constrain(engine, subs, spec, body.priority, body.wanted_prompt_logprobs())
    builder = CompletionBuilder(request_id, state.served_model_name, prompts, body.n,
                                body.echo, body.logprobs)
    builder.score_prompt(body.max_tokens == 0, body.prompt_logprobs is not None,
                         lambda t: str(engine.tokenizer.decode([t])))
    return echo_request_id(await respond(state, request, body, subs, builder), client_id)
