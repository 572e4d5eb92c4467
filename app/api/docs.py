"""The API's description: ``/openapi.json``, Swagger UI at ``/docs`` and ReDoc at ``/redoc``.

FastAPI's own pages, served from here so that they can be guarded: with keys set, each needs one
(client or admin) unless ``MEMPROXY_DOCS_REQUIRE_KEY=false``; :mod:`app.main` leaves the router
out with ``MEMPROXY_DOCS_ENABLED=false``. A description tells an attacker every route and field.

The pages load nothing from outside the server: FastAPI's default HTML fetches Swagger UI and
ReDoc from a CDN (a blank page offline, and every visit told to a third party); here their files
come from the ``fastapi-offline`` package, served at :data:`ASSETS_PATH` under the same guard as
the pages, with ReDoc's Google fonts and Swagger UI's online validator off.
"""

from __future__ import annotations

from pathlib import Path

import fastapi_offline
from fastapi import APIRouter, Depends, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from starlette.responses import FileResponse, HTMLResponse, JSONResponse

from app.deps import Services, check_any_key
from app.errors import NotFound

ASSETS_PATH = "/docs/static"
_ASSETS_DIR = Path(fastapi_offline.__file__).parent / "static"
_ASSETS = {
    "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
    "swagger-ui.css": "text/css; charset=utf-8",
    "redoc.standalone.js": "text/javascript; charset=utf-8",
    "favicon.png": "image/png",
}
"""The files the pages reference, with their media types: nothing else of the folder is served."""


async def _guard(request: Request) -> None:
    services: Services = request.app.state.services
    if services.settings.docs_require_key:
        check_any_key(services, request.headers.get("authorization"))


router = APIRouter(include_in_schema=False, dependencies=[Depends(_guard)])


@router.get("/openapi.json")
async def openapi(request: Request) -> JSONResponse:
    return JSONResponse(request.app.openapi())


@router.get("/docs")
async def swagger_ui(request: Request) -> HTMLResponse:
    assets = _root(request) + ASSETS_PATH
    return get_swagger_ui_html(
        openapi_url=_root(request) + "/openapi.json",
        title="memproxy - Swagger UI",
        swagger_js_url=f"{assets}/swagger-ui-bundle.js",
        swagger_css_url=f"{assets}/swagger-ui.css",
        swagger_favicon_url=f"{assets}/favicon.png",
        swagger_ui_parameters={"validatorUrl": None},  # else it may call validator.swagger.io
    )


@router.get("/redoc")
async def redoc(request: Request) -> HTMLResponse:
    assets = _root(request) + ASSETS_PATH
    return get_redoc_html(
        openapi_url=_root(request) + "/openapi.json",
        title="memproxy - ReDoc",
        redoc_js_url=f"{assets}/redoc.standalone.js",
        redoc_favicon_url=f"{assets}/favicon.png",
        with_google_fonts=False,
    )


@router.get(ASSETS_PATH + "/{name}")
async def asset(name: str) -> FileResponse:
    """One of the pages' files (:data:`_ASSETS`), streamed from the package; 404 otherwise."""
    media_type = _ASSETS.get(name)
    if media_type is None:  # a name from the URL never reaches the file system unchecked
        raise NotFound(f"no file {name[:64]!r} in the API's docs")
    return FileResponse(
        _ASSETS_DIR / name, media_type=media_type, headers={"X-Content-Type-Options": "nosniff"}
    )


def _root(request: Request) -> str:
    # Behind a proxy that mounts memproxy under a prefix, the page must ask for prefixed URLs.
    return str(request.scope.get("root_path", ""))
