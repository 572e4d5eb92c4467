"""The memory page's files as served (the page itself runs in tests/browser): from the package,
with headers that keep a memory's text from ever running as script; nothing else under /ui."""

from __future__ import annotations

import httpx
import pytest

from app.api import ui
from tests.helpers import assert_openai_error


async def test_the_page_and_its_files_are_served_with_a_strict_policy(
    client: httpx.AsyncClient,
) -> None:
    moved = await client.get("/ui")
    assert moved.status_code == 308 and moved.headers["location"] == "/ui/"
    page = await client.get("/ui/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert 'src="static/lib.js"' in page.text and 'src="static/app.js"' in page.text
    policy = page.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "default-src 'none'" in policy
    assert page.headers["x-content-type-options"] == "nosniff"
    for name, kind in (("lib.js", "text/javascript"), ("app.js", "text/javascript"),
                       ("app.css", "text/css")):  # fmt: skip
        served = await client.get(f"/ui/static/{name}")
        assert served.status_code == 200 and served.headers["content-type"].startswith(kind)
        assert served.content  # the real file, from the package


@pytest.mark.parametrize(
    "path",
    ["/ui/static/nope.js", "/ui/static/__init__.py", "/ui/static/..%2F__init__.py",
     "/ui/static/%2e%2e", "/ui/static/index.html.bak"],
)  # fmt: skip
async def test_nothing_else_is_served_from_the_package(
    client: httpx.AsyncClient, path: str
) -> None:
    assert_openai_error(await client.get(path), 404)
    assert ui._asset.cache_info().currsize <= len(ui._FILES)  # a miss is never cached


async def test_the_root_links_to_the_page(client: httpx.AsyncClient) -> None:
    as_json = (await client.get("/")).json()
    assert as_json["name"] == "memproxy" and as_json["links"]["memory page"] == "/ui/"
    html = await client.get("/", headers={"accept": "text/html,application/xhtml+xml"})
    assert '<a href="ui/">memory page</a>' in html.text


@pytest.mark.parametrize("path", ["/v1", "/v1/"])
async def test_the_base_url_says_what_it_is(client: httpx.AsyncClient, path: str) -> None:
    """The root page's "OpenAI base URL" link, and the base URL a user pastes into a browser,
    answer what they are and which routes are under them (no redirect, no 400)."""
    as_json = await client.get(path)
    assert as_json.status_code == 200, as_json.text
    body = as_json.json()
    base = f"{client.base_url}".rstrip("/") + "/v1"
    assert body["openai_base_url"] == base
    assert "POST /v1/chat/completions" in body["routes"] and "GET /v1/models" in body["routes"]
    html = await client.get(path, headers={"accept": "text/html"})
    assert html.status_code == 200 and html.headers["content-type"].startswith("text/html")
    assert base in html.text and "/v1/chat/completions" in html.text
    assert html.headers["content-security-policy"].startswith("default-src 'none'")


async def test_the_root_page_links_answer(client: httpx.AsyncClient) -> None:
    links = (await client.get("/")).json()["links"]
    for name, href in links.items():
        if name == "MCP":
            continue  # a client's endpoint, POST only
        response = await client.get(href, headers={"accept": "text/html"})
        assert response.status_code == 200, (href, response.status_code, response.text[:200])
