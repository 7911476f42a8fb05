"""POST /v1/completions."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from server.builders import CompletionBuilder
from server.prompts import PromptInput, encode_prompts
from server.protocol import CompletionRequest
from server.request_ids import echo_request_id, request_id_for
from server.routes_common import (
    check_model,
    fan_out,
    get_state,
    log_unknown_fields,
    respond,
)
from server.structured import compile_spec, constrain, spec_from_request

router = APIRouter()


@router.post("/v1/completions")
async def create_completion(body: CompletionRequest, request: Request) -> Response:
    state = get_state(request)
    engine = state.require_engine()
    check_model(state, body.model)
    request_id, client_id = request_id_for(request, "cmpl")
    log_unknown_fields(request_id, body)
    prompts = encode_prompts(engine.tokenizer, body.prompt)
    spec = spec_from_request(body)
    await compile_spec(engine, spec)

    def max_tokens_for(prompt: PromptInput) -> int:
        if body.max_tokens is None:  # explicit null: up to the context
            return max(engine.max_model_len - len(prompt.token_ids), 1)
        return body.max_tokens or 1  # 0 (echo): one token is computed, none is returned

    subs = fan_out(request_id, prompts, body, max_tokens_for, body.logprobs,
                   state.settings.log_requests_text, engine.max_model_len)
    constrain(engine, subs, spec, body.priority, body.wanted_prompt_logprobs())
    builder = CompletionBuilder(request_id, state.served_model_name, prompts, body.n,
                                body.echo, body.logprobs)
    builder.score_prompt(body.max_tokens == 0, body.prompt_logprobs is not None,
                         lambda t: str(engine.tokenizer.decode([t])))
    return echo_request_id(await respond(state, request, body, subs, builder), client_id)
