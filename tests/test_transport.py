"""The asyncio transport over real sockets: timeouts, and keep-alive connections the server closes."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import orjson
import pytest

from app.proxy.transport import AsyncioTransport
from tests.servers import serve_stack

BODY = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def slow_proxy() -> Iterator[str]:
    with serve_stack(upstream_read_timeout_seconds=0.3) as stack:
        yield stack.proxy_url


def test_read_timeout_before_headers_is_504(slow_proxy: str) -> None:
    response = httpx.post(
        f"{slow_proxy}/v1/chat/completions", json=BODY, headers={"x-fake-hang-ms": "3000"}
    )
    assert response.status_code == 504
    assert "MEMPROXY_UPSTREAM_READ_TIMEOUT_SECONDS" in response.json()["error"]["message"]


def test_read_timeout_mid_stream_ends_with_error_event(slow_proxy: str) -> None:
    response = httpx.post(f"{slow_proxy}/v1/chat/completions", json={**BODY, "stream": True},
                          headers={"x-fake-delay-ms": "1500"})  # fmt: skip
    assert response.status_code == 200
    last = [e for e in response.content.split(b"\n\n") if e][-1]
    assert orjson.loads(last.removeprefix(b"data: "))["error"]["code"] == "upstream_timeout"


async def test_server_closing_idle_connection_is_not_reused() -> None:
    """An upstream that closes each connection after answering (like an expired keep-alive)."""
    connections = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        await reader.readuntil(b"\r\n\r\n")
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
        )
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.close()  # keep-alive was promised; the server closes anyway while idle

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    limits = httpx.Limits(max_connections=4, max_keepalive_connections=4, keepalive_expiry=30)
    async with server, httpx.AsyncClient(transport=AsyncioTransport(limits=limits)) as client:
        for _ in range(3):
            response = await client.get(f"http://127.0.0.1:{port}/x")
            assert response.json() == {}
            await asyncio.sleep(0.15)  # the close has arrived: the pool must notice it
    assert connections == 3


async def test_connect_error_is_httpx_connect_error() -> None:
    limits = httpx.Limits(max_connections=1)
    async with httpx.AsyncClient(transport=AsyncioTransport(limits=limits)) as client:
        with pytest.raises(httpx.ConnectError):
            await client.get("http://127.0.0.1:1/")
