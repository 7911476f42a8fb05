"""POST /models/load and /models/unload {"model": NAME}: load or unload one of the models a
server of several serves, as llama.cpp's router takes them. Loading makes room as a request
naming the model would (least recently used idle model first); unloading a model with
requests running is a 409, and the only model of a one-model server a 400."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict

from server.api.errors import APIError
from server.runtime.state import State

router = APIRouter()


class ModelAction(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str


@router.post("/models/load")
async def load_model(body: ModelAction, state: State) -> dict[str, Any]:
    model = state.registry.get(body.model)
    await state.registry.ensure_loaded(model)
    return {"success": True, "model": model.name, "loaded": True}


@router.post("/models/unload")
async def unload_model(body: ModelAction, state: State) -> dict[str, Any]:
    model = state.registry.get(body.model)
    if not state.registry.several:  # nothing would load it again: requests are not routed
        raise APIError(400, "This server serves one model; unloading it would leave nothing to serve", "model")
    await state.registry.unload(model)
    return {"success": True, "model": model.name, "loaded": False}
