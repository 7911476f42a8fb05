"""POST /tokenize and /detokenize, in vLLM's shapes: the model's tokenizer, checked against
the engine's limits (server/translate/tokenize.py)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from server.api.body import openapi_body, parse_body
from server.api.protocol import DetokenizeRequest, TokenizeRequest
from server.runtime.state import State
from server.translate.tokenize import detokenize_body, tokenize_body
from server.worker_pool import run_blocking

router = APIRouter()


@router.post("/tokenize", openapi_extra=openapi_body(TokenizeRequest))
async def tokenize(request: Request, state: State) -> dict[str, Any]:
    body = await parse_body(request, TokenizeRequest, state.settings)
    engine = state.engine_for(body.model)
    tokens = await run_blocking(tokenize_body, body, engine.tokenizer, engine.limits)
    return {"count": len(tokens), "max_model_len": engine.max_model_len, "tokens": tokens}


@router.post("/detokenize", openapi_extra=openapi_body(DetokenizeRequest))
async def detokenize(request: Request, state: State) -> dict[str, Any]:
    body = await parse_body(request, DetokenizeRequest, state.settings)
    engine = state.engine_for(body.model)
    text = await run_blocking(detokenize_body, body, engine.tokenizer, engine.limits)
    return {"prompt": text}
