"""The web console: static pages at `/console/` that use only the public HTTP API, same origin.

No build step: `static/` holds the HTML, the ES modules and the CSS as they are served. Every
console response carries a strict Content-Security-Policy (no inline scripts or styles, requests
only to this origin) and refuses to be framed.
"""

from __future__ import annotations

from pathlib import Path

from starlette.requests import Request
from starlette.responses import FileResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

STATIC = Path(__file__).resolve().parent / "static"
PREFIX = "/console"

CSP = (
    "default-src 'self'; connect-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
    "frame-ancestors 'none'"
)
HEADERS = {
    "content-security-policy": CSP,
    "x-frame-options": "DENY",
    "referrer-policy": "no-referrer",
    "cache-control": "no-cache",  # revalidate (ETag): a new Rill's console shows at once
}
# Set here rather than guessed: the platform's MIME table differs between machines.
MEDIA_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}


class ConsoleFiles(StaticFiles):
    """The files of `static/` (`index.html` for the directory), with the console's headers."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        response = await super().get_response(path, scope)
        response.headers.update(HEADERS)
        media_type = MEDIA_TYPES.get(Path(path).suffix or ".html")
        if media_type is not None and response.status_code == 200:
            response.headers["content-type"] = media_type
        return response


async def index(request: Request) -> Response:
    """`/console` itself (no slash): the page, whose assets are named by absolute paths."""
    return FileResponse(STATIC / "index.html", media_type=MEDIA_TYPES[".html"], headers=HEADERS)


async def to_console(request: Request) -> Response:
    return RedirectResponse(PREFIX + "/", status_code=307)


def routes() -> list[BaseRoute]:
    """`/` redirects to the console; `/console` and `/console/...` serve it (GET and HEAD)."""
    return [
        Route("/", to_console, methods=["GET", "HEAD"]),
        Route(PREFIX, index, methods=["GET", "HEAD"]),
        Mount(PREFIX, app=ConsoleFiles(directory=STATIC, html=True), name="console"),
    ]
