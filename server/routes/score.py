"""POST /v1/score and /score (vLLM's): one score per (text_1, text_2) pair, in order."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response

from server.api.body import openapi_body, parse_body
from server.api.pooling_protocol import ScoreRequest
from server.api.request_ids import echo_request_id, request_id_for
from server.respond.pooling_bodies import score_body
from server.routes.pair_scores import pair_scores
from server.runtime.pooling_client import pooling_engine
from server.runtime.pooling_run import run_admitted
from server.runtime.state import State
from server.translate.pooling_inputs import check_pairs, pair_inputs
from server.worker_pool import run_blocking

router = APIRouter()


@router.post("/v1/score", openapi_extra=openapi_body(ScoreRequest))
@router.post("/score", include_in_schema=False)
async def score(request: Request, response: Response, state: State) -> dict[str, Any]:
    body = await parse_body(request, ScoreRequest, state.settings)
    request_id, client_id = request_id_for(request, "score")
    pairs = body.pairs()
    texts = [t for pair in pairs for t in pair]
    admitted = state.admit(body.model, lambda engine: check_pairs(
        request_id, body, texts, pooling_engine(engine, "/v1/score"), "text_2"))
    engine = pooling_engine(admitted.engine, "/v1/score")
    inputs = await run_blocking(pair_inputs, pairs, body.truncate_prompt_tokens, body.instruction, engine, "text_2")
    scores = await run_admitted(admitted, request_id, len(pairs), inputs.num_tokens,
                                lambda: pair_scores(engine, inputs, body.priority))
    echo_request_id(response, client_id)
    return score_body(request_id, state.served_model_name, scores, inputs.num_tokens)
