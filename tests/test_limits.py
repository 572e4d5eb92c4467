"""Hostile clients: bodies without a key, oversized bodies and heads, slow clients, bad bytes.

Bodies are checked in process (a body generator that counts what was read); heads, timeouts and
the connection limit against a real uvicorn run as `memproxy serve` runs it, over raw sockets.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import orjson
import pytest
import respx

from app.main import create_app
from app.server import uvicorn_options
from tests.conftest import AppClientFactory, make_settings
from tests.fakes import FakeEmbedder
from tests.helpers import assert_openai_error, chat_body, completion_json
from tests.servers import serve


class CountingBody:
    """A streamed request body that counts the chunks the server pulled from it."""

    def __init__(self, chunks: int, size: int = 64 * 1024) -> None:
        self.chunks = chunks
        self.size = size
        self.read = 0

    async def stream(self) -> AsyncIterator[bytes]:
        for _ in range(self.chunks):
            self.read += 1
            yield b"x" * self.size


BODY_ROUTES = [
    ("POST", "/v1/memories"),
    ("POST", "/v1/memories/batch"),
    ("POST", "/v1/memories/search"),
    ("PATCH", "/v1/memories/m1"),
    ("POST", "/v1/memories/import"),
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/embeddings"),
]


@pytest.mark.parametrize(("method", "path"), BODY_ROUTES)
async def test_a_body_without_a_valid_key_is_refused_unread(
    make_client: AppClientFactory, upstream: respx.Router, method: str, path: str
) -> None:
    relayed = upstream.route().respond(json=completion_json())
    client = await make_client(api_keys=["good:alice"], admin_keys=["boss"])
    for authorization in (None, "Bearer wrong"):
        for declared in (True, False):  # with a Content-Length, and streamed without one
            body = CountingBody(chunks=64)  # 4 MiB
            headers = {"authorization": authorization} if authorization else {}
            if declared:
                headers["content-length"] = str(body.chunks * body.size)
            response = await client.request(method, path, content=body.stream(), headers=headers)
            assert_openai_error(response, 401)
            assert response.headers["connection"] == "close"
            assert body.read == 0, (authorization, declared)
    assert not relayed.called
    # A good key still gets through, to the route's own answer.
    ok = await client.post(
        "/v1/memories", json={"content": "likes tea"}, headers={"authorization": "Bearer good"}
    )
    assert ok.status_code == 201


async def test_memory_routes_have_a_smaller_body_limit_than_chat(
    make_client: AppClientFactory, upstream: respx.Router
) -> None:
    upstream.post("/chat/completions").respond(json=completion_json())
    client = await make_client(memory_max_body_bytes=2048)
    big = orjson.dumps({"content": "x" * 3000})
    for path in ("/v1/memories", "/v1/memories/import"):
        error = assert_openai_error(await client.post(path, content=big), 413)
        assert "MEMPROXY_MEMORY_MAX_BODY_BYTES" in error["message"], error
        assert error["code"] == "body_too_large"
    # Streamed, without a Content-Length: counted as it comes and stopped past the limit.
    body = CountingBody(chunks=64, size=1024)
    response = await client.post("/v1/memories/import", content=body.stream())
    assert "MEMPROXY_MEMORY_MAX_BODY_BYTES" in assert_openai_error(response, 413)["message"]
    assert body.read == 3
    chat = await client.post("/v1/chat/completions", json=chat_body("y" * 3000))
    assert chat.status_code == 200  # chat keeps MEMPROXY_MAX_BODY_BYTES
    assert (await client.post("/v1/memories", json={"content": "likes tea"})).status_code == 201


async def test_a_stalled_body_is_answered_408(
    make_client: AppClientFactory, upstream: respx.Router
) -> None:
    route = upstream.post("/chat/completions").respond(json=completion_json())
    client = await make_client(client_body_timeout_seconds=0.2)
    never = asyncio.Event()

    async def stalled() -> AsyncIterator[bytes]:
        yield b'{"model": "m", "messages": '
        await never.wait()

    # The bound only keeps today's hanging request from hanging the run.
    response = await asyncio.wait_for(client.post("/v1/chat/completions", content=stalled()), 30)
    error = assert_openai_error(response, 408)
    assert error["code"] == "request_timeout"
    assert "MEMPROXY_CLIENT_BODY_TIMEOUT_SECONDS" in error["message"]
    assert not route.called
    assert (await client.post("/v1/chat/completions", json=chat_body())).status_code == 200


async def test_a_body_trickling_in_past_the_deadline_is_answered_408(
    make_client: AppClientFactory, upstream: respx.Router
) -> None:
    """Each pause is short, but the body never ends: the whole body's deadline answers it."""
    route = upstream.post("/chat/completions").respond(json=completion_json())
    client = await make_client(client_body_timeout_seconds=5, client_body_deadline_seconds=0.5)

    async def trickle() -> AsyncIterator[bytes]:
        yield b'{"model": "m", "messages": ['
        for _ in range(2000):  # ~100 s if nothing stops it
            await asyncio.sleep(0.05)
            yield b" "

    response = await asyncio.wait_for(client.post("/v1/chat/completions", content=trickle()), 30)
    error = assert_openai_error(response, 408)
    assert "MEMPROXY_CLIENT_BODY_DEADLINE_SECONDS" in error["message"]
    assert not route.called


