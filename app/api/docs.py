"""The API's description: ``/openapi.json``, Swagger UI at ``/docs`` and ReDoc at ``/redoc``.

FastAPI's own pages, served from here so that they can be guarded: with keys set, each needs one
(client or admin) unless ``MEMPROXY_DOCS_REQUIRE_KEY=false``; :mod:`app.main` leaves the router
out with ``MEMPROXY_DOCS_ENABLED=false``. A description tells an attacker every route and field.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from starlette.responses import HTMLResponse, JSONResponse

from app.deps import Services, check_any_key


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
    return get_swagger_ui_html(openapi_url=_openapi_url(request), title="memproxy - Swagger UI")


@router.get("/redoc")
async def redoc(request: Request) -> HTMLResponse:
    return get_redoc_html(openapi_url=_openapi_url(request), title="memproxy - ReDoc")


def _openapi_url(request: Request) -> str:
    # Behind a proxy that mounts memproxy under a prefix, the page must ask for the prefixed URL.
    return str(request.scope.get("root_path", "")) + "/openapi.json"
