"""POST /v1/rerank, /rerank and /v2/rerank (the Jina/Cohere body, as vLLM serves it): the
documents scored against the query, most relevant first."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response

from server.api.body import openapi_body, parse_body
from server.api.pooling_protocol import RerankRequest
from server.api.request_ids import echo_request_id, request_id_for
from server.respond.pooling_bodies import rerank_body
from server.routes.pair_scores import pair_scores
from server.runtime.pooling_client import pooling_engine
from server.runtime.pooling_run import run_admitted
from server.runtime.state import State
from server.translate.pooling_inputs import check_pairs, pair_inputs
from server.worker_pool import run_blocking

router = APIRouter()


@router.post("/v1/rerank", openapi_extra=openapi_body(RerankRequest))
@router.post("/rerank", include_in_schema=False)
@router.post("/v2/rerank", include_in_schema=False)
async def rerank(request: Request, response: Response, state: State) -> dict[str, Any]:
    body = await parse_body(request, RerankRequest, state.settings)
    request_id, client_id = request_id_for(request, "rerank")
    documents = body.document_texts()
    admitted = state.admit(body.model, lambda engine: check_pairs(
        request_id, body, [body.query, *documents], pooling_engine(engine, "/v1/rerank"), "documents"))
    engine = pooling_engine(admitted.engine, "/v1/rerank")
    inputs = await run_blocking(pair_inputs, [(body.query, d) for d in documents], body.truncate_prompt_tokens,
                                body.instruction, engine, "documents")
    scores = await run_admitted(admitted, request_id, len(documents), inputs.num_tokens,
                                lambda: pair_scores(engine, inputs, body.priority))
    echo_request_id(response, client_id)
    return rerank_body(request_id, state.served_model_name, documents, scores, body.top_n,
                       body.return_documents, inputs.num_tokens)
