"""Errors on the Anthropic Messages routes keep Anthropic's shape and status codes, those
of every other route OpenAI's: the renderer every handler and middleware calls, for each
status pagode answers (a queue-full 429 and a loading 503 are overload to an Anthropic
client, which retries a 529)."""

from __future__ import annotations

import json

import pytest

from server.api.errors import error_response


@pytest.mark.parametrize(("status", "sent", "kind"), [
    (400, 400, "invalid_request_error"), (401, 401, "authentication_error"),
    (404, 404, "not_found_error"), (413, 413, "request_too_large"),
    (415, 415, "invalid_request_error"), (429, 529, "overloaded_error"),
    (503, 529, "overloaded_error"), (500, 500, "api_error")])
def test_messages_routes_answer_in_anthropic_shape(status: int, sent: int, kind: str) -> None:
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        response = error_response(status, "why", "param", {"Retry-After": "1"}, path)
        assert response.status_code == sent
        assert json.loads(response.body) == {"type": "error",
                                             "error": {"type": kind, "message": "why"}}
        assert response.headers["Retry-After"] == "1"


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/responses", "/v1/messagesx", ""])
def test_other_routes_keep_openai_shape(path: str) -> None:
    response = error_response(429, "why", "param", path=path)
    assert response.status_code == 429
    assert json.loads(response.body) == {"error": {"message": "why", "type": "RateLimitError",
                                                   "param": "param", "code": 429}}
