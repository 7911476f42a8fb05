"""From a parsed request body to engine requests, in one place and in the order clients
expect: 503 (no engine), 404 (model), 400 (fields, fan-out, prompt characters), then 429
before tokenizing (a full queue is refused after the cheap checks), then the prompt is
tokenized or rendered, its structured-output grammar compiled, and the choices fanned out
with their sampling parameters and seeds. The routes then only build and send the response.
"""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request

from server.api.protocol import ChatCompletionRequest, CompletionRequest
from server.api.request_ids import request_id_for
from server.runtime.engine_client import EngineClient
from server.runtime.generation import SubRequest
from server.runtime.state import ServerState
from server.runtime.worker_pool import run_blocking
from server.translate.prompts import (
    PromptInput,
    check_prompt_items,
    encode_prompts,
    render_chat,
    split_prompts,
)
from server.translate.structured import compile_spec, spec_from_request
from server.translate.tool_prompt import render_chat_with_tools, tool_spec, uses_tools
from server.translate.validation import (
    Constraints,
    check_fields,
    check_model,
    check_priority,
    checked_fan_out,
    fan_out,
)


@dataclass
class EngineRequests:
    """One HTTP request's choices, ready for the engine."""

    request_id: str
    client_id: str  # echoed back in the X-Request-Id header
    prompts: list[PromptInput]
    subs: list[SubRequest]


def checked_request(state: ServerState, request: Request, body: CompletionRequest | ChatCompletionRequest,
                    id_prefix: str) -> tuple[EngineClient, str, str]:
    """The checks both routes run first, in order: 503, 404, then the 400s of the fields;
    returns the engine, the request id and the id to echo."""
    engine = state.require_engine()
    check_model(state, body.model)
    request_id, client_id = request_id_for(request, id_prefix)
    check_fields(request_id, body)
    check_priority(engine, body.priority)
    return engine, request_id, client_id


async def completion_requests(state: ServerState, request: Request,
                              body: CompletionRequest) -> EngineRequests:
    engine, request_id, client_id = checked_request(state, request, body, "cmpl")
    items = split_prompts(body.prompt)
    checked_fan_out(len(items), body.n, engine.limits)
    check_prompt_items(items, engine.limits)
    state.refuse_if_full(len(items) * body.n)
    prompts = await run_blocking(encode_prompts, engine.tokenizer, items)
    spec = spec_from_request(body)
    await compile_spec(engine, spec)
    # An explicit null means "up to the context" (check_prompt resolves it); 0 (echo): one
    # token is computed, none is returned.
    max_tokens = None if body.max_tokens is None else body.max_tokens or 1
    constraints = Constraints(spec, body.priority, body.wanted_prompt_logprobs())
    subs = fan_out(request_id, prompts, body, max_tokens, body.logprobs, constraints,
                   state.settings.log_requests_text, engine.limits)
    return EngineRequests(request_id, client_id, prompts, subs)


async def chat_requests(state: ServerState, request: Request,
                        body: ChatCompletionRequest) -> EngineRequests:
    engine, request_id, client_id = checked_request(state, request, body, "chatcmpl")
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
    # Neither given: whatever the context leaves (check_prompt resolves None).
    max_tokens = body.max_completion_tokens or body.max_tokens
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    subs = fan_out(request_id, [prompt], body, max_tokens, logprobs,
                   Constraints(spec, body.priority), state.settings.log_requests_text,
                   engine.limits)
    return EngineRequests(request_id, client_id, [prompt], subs)
