"""The memory page (``/ui/``), the root page (``/``) that links to it, and the page at the
OpenAI base URL (``/v1``) that says what it is.

The page's files ship inside the package (:mod:`app.ui`); they hold no data and need no key:
the page asks for the key and sends it to the memory API as a bearer key, as curl would. Its
responses forbid everything but the page's own files and the API (Content-Security-Policy), so
a memory that holds markup can never run as script, and the page cannot be framed.
"""

from __future__ import annotations

import html
from functools import cache
from importlib.resources import files

from fastapi import APIRouter, Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from app import __version__
from app.errors import NotFound

router = APIRouter(include_in_schema=False)

_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
          ".css": "text/css; charset=utf-8"}  # fmt: skip
_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self' data: blob:; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


_FILES = frozenset({"index.html", "lib.js", "app.js", "app.css"})


@cache  # of _FILES only: a name from the URL is checked before it reaches here
def _asset(name: str) -> tuple[bytes, str]:
    """A file of the page, with its media type."""
    return files("app.ui").joinpath("static", name).read_bytes(), _TYPES[name[name.rfind(".") :]]


def _serve(name: str) -> Response:
    if name not in _FILES:
        raise NotFound(f"no file {name[:64]!r} in the memory page")
    body, media_type = _asset(name)
    return Response(body, media_type=media_type, headers=_HEADERS)


@router.get("/ui")
async def ui_redirect(request: Request) -> RedirectResponse:
    # The page's links are relative to /ui/ (so that it works under a path prefix too).
    return RedirectResponse(str(request.scope.get("root_path", "")) + "/ui/", status_code=308)


@router.get("/ui/")
async def ui_page() -> Response:
    return _serve("index.html")


@router.get("/ui/static/{name}")
async def ui_file(name: str) -> Response:
    return _serve(name)


@router.get("/")
async def root(request: Request) -> Response:
    """For a browser, a page with links; for anything else, the same as JSON."""
    links = {"memory page": "ui/", "OpenAI base URL": "v1", "API docs": "docs", "MCP": "mcp"}
    if "text/html" not in request.headers.get("accept", ""):
        return JSONResponse(
            {
                "name": "memproxy",
                "version": __version__,
                "links": {k: "/" + v for k, v in links.items()},
            }
        )
    items = "".join(
        f'<li><a href="{href}">{name}</a>: /{href}</li>' for name, href in links.items()
    )
    page = (
        "<!doctype html><html lang=en><meta charset=utf-8><title>memproxy</title>"
        f"<h1>memproxy {__version__}</h1><ul>{items}</ul>"
    )
    return HTMLResponse(page, headers=_HEADERS)


_BASE_ROUTES = {
    "POST /v1/chat/completions": "chat, with the user's memories",
    "GET /v1/models": "the upstream's models",
    "/v1/memories": "the memory API (see /docs)",
    "GET /v1/users/me": "who the key names",
    "/v1/*": "anything else, relayed to the upstream as it is",
}


@router.get("/v1")
@router.get("/v1/")
async def base_url(request: Request) -> Response:
    """What a user finds at the base URL they give their OpenAI client (nothing is served at the
    bare `/v1` upstream either): what it is and the routes under it, as JSON or, for a browser,
    a page."""
    base = str(request.base_url).rstrip("/") + "/v1"
    message = f"This is memproxy's OpenAI base URL: give {base} to an OpenAI client as base_url."
    if "text/html" not in request.headers.get("accept", ""):
        return JSONResponse({"message": message, "openai_base_url": base, "routes": _BASE_ROUTES})
    items = "".join(
        f"<li><code>{html.escape(route)}</code>: {html.escape(what)}</li>"
        for route, what in _BASE_ROUTES.items()
    )
    page = (
        "<!doctype html><html lang=en><meta charset=utf-8><title>memproxy: /v1</title>"
        f"<h1>OpenAI base URL</h1><p>{html.escape(message)}</p><ul>{items}</ul>"
    )
    return HTMLResponse(page, headers=_HEADERS)
