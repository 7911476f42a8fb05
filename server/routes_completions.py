"""POST /v1/completions."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from server.builders import CompletionBuilder
from server.errors import bad_request
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
    if body.echo and body.logprobs is not None:
        # Prompt logprobs would need a prefill that scores the prompt; the engine does not.
        raise bad_request("echo together with logprobs is not supported", "echo")
    prompts = encode_prompts(engine.tokenizer, body.prompt)
    spec = spec_from_request(body)
    await compile_spec(engine, spec)

    def max_tokens_for(prompt: PromptInput) -> int:
        if body.max_tokens is None:  # explicit null: up to the context
            return max(engine.max_model_len - len(prompt.token_ids), 1)
        return body.max_tokens

    subs = fan_out(request_id, prompts, body, max_tokens_for, body.logprobs,
                   state.settings.log_requests_text, engine.max_model_len)
    constrain(engine, subs, spec, body.priority)
    builder = CompletionBuilder(request_id, state.served_model_name, prompts, body.n,
                                body.echo, body.logprobs)
    return echo_request_id(await respond(state, request, body, subs, builder), client_id)
