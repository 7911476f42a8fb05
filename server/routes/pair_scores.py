"""Scores of (query, document) pairs, for /v1/rerank and /v1/score: a scoring model's own,
or for an embedding model the cosine of the two vectors, as vLLM scores with a bi-encoder."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from server.api.pooling_client import PoolingClient
from server.translate.pooling_inputs import PairInputs


async def pair_scores(engine: PoolingClient, inputs: PairInputs, priority: int = 0) -> list[float]:
    """One score per pair: the scorer's own for a cross-encoder or reranker, else the cosine
    of the pair's query and document embeddings (each distinct query embedded once)."""
    if inputs.pairs is not None:
        return [float(s) for s in await engine.score(inputs.pairs, priority)]
    vectors = await engine.embed(inputs.queries + inputs.documents, priority)
    queries = torch.stack(vectors[:len(inputs.queries)])[inputs.query_of]
    documents = torch.stack(vectors[len(inputs.queries):])
    return F.cosine_similarity(queries, documents, dim=-1).tolist()
