"""An upstream that lies on the wire: a short Content-Length, broken chunks, a huge response head,
or no answer at all. The client must see the failure (a 502/504, or a connection that breaks
off), never a well-framed answer that is silently short; and no message shows the upstream's
password.

The upstream is a raw socket server on loopback that answers each request with the bytes its
`x-reply` header names, then closes; memproxy runs in uvicorn, as in production.
"""

from __future__ import annotations

import contextlib
import re
import socket
import socketserver
import tempfile
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from app.config import Settings
from app.main import create_app
from tests import databases
from tests.fakes import FakeEmbedder
from tests.helpers import assert_openai_error, chat_body, free_port, sse
from tests.servers import serve

JSON_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
SSE_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
EVENTS = sse({"role": "assistant", "content": "Hel"}, {"content": "lo"}, done=False)
REPLIES: dict[str, bytes] = {
    "short": JSON_HEAD + b'content-length: 100\r\n\r\n{"id":"x",',
    "short-empty": JSON_HEAD + b"content-length: 50\r\n\r\n",
    "bad-chunks": JSON_HEAD + b'transfer-encoding: chunked\r\n\r\n9\r\n{"id":"x"\r\nZZ\r\n}\r\n',
    "cut-chunks": JSON_HEAD + b'transfer-encoding: chunked\r\n\r\n9\r\n{"id":"x"\r\n',
    "sse-short": SSE_HEAD + b"content-length: 4000\r\n\r\n" + EVENTS + b'data: {"id"',
    "sse-bad-chunks": SSE_HEAD
    + b"transfer-encoding: chunked\r\n\r\n"
    + f"{len(EVENTS):x}\r\n".encode()
    + EVENTS
    + b"\r\nnot-hex\r\n",
    "huge-header": JSON_HEAD
    + b"x-big: "
    + b"a" * (1024 * 1024)
    + b"\r\ncontent-length: 2\r\n\r\n{}",
    "many-headers": JSON_HEAD
    + b"".join(b"x-h%d: v\r\n" % i for i in range(2000))
    + b"content-length: 2\r\n\r\n{}",
    "whole": JSON_HEAD + b"content-length: 2\r\n\r\n{}",
}


class _Handler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = self.request.recv(65536)
            if not chunk:
                return
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = re.search(rb"(?im)^content-length: *(\d+)", head)
        while length and len(body) < int(length[1]):
            body += self.request.recv(65536)
        reply = re.search(rb"(?im)^x-reply: *(\S+)", head)
        if reply is None or reply[1] == b"hang":
            self.request.recv(1)  # until memproxy gives up and closes
            return
        with contextlib.suppress(OSError):  # memproxy refused the rest (huge heads): the point
            self.request.sendall(REPLIES[reply[1].decode()])


@pytest.fixture(scope="module")
def raw_upstream() -> Iterator[int]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def _proxy(base_url: str, **settings: Any) -> Iterator[str]:
    with tempfile.TemporaryDirectory() as data:
        app = create_app(
            Settings(
                upstream_base_url=base_url,
                database_url=databases.url_in(data),
                manager_enabled=False,
                upstream_check_at_start=False,
                **settings,
            ),
            embedder=FakeEmbedder(),
        )
        with serve(app) as url:
            yield url


@pytest.fixture(scope="module")
def proxy(raw_upstream: int) -> Iterator[str]:
    # A password in the URL: no answer may show it.
    yield from _proxy(
        f"http://user:PASS@127.0.0.1:{raw_upstream}/v1", upstream_read_timeout_seconds=0.5
    )


def _post(proxy: str, path: str, reply: str, body: dict[str, Any]) -> httpx.Response | str:
    """The answer, or "broken off" when the connection ended before a well-framed one."""
    try:
        return httpx.post(f"{proxy}{path}", json=body, headers={"x-reply": reply}, timeout=10)
    except httpx.RemoteProtocolError:
        return "broken off"


