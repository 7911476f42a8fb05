"""GET /metrics: Prometheus' text format (server/runtime/metrics.py), every served model's
series under its `model_name` label, open to scrapers without a key; 503 until the
default model is loaded."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response

from server.api.errors import error_response
from server.runtime.metrics import CONTENT_TYPE
from server.runtime.model_metrics import render_models
from server.runtime.state import State

router = APIRouter()


@router.get("/metrics")
async def metrics(state: State) -> Response:
    if state.metrics is None:
        return error_response(503, "The model is loading")
    sources = [m.metrics for m in state.registry.models if m.metrics is not None]
    return Response(render_models(sources), media_type=CONTENT_TYPE)
