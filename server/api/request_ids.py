"""Request ids: a client's `X-Request-Id` becomes the id (`chatcmpl-<id>`, `cmpl-<id>`), as
in vLLM, so that a client can find its request in the server's log; otherwise one is made.
The id goes back in the `X-Request-Id` response header."""

from __future__ import annotations

import re
import uuid

from fastapi import Request
from fastapi.responses import Response

HEADER = "X-Request-Id"
MAX_LEN = 128
SAFE = re.compile(r"[^A-Za-z0-9._:-]")  # the id lands in log lines and engine ids


def request_id_for(request: Request, prefix: str) -> tuple[str, str]:
    """(the response id, the id to echo in the header)."""
    given = request.headers.get(HEADER, "").strip()
    client_id = SAFE.sub("_", given)[:MAX_LEN] if given else uuid.uuid4().hex
    return f"{prefix}-{client_id}", client_id


def echo_request_id(response: Response, client_id: str) -> Response:
    response.headers[HEADER] = client_id
    return response
