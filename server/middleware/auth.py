"""--api-key: a Bearer token (or Anthropic's `x-api-key` header, which the anthropic SDK and
Claude Code send) on the API routes and the stats stream; /health and /metrics stay open so
that probes and scrapers need no secret."""

from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from server.api.errors import error_response

# /stats/ too: the live view's series say how busy the server is. The page itself (/ and
# /ui/) is open: it holds no secret and asks for the key.
PROTECTED_PREFIXES = ("/v1/", "/tokenize", "/detokenize", "/stats/", "/reset_prefix_cache")


def is_protected(path: str) -> bool:
    return path.startswith(PROTECTED_PREFIXES)


def bearer_matches(authorization: str | None, api_key: str) -> bool:
    if not authorization:
        return False
    scheme, _, token = authorization.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(),
                                                              api_key.encode())


def key_matches(given: bytes | None, api_key: str) -> bool:
    return given is not None and hmac.compare_digest(given.strip(), api_key.encode())


class APIKeyMiddleware:
    """Pure ASGI (not BaseHTTPMiddleware), so streaming and disconnects pass untouched."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.api_key = api_key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and is_protected(scope["path"]):
            headers = dict(scope["headers"])
            raw = headers.get(b"authorization")
            if not (bearer_matches(raw.decode("latin-1") if raw else None, self.api_key)
                    or key_matches(headers.get(b"x-api-key"), self.api_key)):
                response = error_response(
                    401, "Unauthorized: a valid 'Authorization: Bearer <key>' (or 'x-api-key') "
                    "header is required", headers={"WWW-Authenticate": "Bearer"},
                    path=scope["path"])
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
