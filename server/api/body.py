"""Reading and parsing a request body with bounds, before any work starts.

- The body is read with a size limit (413 past --max-body-bytes, at once when the
  Content-Length says so) and a deadline (408 past --body-timeout, and the connection is
  closed), so a client that sends half a body cannot hold a worker.
- Parsing is pydantic's JSON parser (it refuses lone surrogates and, with the models'
  allow_inf_nan=False, NaN and Infinity), in the worker pool for large bodies.
- Validation errors are bounded: lists fail fast, and the message reflects at most one
  error and about 100 characters of input.

FastAPI would parse the body on the event loop before the route runs, so the routes take
the raw Request and call `parse_body`; `openapi_body` keeps the schema in /openapi.json.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect

from engine.request_limits import clip
from server.api.errors import APIError
from server.settings import ServerSettings
from server.worker_pool import run_blocking

M = TypeVar("M", bound=BaseModel)
OFFLOAD_BYTES = 64 * 2**10  # bodies above this are parsed in the worker pool


def too_large(limit: int) -> APIError:
    return APIError(413, f"The request body exceeds {limit} bytes (--max-body-bytes).", None,
                    headers={"Connection": "close"})


async def read_body(request: Request, settings: ServerSettings) -> bytes:
    limit = settings.max_body_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large(limit)
    deadline = time.monotonic() + settings.body_timeout_s
    chunks: list[bytes] = []
    size = 0
    stream = request.stream().__aiter__()
    while True:
        remaining = deadline - time.monotonic()
        try:
            chunk = await asyncio.wait_for(stream.__anext__(), max(remaining, 0.001))
        except StopAsyncIteration:
            break
        except asyncio.TimeoutError:
            raise APIError(408, f"The request body was not received within "
                           f"{settings.body_timeout_s:g} s (--body-timeout).",
                           headers={"Connection": "close"}) from None
        except ClientDisconnect:
            raise APIError(400, "The client disconnected while sending the body.") from None
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def describe(exc: ValidationError) -> tuple[str, str | None]:
    """One readable message and the offending field, never more than a few hundred chars."""
    errors = exc.errors(include_url=False, include_context=True, include_input=False)
    if not errors:
        return "Invalid request", None
    first = errors[0]
    if first.get("type") == "json_invalid":
        detail = str(first.get("ctx", {}).get("error", ""))
        return clip(f"Invalid JSON body: {detail}".rstrip(": "), 200), None
    loc = [str(part) for part in first.get("loc", ())]
    param = loc[0] if loc else None
    where = clip(".".join(loc), 100)
    message = clip(str(first.get("msg", "invalid value")).removeprefix("Value error, "), 200)
    if first.get("type") == "missing":
        message = "field required"
    text = f"{where}: {message}" if where else message
    if exc.error_count() > 1:
        text += f" (and {exc.error_count() - 1} more error(s))"
    return text, clip(param, 100) if param else None


def parse(raw: bytes, model: type[M]) -> M:
    if not raw.strip():
        raise APIError(400, "The request body is empty; send a JSON object.")
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        message, param = describe(exc)
        raise APIError(400, message, param) from None


async def parse_body(request: Request, model: type[M], settings: ServerSettings) -> M:
    raw = await read_body(request, settings)
    if len(raw) > OFFLOAD_BYTES:
        return await run_blocking(parse, raw, model)
    return parse(raw, model)


def openapi_body(model: type[BaseModel]) -> dict[str, Any]:
    """The route's requestBody for /openapi.json (install_openapi adds the schema)."""
    ref = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": ref}}}}


def install_openapi(app: FastAPI, models: list[type[BaseModel]]) -> None:
    def build() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, summary=app.summary,
                                 routes=app.routes)
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            for model in models:
                body = model.model_json_schema(ref_template="#/components/schemas/{model}")
                components.update(body.pop("$defs", {}))
                components[model.__name__] = body
            app.openapi_schema = schema
        return app.openapi_schema
    app.openapi = build  # type: ignore[method-assign]
