"""GET /health (and vLLM's /ping) and /version: what probes and operators ask, without a
key. /health is 503 while the model loads, once the engine loop has died, and while the
server drains."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as package_version

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from server.api.errors import error_response
from server.runtime.state import State

router = APIRouter()


@router.get("/health")
async def health(state: State) -> Response:
    problem = state.health_problem()
    if problem is not None:
        return error_response(503, problem)
    return JSONResponse({"status": "ok"})


@router.get("/ping")
async def ping(state: State) -> Response:
    """vLLM's alias of /health (SageMaker-style probes use it)."""
    return await health(state)


@router.get("/version")
async def version() -> dict[str, str]:
    try:
        return {"version": package_version("pagode")}
    except PackageNotFoundError:
        return {"version": "unknown"}


# Mounted in place of the web page under --no-ui (server/app.py); the page's own route
# answers HEAD too.
root_without_page = APIRouter()


@root_without_page.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)
async def reachable(request: Request) -> Response:
    """Claude Code checks that its base URL answers a HEAD of / with a 200, so the root
    answers HEAD without the page; a GET finds nothing there, as on any unknown path."""
    if request.method == "HEAD":
        return Response(status_code=200)
    return error_response(404, f"Not found: GET {request.url.path}", path=request.url.path)
