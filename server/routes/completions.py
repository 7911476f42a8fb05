"""POST /v1/completions: parse, admit, translate, run, respond, each once and in this order."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from server.api.body import openapi_body, parse_body
from server.api.protocol import CompletionRequest
from server.api.request_ids import request_id_for
from server.respond.builders import CompletionBuilder
from server.respond.streaming import respond
from server.runtime.state import State
from server.translate.engine_requests import check_completion, completion_requests
from server.worker_pool import run_blocking

router = APIRouter()


@router.post("/v1/completions", openapi_extra=openapi_body(CompletionRequest))
async def create_completion(request: Request, state: State) -> Response:
    body = await parse_body(request, CompletionRequest, state.settings)
    request_id, client_id = request_id_for(request, "cmpl")
    admitted = state.admit(body.model, lambda engine: check_completion(
        request_id, body, engine.limits, engine.config))
    engine = admitted.engine
    requests = await run_blocking(completion_requests, request_id, body, admitted.plan,
                                  engine.tokenizer, engine.limits, engine.compile_grammar)
    builder = CompletionBuilder(request_id, state.name_for(body.model), requests.prompts, body,
                                lambda token: str(engine.tokenizer.decode([token])))
    stream = admitted.start_choices(requests.subs)
    return await respond(request, body, stream, builder, client_id,
                         state.settings.sse_send_timeout_s, state.responses)
