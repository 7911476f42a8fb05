"""What the server counts of its HTTP responses: each one by status and error type
(pagode:http_responses_total, an error inside a stream included), the same per endpoint
(vLLM's http_requests_total, and pagode:http_request_errors_total for the errors), and the
time spent building and JSON-encoding stream chunks (a row of --profile-steps' table)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from starlette.routing import BaseRoute
from starlette.types import Scope

from server.api.errors import error_type
from server.api.route_names import UNCOUNTED, handler_of


class ResponseStats:
    def __init__(self) -> None:
        self.responses: Counter[tuple[str, str]] = Counter()
        # (handler, method, status class "2xx"...), counted when a response starts, as vLLM
        self.requests: Counter[tuple[str, str, str]] = Counter()
        # (handler, method, code, error type) of every error, those inside a stream included
        self.errors: Counter[tuple[str, str, str, str]] = Counter()
        self.encode_seconds = 0.0
        self.routes: Sequence[BaseRoute] = ()  # the app's, which name the endpoints

    def count(self, status: int, scope: Scope | None = None, in_stream: bool = False) -> None:
        """One response (or, `in_stream`, an error sent inside a stream whose 200 was
        counted already) of the request `scope`."""
        kind = error_type(status) if status >= 400 else "none"
        self.responses[(str(status), kind)] += 1
        if scope is None:
            return
        handler = handler_of(scope, self.routes)
        if handler in UNCOUNTED:
            return
        method = str(scope.get("method", ""))
        if not in_stream:
            self.requests[(handler, method, f"{status // 100}xx")] += 1
        if status >= 400:
            self.errors[(handler, method, str(status), kind)] += 1

    def add_encode_time(self, seconds: float) -> None:
        self.encode_seconds += seconds
