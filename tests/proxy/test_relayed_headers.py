"""What the upstream answers is served on memproxy's origin, the memory page's: an HTML answer
relayed through `/v1/*` must not run as a page there. Every relayed answer (chat, streamed or
not, the model list, any other `/v1/*` path, an error status) carries ``nosniff`` and a CSP that
allows nothing, in place of whatever the upstream sent, each header once."""

from __future__ import annotations

import httpx
import pytest
import respx

from tests.helpers import chat_body, completion_json, sse, sse_response

CSP = "default-src 'none'; frame-ancestors 'none'; sandbox"
HTML = "<html><script>fetch('/v1/memories/export').then(r => r.text()).then(alert)</script></html>"
LAX = {"content-security-policy": "script-src *", "x-content-type-options": "sniff-away"}


def assert_hardened(response: httpx.Response) -> None:
    headers = response.headers
    assert headers.get_list("content-security-policy") == [CSP], headers
    assert headers.get_list("x-content-type-options") == ["nosniff"], headers


@pytest.mark.parametrize("method", ["GET", "POST"])
async def test_html_relayed_from_any_path_cannot_run_on_the_origin(
    client: httpx.AsyncClient, upstream: respx.Router, method: str
) -> None:
    upstream.route(method=method, path="/files/page").respond(200, html=HTML, headers=LAX)
    response = await client.request(method, "/v1/files/page")
    assert response.status_code == 200 and response.text == HTML
    assert response.headers["content-type"].startswith("text/html")
    assert_hardened(response)


@pytest.mark.parametrize("stream", [False, True])
async def test_chat_answers_are_hardened(
    client: httpx.AsyncClient, upstream: respx.Router, stream: bool
) -> None:
    answer = (
        sse_response(sse({"content": "hi"}))
        if stream
        else httpx.Response(200, json=completion_json())
    )
    answer.headers.update(LAX)
    upstream.post("/chat/completions").mock(return_value=answer)
    response = await client.post("/v1/chat/completions", json=chat_body(stream=stream))
    assert response.status_code == 200
    assert_hardened(response)


async def test_the_model_list_and_upstream_errors_are_hardened(
    client: httpx.AsyncClient, upstream: respx.Router
) -> None:
    upstream.get("/models").respond(200, html=HTML, headers=LAX)
    assert_hardened(await client.get("/v1/models"))
    upstream.post("/embeddings").respond(429, html=HTML, headers=LAX)
    refused = await client.post("/v1/embeddings", json={"input": "x", "model": "m"})
    assert refused.status_code == 429
    assert_hardened(refused)


@pytest.mark.parametrize("upstream_value", ["no-cache", "public, max-age=60"])
async def test_a_streamed_answer_carries_one_cache_control(
    client: httpx.AsyncClient, upstream: respx.Router, upstream_value: str
) -> None:
    """The relay's own ``no-cache`` (what lets reverse proxies pass events through) replaces
    whatever the upstream sent, whatever the header's case."""
    answer = sse_response(sse({"content": "hi"}))
    answer.headers["Cache-Control"] = upstream_value
    answer.headers["X-Accel-Buffering"] = "yes"
    upstream.post("/chat/completions").mock(return_value=answer)
    response = await client.post("/v1/chat/completions", json=chat_body(stream=True))
    assert response.status_code == 200
    assert response.headers.get_list("cache-control") == ["no-cache"], response.headers
    assert response.headers.get_list("x-accel-buffering") == ["no"], response.headers
