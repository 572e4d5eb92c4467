"""The API's docs pages work without the internet: ``/docs`` (Swagger UI) and ``/redoc`` load
their scripts, styles and icon from memproxy itself, under the same key rule as the pages."""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest

from tests.helpers import assert_openai_error

PAGES = ("/docs", "/redoc")
MEDIA_TYPES = {".js": "text/javascript", ".css": "text/css", ".png": "image/png"}
"""What each kind of asset must be served as (a browser refuses a script sent as text/plain
under nosniff)."""


def referenced(page: str) -> list[str]:
    """Every URL a page makes the browser load: its src and href attributes."""
    return re.findall(r"""(?:src|href)=["']([^"']+)["']""", page)


@pytest.mark.parametrize("path", PAGES)
async def test_the_pages_load_nothing_from_outside(client: httpx.AsyncClient, path: str) -> None:
    page = await client.get(path)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert re.findall(r"(?:https?:)?//[\w.-]+", page.text) == []  # no CDN, no Google fonts
    assets = referenced(page.text)
    assert len(assets) == (3 if path == "/docs" else 2), assets  # script (+ style) and icon
    for url in assets:
        assert url.startswith("/docs/static/"), url
        response = await client.get(url)
        assert response.status_code == 200, url
        kind = MEDIA_TYPES[url[url.rfind(".") :]]
        assert response.headers["content-type"].split(";")[0] == kind, url
        assert response.headers["x-content-type-options"] == "nosniff"
        assert len(response.content) > 1000, url  # the real file, not an error page
    bundle = "SwaggerUIBundle" if path == "/docs" else "Redoc"
    script = next(url for url in assets if url.endswith(".js"))
    assert bundle in (await client.get(script)).text
    assert "/openapi.json" in page.text and (await client.get("/openapi.json")).status_code == 200


async def test_only_the_pages_files_are_served(client: httpx.AsyncClient) -> None:
    for name in ("core.py", "..%2f__init__.py", "%2e%2e/consts.py", "redoc.js", ""):
        response = await client.get(f"/docs/static/{name}")
        assert response.status_code == 404, name


async def test_the_files_follow_the_pages_key_rule(make_client: Any) -> None:
    asset = "/docs/static/swagger-ui-bundle.js"
    client = await make_client(api_keys=["sk-a:ann"])
    assert_openai_error(await client.get(asset), 401)
    response = await client.get(asset, headers={"authorization": "Bearer sk-a"})
    assert response.status_code == 200
    client = await make_client(api_keys=["sk-a:ann"], docs_require_key=False)
    assert (await client.get(asset)).status_code == 200
    client = await make_client(docs_enabled=False)
    assert_openai_error(await client.get(asset), 404)
