"""GET /health (and vLLM's /ping) and /version: what probes and operators ask, without a
key. /health is 503 while the model loads, once the engine loop has died, and while the
server drains."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as package_version

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from server.api.errors import error_response
from server.runtime.state import get_state

router = APIRouter()


@router.get("/health")
async def health(request: Request) -> Response:
    problem = get_state(request).health_problem()
    if problem is not None:
        return error_response(503, problem)
    return JSONResponse({"status": "ok"})


@router.get("/ping")
async def ping(request: Request) -> Response:
    """vLLM's alias of /health (SageMaker-style probes use it)."""
    return await health(request)


@router.get("/version")
async def version() -> dict[str, str]:
    try:
        return {"version": package_version("pagode")}
    except PackageNotFoundError:
        return {"version": "unknown"}
