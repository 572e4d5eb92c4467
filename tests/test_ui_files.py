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
