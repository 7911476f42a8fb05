"""Errors in the Anthropic Messages API's shape, for the /v1/messages routes:
{"type": "error", "error": {"type", "message"}}, with Anthropic's status codes.

The anthropic SDK and Claude Code read the error's `type` to decide what to do: they retry
an `overloaded_error` (529) and give up on an `invalid_request_error`. pagode's 429 (its
queue is full) and 503 (loading, draining) are overload in that sense, so both become 529.
"""

from __future__ import annotations

from typing import Any

MESSAGES_PREFIX = "/v1/messages"
OVERLOADED = 529

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    OVERLOADED: "overloaded_error",
}


def speaks_anthropic(path: str) -> bool:
    return path == MESSAGES_PREFIX or path.startswith(MESSAGES_PREFIX + "/")


def anthropic_status(status: int) -> int:
    return OVERLOADED if status in (429, 503) else status


def anthropic_error_type(status: int) -> str:
    if status in ERROR_TYPES:
        return ERROR_TYPES[status]
    return "invalid_request_error" if status < 500 else "api_error"


def anthropic_error_body(status: int, message: str) -> dict[str, Any]:
    """The body for an error of pagode's `status` (mapped with anthropic_status first)."""
    return {"type": "error",
            "error": {"type": anthropic_error_type(anthropic_status(status)), "message": message}}
