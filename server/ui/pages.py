"""The web page at /: static files shipped inside the package (server/ui/static/), served
as they are, with no build step and nothing fetched from elsewhere. Every response carries
a Content-Security-Policy that allows script only from these files: model output that
slipped past the page's escaping still could not run."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, JSONResponse, Response

from server.api.errors import error_response

STATIC_DIR = Path(__file__).parent / "static"
# Only these names are served: no path from the URL ever reaches the file system.
FILES = {"app.js": "text/javascript", "app.css": "text/css", "markdown.js": "text/javascript",
         "charts.js": "text/javascript", "sse.js": "text/javascript",
         "icon.svg": "image/svg+xml"}
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
       "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
           "Referrer-Policy": "no-referrer", "Cache-Control": "no-cache"}

router = APIRouter()


@router.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)  # agents check a base URL with HEAD
async def index() -> Response:
    return FileResponse(STATIC_DIR / "index.html", media_type="text/html", headers=HEADERS)


@router.get("/ui/config.json", include_in_schema=False)
async def config(request: Request) -> Response:
    """What the page needs before its first API call: whether to ask for a key (so it does
    not learn it from a failed request), and the model's name unless a key guards it."""
    state = request.app.state.server
    auth = bool(state.settings.api_key)
    return JSONResponse({"auth": auth, "model": None if auth else state.served_model_name},
                        headers=HEADERS)


@router.get("/ui/{name}", include_in_schema=False)
async def static_file(name: str) -> Response:
    if name not in FILES:
        return error_response(404, f"No such file: {name[:64]}")
    return FileResponse(STATIC_DIR / name, media_type=FILES[name], headers=HEADERS)
