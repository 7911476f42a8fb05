"""POST /reset_prefix_cache, as vLLM names it: forget every cached prefix block (the KV events
then say AllBlocksCleared). Behind the API key like /v1/*, and JSON-typed like every POST
(server/middleware/content_type.py), so that no web page can empty the cache of a local server."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response

from server.runtime.state import State

router = APIRouter()


@router.post("/reset_prefix_cache")
async def reset_prefix_cache(state: State) -> Response:
    await state.require_engine().reset_prefix_cache()
    return Response(status_code=200)
