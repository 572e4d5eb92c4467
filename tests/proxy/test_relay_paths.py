"""The generic `/v1/*` relay forwards only paths that stay under the upstream's `/v1`.

Sent on the wire with a raw socket: httpx (and every well-behaved client) would normalise the dot
segments away before memproxy ever saw them. The upstream is respx behind the app's transport, so
"nothing reached it" is checked on its recorded calls.
"""

from __future__ import annotations

import http.client
import socket
import tempfile
from collections.abc import Iterator

import httpx
import orjson
import pytest
import respx

from app.config import Settings
from app.main import create_app
from tests import databases
from tests.fakes import FakeEmbedder
from tests.helpers import UPSTREAM, assert_openai_error
from tests.servers import serve


@pytest.fixture(scope="module")
def upstream_mock() -> respx.Router:
    return respx.Router(base_url="http://upstream.test", assert_all_called=False)


@pytest.fixture(scope="module")
def proxy(upstream_mock: respx.Router) -> Iterator[str]:
    upstream_mock.route().respond(json={"reached": True})  # anything: what matters is the call
    with tempfile.TemporaryDirectory() as data:
        settings = Settings(
            upstream_base_url=UPSTREAM,
            upstream_api_key="sk-upstream-secret",
            database_url=databases.url_in(data),
            manager_enabled=False,
            upstream_check_at_start=False,
        )
        app = create_app(
            settings,
            upstream_transport=httpx.MockTransport(upstream_mock.async_handler),
            embedder=FakeEmbedder(),
        )
        with serve(app) as url:
            yield url


def raw_request(base: str, method: str, target: str) -> httpx.Response:
    """`method target` exactly as given, on a socket of its own; the answer as an httpx response."""
    host, port = base.removeprefix("http://").split(":")
    head = f"{method} {target} HTTP/1.1\r\nHost: {host}\r\nContent-Length: 0\r\n"
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall((head + "Connection: close\r\n\r\n").encode("latin-1"))
        answer = http.client.HTTPResponse(sock)
        answer.begin()
        return httpx.Response(answer.status, headers=answer.getheaders(), content=answer.read())


@pytest.mark.parametrize(
    "target",
    [
        "/v1/../admin",
        "/v1/%2e%2e/admin",
        "/v1/%2E%2E/admin",
        "/v1/.%2e/admin",
        "/v1/..%2f..%2fapi/pull",
        "/v1/embeddings/..%2F..%2Fapi/delete",
        "/v1/a/../../api/pull",
        "/v1%2f..%2fadmin",
        "/v1/x%3Fa=b",
        "/v1/x%23frag",
        "/v1/x%5c..%5cadmin",
        "/v1/x%252e%252e/admin",
        "/v1/./chat/completions",
        "/v1/./models",
        "/v1//chat/completions",
        "/v1/chat/completions/",
        "/v1/",
        "/v1/..",
        "/v1/x%00",
        "/v1/x%1f",
        "/v1/x%7f",
        "/v1/x%zz",
        "/v1/x%",
        "/v1/x/..;/y",  # servers that strip ;params read `..`
        "/v1/chat/completions;a",  # ... and the chat route, unchecked
        "/v1/embeddings%3bx",
    ],
)
def test_paths_leaving_v1_or_smuggling_are_refused_and_never_relayed(
    proxy: str, upstream_mock: respx.Router, target: str
) -> None:
    upstream_mock.reset()
    response = raw_request(proxy, "POST", target)
    error = assert_openai_error(response, 400)
    assert error["code"] == "invalid_path"
    assert upstream_mock.calls.call_count == 0, [str(c.request.url) for c in upstream_mock.calls]


def test_an_encoded_line_break_matches_no_route(proxy: str, upstream_mock: respx.Router) -> None:
    upstream_mock.reset()
    response = raw_request(proxy, "POST", "/v1/x%0d%0aInjected:%20yes")
    assert assert_openai_error(response, 404)["code"] == "not_found"
    assert upstream_mock.calls.call_count == 0


@pytest.mark.parametrize(
    ("target", "relayed"),
    [
        ("/v1/embeddings", "/v1/embeddings"),
        ("/v1/files/file-abc123/content?limit=2", "/v1/files/file-abc123/content?limit=2"),
        ("/v1/models/llama3.2:8b", "/v1/models/llama3.2:8b"),
        ("/v1/models/meta-llama/Llama-3.1-8B", "/v1/models/meta-llama/Llama-3.1-8B"),
        ("/v1/files/caf%C3%A9.txt", "/v1/files/caf%C3%A9.txt"),
        ("/v1/chat/completions/chatcmpl-1/messages", "/v1/chat/completions/chatcmpl-1/messages"),
    ],
)
def test_ordinary_paths_are_relayed_as_sent_with_the_upstream_key(
    proxy: str, upstream_mock: respx.Router, target: str, relayed: str
) -> None:
    upstream_mock.reset()
    response = raw_request(proxy, "GET", target)
    assert response.status_code == 200 and orjson.loads(response.content) == {"reached": True}
    (call,) = upstream_mock.calls
    assert call.request.url.raw_path.decode() == relayed
    assert call.request.headers["authorization"] == "Bearer sk-upstream-secret"


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("DELETE", "/v1/chat/completions", "POST"),
        ("GET", "/v1/chat/completions", "POST"),
        ("PUT", "/v1/chat/completions", "POST"),
        ("POST", "/v1/models", "GET"),
        ("DELETE", "/v1/models", "GET"),
        ("DELETE", "/chat/completions", "POST"),
        ("PUT", "/v1/memories", "GET"),
    ],
)
async def test_chat_and_models_answer_405_for_methods_they_do_not_serve(
    client: httpx.AsyncClient, upstream: respx.Router, method: str, path: str, allowed: str
) -> None:
    route = upstream.route().respond(json={"reached": True})
    response = await client.request(method, path)
    error = assert_openai_error(response, 405)
    assert error["code"] == "method_not_allowed"
    assert allowed in response.headers["allow"]
    assert route.call_count == 0
