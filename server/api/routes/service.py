"""GET /v1/models, /health (and /ping), /version, /metrics; POST /tokenize, /detokenize
(vLLM's shapes)."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from engine.io.errors import InvalidRequestError
from engine.io.request_limits import check_prompt_chars, check_token_ids
from server.api.body import openapi_body, parse_body
from server.api.errors import bad_request, error_response
from server.api.protocol import DetokenizeRequest, TokenizeRequest, now
from server.runtime.metrics import CONTENT_TYPE
from server.runtime.state import get_state
from server.runtime.worker_pool import run_blocking
from server.translate.prompts import render_chat
from server.translate.validation import check_model

router = APIRouter()
logger = logging.getLogger("pagode.server")


@router.get("/health")
async def health(request: Request) -> Response:
    problem = get_state(request).health_problem()
    if problem is not None:
        return error_response(503, problem)
    return JSONResponse({"status": "ok"})


@router.get("/ping")
async def ping(request: Request) -> Response:
    """vLLM's alias of /health (SageMaker-style probes use it)."""
    return await health(request)


@router.get("/version")
async def version() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as package_version

    try:
        return {"version": package_version("pagode")}
    except PackageNotFoundError:
        return {"version": "unknown"}


@router.get("/v1/models")
async def list_models(request: Request) -> dict[str, Any]:
    state = get_state(request)
    engine = state.require_engine()
    card = {"id": state.served_model_name, "object": "model", "created": now(),
            "owned_by": "pagode", "root": str(engine.model_name), "parent": None,
            "max_model_len": engine.max_model_len}
    return {"object": "list", "data": [card]}


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    state = get_state(request)
    if state.metrics is None:
        return error_response(503, "The model is loading")
    return Response(state.metrics.render(), media_type=CONTENT_TYPE)


@router.post("/tokenize", openapi_extra=openapi_body(TokenizeRequest))
async def tokenize(request: Request) -> dict[str, Any]:
    """Chat messages tokenize exactly as the chat route does (content stays plain text)."""
    state = get_state(request)
    body = await parse_body(request, TokenizeRequest, state.settings)
    engine = state.require_engine()
    check_model(state, body.model)
    if body.messages is not None:
        prompt = await run_blocking(render_chat, engine.tokenizer, state.text_encoder,
                                    body.messages, engine.limits, body.add_generation_prompt)
        tokens = prompt.token_ids
    else:
        text = body.prompt or ""
        try:
            check_prompt_chars(text, engine.limits)
        except InvalidRequestError as exc:
            raise bad_request(str(exc), exc.param) from exc
        add_special = True if body.add_special_tokens is None else body.add_special_tokens
        tokens = await run_blocking(engine.tokenizer.encode, text,
                                    add_special_tokens=add_special)
    return {"count": len(tokens), "max_model_len": engine.max_model_len, "tokens": tokens}


@router.post("/detokenize", openapi_extra=openapi_body(DetokenizeRequest))
async def detokenize(request: Request) -> dict[str, Any]:
    state = get_state(request)
    body = await parse_body(request, DetokenizeRequest, state.settings)
    engine = state.require_engine()
    check_model(state, body.model)
    try:
        check_token_ids(body.tokens, engine.limits, "tokens")
    except InvalidRequestError as exc:
        raise bad_request(str(exc), exc.param) from exc
    if len(body.tokens) > engine.limits.max_prompt_chars:
        raise bad_request("too many tokens to detokenize", "tokens")
    text = await run_blocking(engine.tokenizer.decode, body.tokens)
    return {"prompt": text}