@pytest.mark.parametrize("reply", ["short", "bad-chunks", "cut-chunks"])
@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", chat_body()),
        ("/v1/embeddings", {"model": "e", "input": "x"}),
    ],
    ids=["chat", "relay"],
)
def test_a_body_short_of_its_framing_breaks_the_connection(
    proxy: str, path: str, body: dict[str, Any], reply: str
) -> None:
    assert _post(proxy, path, reply, body) == "broken off"
    assert _post(proxy, path, "whole", body).json() == {}  # and the server goes on serving


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/embeddings"])
def test_a_body_failing_before_its_first_byte_is_a_502(proxy: str, path: str) -> None:
    answer = _post(proxy, path, "short-empty", chat_body())
    assert isinstance(answer, httpx.Response)
    error = assert_openai_error(answer, 502)
    assert error["code"] == "upstream_disconnected" and "PASS" not in answer.text


@pytest.mark.parametrize("reply", ["sse-short", "sse-bad-chunks"])
def test_a_stream_short_of_its_framing_ends_with_an_error_event_then_breaks(
    proxy: str, reply: str
) -> None:
    received = b""
    with (
        pytest.raises(httpx.RemoteProtocolError),
        httpx.stream(
            "POST",
            f"{proxy}/v1/chat/completions",
            json=chat_body(stream=True),
            headers={"x-reply": reply},
            timeout=10,
        ) as response,
    ):
        assert response.status_code == 200
        for chunk in response.iter_raw():
            received += chunk
    events = [e for e in received.split(b"\n\n") if e]
    assert received.startswith(EVENTS) and len(events) == 3  # the two whole ones, then the error
    error = orjson.loads(events[-1].removeprefix(b"data: "))["error"]
    assert error["code"] == "upstream_disconnected"


@pytest.mark.parametrize("reply", ["huge-header", "many-headers"])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/embeddings"])
def test_an_oversized_response_head_is_refused_with_a_502(
    proxy: str, path: str, reply: str
) -> None:
    answer = _post(proxy, path, reply, chat_body())
    assert isinstance(answer, httpx.Response)
    error = assert_openai_error(answer, 502)
    assert "response head" in error["message"] and "PASS" not in answer.text
    assert "x-big" not in answer.headers and "x-h1" not in answer.headers


@pytest.mark.parametrize(
    ("method", "path"),
    [("POST", "/v1/chat/completions"), ("POST", "/v1/embeddings"), ("GET", "/v1/models")],
)
def test_timeouts_never_show_the_upstream_password(proxy: str, method: str, path: str) -> None:
    body = chat_body() if method == "POST" else None
    answer = httpx.request(
        method, f"{proxy}{path}", json=body, headers={"x-reply": "hang"}, timeout=10
    )
    error = assert_openai_error(answer, 504)
    assert "user:***@127.0.0.1" in error["message"] and "PASS" not in answer.text


def test_unreachable_upstream_never_shows_its_password() -> None:
    for proxy in _proxy(f"http://user:PASS@127.0.0.1:{free_port()}/v1"):
        for method, path in [
            ("POST", "/v1/chat/completions"),
            ("POST", "/v1/embeddings"),
            ("GET", "/v1/models"),
        ]:
            body = chat_body() if method == "POST" else None
            answer = httpx.request(method, f"{proxy}{path}", json=body, timeout=10)
            error = assert_openai_error(answer, 502)
            assert "user:***@127.0.0.1" in error["message"] and "PASS" not in answer.text


def test_raw_server_answers_as_written(raw_upstream: int) -> None:
    """The fake itself: a whole reply is read back by a plain client (guards the tests above)."""
    with socket.create_connection(("127.0.0.1", raw_upstream), timeout=5) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nhost: x\r\nx-reply: whole\r\n\r\n")
        assert sock.recv(65536).endswith(b"\r\n\r\n{}")


def test_an_upstream_key_that_would_smuggle_a_header_is_never_sent() -> None:
    """`MEMPROXY_UPSTREAM_API_KEY` with a line break in it (a copy-paste of two lines) would end
    the Authorization header early and start another: the request is not sent at all, and the
    client gets a 502 that names the header; the server goes on serving."""
    from tests.servers import serve_stack

    with serve_stack(upstream_api_key="sk-one\r\nx-smuggled: 1") as stack:
        response = httpx.post(f"{stack.proxy_url}/v1/chat/completions", json=chat_body())
        error = assert_openai_error(response, 502, param=None)
        assert "'authorization' has a control character" in error["message"]
        assert "sk-one" not in response.text
        assert not [r for r in stack.fake.received if r.path == "/chat/completions"]
        assert httpx.get(f"{stack.proxy_url}/healthz").status_code == 200
