"""What the pooling routes and their translation read and call on the engine: engine.pooling's
AsyncPoolingEngine offers it; the LLM engine does not (server/runtime/pooling_client.py turns
that into the 400 a generation server answers). One protocol for both, so the checks and the
calls cannot drift apart."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from engine.config import EngineConfig
from engine.pooling.checkpoint import PoolingSpec
from engine.pooling.inputs import PoolingInput
from engine.request_limits import RequestLimits
from engine.tokenizer import Tokenizer


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
