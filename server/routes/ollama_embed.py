"""POST /api/embed (Ollama's): the same path as /v1/embeddings, in Ollama's shapes. Vectors
are always unit length, as Ollama returns them; `truncate` (default true) cuts an over-long
input to the model's context instead of refusing it."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request

from server.api.body import openapi_body, parse_body
from server.api.ollama_protocol import OllamaEmbedRequest
from server.api.pooling_protocol import EmbeddingRequest
from server.api.request_ids import request_id_for
from server.respond.pooling_bodies import ollama_embed_body
from server.runtime.pooling_client import pooling_engine
from server.runtime.pooling_run import run_admitted
from server.runtime.state import State
from server.translate.pooling_inputs import check_embedding, embedding_inputs
from server.worker_pool import run_blocking

router = APIRouter()


@router.post("/api/embed", openapi_extra=openapi_body(OllamaEmbedRequest))
async def ollama_embed(request: Request, state: State) -> dict[str, Any]:
    start = time.perf_counter_ns()
    ollama = await parse_body(request, OllamaEmbedRequest, state.settings)
    body = EmbeddingRequest(model=ollama.model, input=ollama.input, dimensions=ollama.dimensions,
                            truncate_prompt_tokens=-1 if ollama.truncate else None)
    request_id, _ = request_id_for(request, "embd")
    admitted = state.admit(body.model, lambda engine: check_embedding(request_id, body,
                                                                      pooling_engine(engine, "/api/embed")))
    engine = pooling_engine(admitted.engine, "/api/embed")
    inputs = await run_blocking(embedding_inputs, body, engine)
    tokens = sum(len(i) for i in inputs)
    vectors = await run_admitted(admitted, request_id, len(inputs), tokens, lambda: engine.embed(inputs))
    return await run_blocking(ollama_embed_body, vectors, body.dimensions, ollama.model, tokens,
                              time.perf_counter_ns() - start)
