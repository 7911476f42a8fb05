"""POST /v1/embeddings (OpenAI's): parse, admit, tokenize, pool, respond."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from server.api.body import openapi_body, parse_body
from server.api.pooling_protocol import EmbeddingRequest
from server.api.request_ids import echo_request_id, request_id_for
from server.respond.pooling_bodies import embeddings_json
from server.runtime.pooling_client import pooling_engine
from server.runtime.pooling_run import run_admitted
from server.runtime.state import State
from server.translate.pooling_inputs import check_embedding, embedding_inputs
from server.worker_pool import run_blocking

router = APIRouter()


@router.post("/v1/embeddings", openapi_extra=openapi_body(EmbeddingRequest))
async def create_embeddings(request: Request, state: State) -> Response:
    body = await parse_body(request, EmbeddingRequest, state.settings)
    request_id, client_id = request_id_for(request, "embd")
    admitted = state.admit(body.model, lambda engine: check_embedding(
        request_id, body, pooling_engine(engine, "/v1/embeddings")))
    engine = pooling_engine(admitted.engine, "/v1/embeddings")
    inputs = await run_blocking(embedding_inputs, body, engine)
    tokens = sum(len(i) for i in inputs)
    vectors = await run_admitted(admitted, request_id, len(inputs), tokens, lambda: engine.embed(inputs, body.priority))
    content = await run_blocking(embeddings_json, vectors, body.dimensions, body.encoding_format,
                                 state.served_model_name, tokens)
    return echo_request_id(Response(content, media_type="application/json"), client_id)