# --- a real server, as `memproxy serve` runs it --------------------------------------------------


@contextmanager
def served(**overrides: Any) -> Iterator[int]:
    """memproxy under uvicorn with `memproxy serve`'s options; yields its port."""
    settings = make_settings(**overrides)
    app = create_app(
        settings,
        upstream_transport=httpx.MockTransport(lambda _: httpx.Response(200, json={})),
        embedder=FakeEmbedder(),
    )
    options = uvicorn_options(settings) | {"log_level": "warning"}
    with serve(app, **options) as url:
        yield int(url.rsplit(":", 1)[1])


def connect(port: int) -> socket.socket:
    # The timeout only bounds a test of today's code, which would wait forever.
    return socket.create_connection(("127.0.0.1", port), timeout=20)


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed after {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    while len(body) < int(headers.get("content-length", "0")):
        chunk = sock.recv(65536)
        assert chunk, f"connection closed after {data!r}"
        body += chunk
    return int(status_line.split()[1]), headers, body


def refusal(sock: socket.socket, status: int) -> dict[str, Any]:
    """The OpenAI-shaped error `sock` gets, and the connection closed after it."""
    got, headers, body = read_response(sock)
    assert got == status, body
    assert headers["content-type"] == "application/json" and headers["connection"] == "close"
    error = orjson.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert sock.recv(1) == b""  # closed
    return dict(error)


def still_serves(port: int) -> None:
    with connect(port) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
        assert read_response(sock)[:1] == (200,)


def test_request_heads_are_capped() -> None:
    with served(max_header_bytes=1024) as port:
        big = b"X-Big: " + b"a" * 4096 + b"\r\n"
        with connect(port) as sock:  # a whole head, in one read
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\n" + big + b"\r\n")
            error = refusal(sock, 431)
            assert error["code"] == "headers_too_large"
            assert "MEMPROXY_MAX_HEADER_BYTES" in error["message"]
        with connect(port) as sock:  # a head that never ends
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\n" + big)
            assert refusal(sock, 431)["code"] == "headers_too_large"
        still_serves(port)
        with connect(port) as sock:  # 16 MB of header: refused long before it is all sent
            sent = 0
            try:
                sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\nX-Big: ")
                for _ in range(256):
                    sock.sendall(b"a" * 65536)
                    sent += 1
            except (BrokenPipeError, ConnectionResetError):
                pass
            assert sent < 256
        still_serves(port)


def test_half_sent_headers_and_idle_connections_are_dropped() -> None:
    with served(client_header_timeout_seconds=0.3) as port:
        with connect(port) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\n")  # and no end of the head
            error = refusal(sock, 408)
            assert error["code"] == "request_timeout"
            assert "MEMPROXY_CLIENT_HEADER_TIMEOUT_SECONDS" in error["message"]
        with connect(port) as sock:  # connected, never sent a byte: closed without a word
            assert sock.recv(1) == b""
        with connect(port) as sock:  # a keep-alive connection's next request is timed too
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
            assert read_response(sock)[0] == 200
            sock.sendall(b"GET /healthz HTTP/1.1\r\n")
            assert refusal(sock, 408)["code"] == "request_timeout"
        still_serves(port)


def test_a_stalled_body_is_408_over_a_socket() -> None:
    with served(client_body_timeout_seconds=0.3) as port:
        with connect(port) as sock:
            sock.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n"
                b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
                b'{"model": '
            )
            error = refusal(sock, 408)
            assert "MEMPROXY_CLIENT_BODY_TIMEOUT_SECONDS" in error["message"]
        still_serves(port)


@pytest.mark.parametrize("byte", [b"\x00", b"\x01"], ids=["nul", "soh"])
def test_control_bytes_in_a_header_get_an_openai_shaped_400(byte: bytes) -> None:
    with served() as port:
        with connect(port) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\nX-User-Id: a" + byte + b"b\r\n\r\n")
            error = refusal(sock, 400)
            assert error["code"] == "invalid_http_request"
            assert error["type"] == "invalid_request_error"
        still_serves(port)


def test_an_idle_connection_at_the_limit_makes_room_for_a_new_one() -> None:
    # More in tests/test_idle_sockets.py (requests in flight beyond the limit: 503 server_busy).
    with served(max_connections=1) as port:
        with connect(port) as first:
            first.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
            assert read_response(first)[0] == 200  # served; its connection stays open, idle
            with connect(port) as second:
                second.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
                assert read_response(second)[0] == 200
            assert first.recv(1) == b""  # closed to make room
        still_serves(port)
