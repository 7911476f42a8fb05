"""What the server counts of its HTTP responses: each one by status and error type
(pagode:http_responses_total, an error inside a stream included), and the time spent
building and JSON-encoding stream chunks (a row of --profile-steps' table)."""

from __future__ import annotations

from collections import Counter

from server.api.errors import error_type


class ResponseStats:
    def __init__(self) -> None:
        self.responses: Counter[tuple[str, str]] = Counter()
        self.encode_seconds = 0.0

    def count(self, status: int) -> None:
        self.responses[(str(status), error_type(status) if status >= 400 else "none")] += 1

    def add_encode_time(self, seconds: float) -> None:
        self.encode_seconds += seconds
