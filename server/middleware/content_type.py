"""POST bodies must say they are JSON: anything else gets 415 before any work starts.

A web page can send `text/plain`, a form or a typeless Blob to a local server without a CORS
preflight (the "simple requests" of the Fetch standard), so a server that parses such a
body as JSON can be driven by any page its user visits: the CSRF hole that FastAPI closed
for its own JSON bodies in 0.65.2. pagode parses bodies itself (server/api/body.py), so it
closes the hole here, on every POST route: `application/json`, with parameters such as
`charset`, and nothing else.
"""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from server.api.errors import error_response

JSON = "application/json"


def media_type(scope: Scope) -> str | None:
    """The request's media type, lower-cased and without parameters; None when absent."""
    value = Headers(scope=scope).get("content-type")
    return None if value is None else value.split(";", 1)[0].strip().lower()


class JSONContentTypeMiddleware:
    """On the app's POST routes (`paths`); any other path keeps its 404 or 405."""

    def __init__(self, app: ASGIApp, paths: set[str]) -> None:
        self.app = app
        self.paths = frozenset(paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] in self.paths:
            given = media_type(scope)
            if given != JSON:
                shown = "no Content-Type" if given is None else f"Content-Type {given[:60]!r}"
                response = error_response(
                    415, f"The request body must be JSON: send Content-Type: {JSON} "
                    f"(got {shown}).", "Content-Type", headers={"Connection": "close"},
                    path=scope["path"])
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
