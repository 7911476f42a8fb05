"""What the pooling routes may call on the engine, beside server/runtime/engine_client.py's
members: engine.pooling's AsyncPoolingEngine offers it; the LLM engine does not, and a
pooling request to it is a 400 that says which task the server runs."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from engine.config import EngineConfig
from engine.io.request_limits import RequestLimits
from engine.pooling.checkpoint import PoolingSpec
from engine.pooling.inputs import PoolingInput
from engine.tokenizer import Tokenizer
from server.api.errors import APIError
from server.runtime.engine_client import EngineClient


@runtime_checkable
class PoolingClient(Protocol):
    config: EngineConfig
    task: str
    spec: PoolingSpec
    hidden_size: int
    max_model_len: int
    tokenizer: Tokenizer
    limits: RequestLimits

    async def embed(self, inputs: list[PoolingInput], priority: int = 0) -> list[torch.Tensor]: ...

    async def score(self, inputs: list[PoolingInput], priority: int = 0) -> list[torch.Tensor]: ...


def pooling_engine(engine: EngineClient, endpoint: str) -> PoolingClient:
    """The engine as a pooling client, or the 400 a generation server answers."""
    if not isinstance(engine, PoolingClient):
        raise APIError(400, f"{endpoint} needs a pooling model: this server generates text with "
                            f"{engine.model_name}; serve an embedding or reranking checkpoint "
                            "(--task embed or --task score)", "model")
    return engine
