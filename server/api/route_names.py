"""The name a request's endpoint is counted under: its route's path template
(`/v1/responses/{response_id}`, not the id), as prometheus-fastapi-instrumentator names
vLLM's `handler` label, so that ids do not make a series each; a path no route serves is
"none". Matched against the app's routes here, not read from the routing, because a
middleware may answer (401, 413, 415) before any route is chosen."""

from __future__ import annotations

from collections.abc import Sequence

from starlette.routing import BaseRoute, Match
from starlette.types import Scope

UNTEMPLATED = "none"
# Scraped and probed all the time: vLLM leaves these out of its per-endpoint counts.
UNCOUNTED = frozenset({"/metrics", "/health", "/ping", "/version", "/load", "/server_info"})


def handler_of(scope: Scope, routes: Sequence[BaseRoute]) -> str:
    """The path template of the one of `routes` that serves `scope`, or "none". The app
    hands over its routers' own routes: FastAPI wraps the routers it includes, whose
    wrappers carry no path."""
    for route in routes:
        match, _ = route.matches(scope)
        if match == Match.FULL:
            return str(getattr(route, "path", UNTEMPLATED))
    return UNTEMPLATED
