"""The engine behind a pooling route: the pooling client (server/api/pooling_client.py), or
the 400 a generation server answers."""

from __future__ import annotations

from server.api.errors import APIError
from server.api.pooling_client import PoolingClient
from server.runtime.engine_client import EngineClient


def pooling_engine(engine: EngineClient, endpoint: str) -> PoolingClient:
    """The engine as a pooling client, or the 400 a generation server answers."""
    if not isinstance(engine, PoolingClient):
        raise APIError(400, f"{endpoint} needs a pooling model: this server generates text with "
                            f"{engine.model_name}; serve an embedding or reranking checkpoint "
                            "(--task embed or --task score)", "model")
    return engine
