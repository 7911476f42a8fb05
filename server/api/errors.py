"""OpenAI-shaped errors and the handlers that turn every failure into one.

Every error body is {"error": {"message", "type", "param", "code"}}, except on the Anthropic
Messages routes, which answer in that API's shape (server/api/anthropic_errors.py): the
handlers and middlewares pass the request's path. Validation failures are 400 (never
FastAPI's 422) and only real internal faults are 500.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Scope

from engine.types.errors import EngineDeadError, InvalidRequestError, RequestFailedError
from server.api.anthropic_errors import anthropic_error_body, anthropic_status, speaks_anthropic
from server.api.ollama_protocol import ollama_error_body, speaks_ollama

logger = logging.getLogger("pagode.server")

ERROR_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    404: "NotFoundError",
    405: "MethodNotAllowedError",
    408: "RequestTimeoutError",
    413: "RequestTooLargeError",
    415: "UnsupportedMediaTypeError",
    431: "RequestHeaderFieldsTooLargeError",
    429: "RateLimitError",
    499: "ClientClosedRequestError",  # nginx's code: the client left before the answer
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}


class APIError(Exception):
    """An error with an HTTP status that the handlers render as an OpenAI error body."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.headers = headers

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message, self.param)


def bad_request(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param)


def error_type(status: int) -> str:
    """The OpenAI-style error type of a status; never raises (a status that HTTPStatus
    does not know, such as nginx's 499, would otherwise fail the response counter)."""
    if status in ERROR_TYPES:
        return ERROR_TYPES[status]
    try:
        return HTTPStatus(status).phrase.replace(" ", "").replace("-", "") + "Error"
    except ValueError:
        return f"HTTP{status}Error"


def error_body(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    kind = error_type(status)
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


def error_response(status: int, message: str, param: str | None = None,
                   headers: dict[str, str] | None = None, path: str = "") -> JSONResponse:
    """The error in the shape of the API that `path` belongs to."""
    if speaks_anthropic(path):
        return JSONResponse(anthropic_error_body(status, message),
                            status_code=anthropic_status(status), headers=headers)
    if speaks_ollama(path):
        return JSONResponse(ollama_error_body(message), status_code=status, headers=headers)
    return JSONResponse(error_body(status, message, param), status_code=status, headers=headers)


def api_error_from(exc: BaseException, request_id: str | None = None) -> APIError:
    """Map an exception raised while serving a request to the status it deserves. Internal
    faults are logged with the request id; their text never reaches the client."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, InvalidRequestError):
        return APIError(400, str(exc), exc.param)
    where = f" (request {request_id})" if request_id else ""
    if isinstance(exc, EngineDeadError):
        logger.error("engine not running%s: %s", where, exc)
        return APIError(503, "The engine is not running; retry later.")
    if isinstance(exc, RequestFailedError):
        logger.error("request failed inside the engine%s: %s", where, exc)
        return APIError(500, f"The request failed inside the engine{where}; "
                        "the server log has the details.")
    logger.error("internal error%s", where, exc_info=exc)
    return APIError(500, f"Internal server error{where}.")


def describe_validation_error(exc: RequestValidationError) -> tuple[str, str | None]:
    """One readable message and the offending field, from pydantic's error list."""
    errors = exc.errors()
    if not errors:
        return "Invalid request", None
    first = errors[0]
    if first.get("type") == "json_invalid":
        detail = first.get("ctx", {}).get("error", "")
        return f"Invalid JSON body: {detail}".rstrip(": "), None
    loc = [str(part) for part in first.get("loc", ()) if part != "body"]
    # Union members add their type name to the location; the field is the first part.
    param = loc[0] if loc else None
    where = ".".join(loc)
    message = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    if first.get("type") == "missing":
        message = "field required"
    text = f"{where}: {message}" if where else message
    if len(errors) > 1:
        text += f" (and {len(errors) - 1} more error(s))"
    return text, param


async def handle_validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    message, param = describe_validation_error(exc)
    message = message if len(message) <= 300 else message[:300] + "..."
    return error_response(400, message, param, path=request.url.path)


async def handle_api_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, APIError)
    return error_response(exc.status, exc.message, exc.param, exc.headers, request.url.path)


async def handle_invalid_request(request: Request, exc: Exception) -> JSONResponse:
    """The engine's checks (limits, sampling parameters, grammars) raise this wherever the
    server calls them: one 400 here, no wrapper at each call."""
    assert isinstance(exc, InvalidRequestError)
    return error_response(400, str(exc), exc.param, path=request.url.path)


async def handle_http_exception(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    message = exc.detail if isinstance(exc.detail, str) else HTTPStatus(exc.status_code).phrase
    if exc.status_code == 404:
        message = f"Not found: {request.method} {request.url.path}"
    return error_response(exc.status_code, message, None, dict(exc.headers or {}), request.url.path)


def unexpected_handler(count_response: Callable[[int, Scope], None]) -> Any:
    """The last resort. Starlette sends its answer outside every middleware, the counting
    one included, so it counts the response itself."""
    async def handle_unexpected(request: Request, exc: Exception) -> JSONResponse:
        error = api_error_from(exc)
        response = error_response(error.status, error.message, error.param,
                                  path=request.url.path)
        count_response(response.status_code, request.scope)
        return response
    return handle_unexpected


def install_error_handlers(app: FastAPI, count_response: Callable[[int, Scope], None]) -> None:
    app.add_exception_handler(RequestValidationError, handle_validation_error)
    app.add_exception_handler(APIError, handle_api_error)
    app.add_exception_handler(InvalidRequestError, handle_invalid_request)
    app.add_exception_handler(StarletteHTTPException, handle_http_exception)
    app.add_exception_handler(Exception, unexpected_handler(count_response))
