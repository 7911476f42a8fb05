"""GET /metrics: Prometheus' text format (server/runtime/metrics.py), open to scrapers
without a key; 503 until the engine is loaded."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response

from server.api.errors import error_response
from server.runtime.metrics import CONTENT_TYPE
from server.runtime.state import State

router = APIRouter()


@router.get("/metrics")
async def metrics(state: State) -> Response:
    if state.metrics is None:
        return error_response(503, "The model is loading")
    return Response(state.metrics.render(), media_type=CONTENT_TYPE)
