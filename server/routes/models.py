"""GET /v1/models: every model served, under the name clients send (vLLM's card), with
whether it is loaded now (a server of several loads the others when a request names them),
and each LoRA adapter loaded on one, as vLLM lists them: the adapter's name, its folder as
`root`, the base model as `parent`."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from server.api.protocol import now
from server.runtime.served_model import ServedModel
from server.runtime.state import State

router = APIRouter()


@router.get("/v1/models")
async def list_models(state: State) -> dict[str, Any]:
    if state.registry.several:
        state.require_healthy()  # the others are listed whether loaded or not
    else:
        state.require_engine()
    return {"object": "list", "data": [c for model in state.registry.models for c in [card(model), *adapters(model)]]}


def card(model: ServedModel) -> dict[str, Any]:
    engine = model.engine
    config = model.spec.config
    root = str(engine.model_name) if engine is not None else str(config.model if config else model.name)
    card: dict[str, Any] = {"id": model.name, "object": "model", "created": now(), "owned_by": "pagode",
                            "root": root, "parent": None, "loaded": model.loaded}
    if engine is not None:
        card["max_model_len"] = engine.max_model_len
    return card


def adapters(model: ServedModel) -> list[dict[str, Any]]:
    engine = model.engine
    if engine is None:
        return []
    return [{"id": name, "object": "model", "created": now(), "owned_by": "pagode", "root": path,
             "parent": model.name, "loaded": True} for name, path in engine.lora_adapters().items()]
