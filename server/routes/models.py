"""GET /v1/models: the one model served, under the name clients send (vLLM's card)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from server.api.protocol import now
from server.runtime.state import State

router = APIRouter()


@router.get("/v1/models")
async def list_models(state: State) -> dict[str, Any]:
    engine = state.require_engine()
    card = {"id": state.served_model_name, "object": "model", "created": now(),
            "owned_by": "pagode", "root": str(engine.model_name), "parent": None,
            "max_model_len": engine.max_model_len}
    return {"object": "list", "data": [card]}
