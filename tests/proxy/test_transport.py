"""The asyncio transport over real sockets: timeouts, and keep-alive connections the server closes."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import orjson
import pytest

import app.proxy.transport as transport_module
from app.proxy._http11 import Connection
from app.proxy.transport import LeanTransport
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


def test_read_timeout_mid_stream_ends_with_error_event_then_breaks(slow_proxy: str) -> None:
    received = b""
    with (
        pytest.raises(httpx.RemoteProtocolError),  # the stream never ends well: it was cut
        httpx.stream(
            "POST",
            f"{slow_proxy}/v1/chat/completions",
            json={**BODY, "stream": True},
            headers={"x-fake-delay-ms": "1500"},
        ) as response,  # fmt: skip
    ):
        assert response.status_code == 200
        for chunk in response.iter_raw():
            received += chunk
    last = [e for e in received.split(b"\n\n") if e][-1]
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
    async with server, httpx.AsyncClient(transport=LeanTransport(limits=limits)) as client:
        for _ in range(3):
            response = await client.get(f"http://127.0.0.1:{port}/x")
            assert response.json() == {}
            await asyncio.sleep(0.15)  # the close has arrived: the pool must notice it
    assert connections == 3


async def test_connect_error_is_httpx_connect_error() -> None:
    limits = httpx.Limits(max_connections=1)
    async with httpx.AsyncClient(transport=LeanTransport(limits=limits)) as client:
        with pytest.raises(httpx.ConnectError):
            await client.get("http://127.0.0.1:1/")


async def _http_server(reply: bytes) -> tuple[asyncio.Server, list[int]]:
    """A raw HTTP/1.1 server answering every request on a connection with `reply`; it counts
    connections (and requests per connection) so reuse is visible from the server's side."""
    per_connection: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        per_connection.append(0)
        index = len(per_connection) - 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(next((line.split(b":")[1] for line in head.split(b"\r\n")
                                   if line.lower().startswith(b"content-length")), b"0"))  # fmt: skip
                await reader.readexactly(length)
                per_connection[index] += 1
                writer.write(reply)
                await writer.drain()
                if b"connection: close" in reply.lower():
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, per_connection


@pytest.mark.parametrize(
    "reply",
    [
        b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 12\r\n\r\n{"ok": true}',
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
        b"9\r\ndata: 1\n\n\r\n0\r\n\r\n",
    ],
    ids=["content-length", "chunked"],
)
async def test_keep_alive_connections_are_reused(reply: bytes) -> None:
    server, per_connection = await _http_server(reply)
    port = server.sockets[0].getsockname()[1]
    limits = httpx.Limits(max_connections=4, max_keepalive_connections=4, keepalive_expiry=30)
    async with server, httpx.AsyncClient(transport=LeanTransport(limits=limits)) as client:
        for _ in range(5):
            response = await client.post(f"http://127.0.0.1:{port}/x", json={"a": 1})
            assert response.status_code == 200 and response.content
    assert per_connection == [5]


async def test_connection_close_responses_are_not_reused() -> None:
    reply = b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\n{}"
    server, per_connection = await _http_server(reply)
    port = server.sockets[0].getsockname()[1]
    limits = httpx.Limits(max_connections=4, max_keepalive_connections=4, keepalive_expiry=30)
    async with server, httpx.AsyncClient(transport=LeanTransport(limits=limits)) as client:
        for _ in range(3):
            assert (await client.get(f"http://127.0.0.1:{port}/x")).json() == {}
    assert per_connection == [1, 1, 1]


async def test_pool_limit_queues_requests_and_times_out() -> None:
    async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        await asyncio.sleep(0.5)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(slow, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    transport = LeanTransport(limits=limits)
    async with (
        server,
        httpx.AsyncClient(transport=transport, timeout=httpx.Timeout(5, pool=0.1)) as client,
    ):
        first = asyncio.create_task(client.get(f"http://127.0.0.1:{port}/a"))
        await asyncio.sleep(0.05)
        with pytest.raises(httpx.PoolTimeout):
            await client.get(f"http://127.0.0.1:{port}/b")
        assert (await first).json() == {}
    async with httpx.AsyncClient(transport=LeanTransport(limits=limits)) as client:
        server = await asyncio.start_server(slow, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            both = await asyncio.gather(
                *(client.get(f"http://127.0.0.1:{port}/{i}") for i in range(2))
            )
        assert [r.json() for r in both] == [{}, {}]


async def test_pool_accounting_survives_concurrency_and_cancellation() -> None:
    """60 requests over 8 connections, some cancelled mid-flight: every survivor gets its answer
    and afterwards each open slot is an idle connection (none leaked, none double-freed)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                await reader.readuntil(b"\r\n\r\n")
                await asyncio.sleep(0.01)
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    transport = LeanTransport(limits=httpx.Limits(max_connections=8, max_keepalive_connections=8))
    async with server, httpx.AsyncClient(transport=transport) as client:
        tasks = [asyncio.create_task(client.get(f"http://127.0.0.1:{port}/{i}")) for i in range(60)]
        await asyncio.sleep(0.015)
        for task in tasks[::7]:
            task.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        done = [r for r in results if isinstance(r, httpx.Response)]
        assert all(r.json() == {} for r in done)
        assert len(done) + sum(isinstance(r, asyncio.CancelledError) for r in results) == 60
        assert len(done) >= 60 - len(tasks[::7])
        await asyncio.sleep(0.05)
        pool = transport.pool
        assert pool.open == pool.idle and 1 <= pool.idle <= 8
        assert pool.waiting == 0


async def test_buffered_chunks_are_handed_over_in_one_piece() -> None:
    """Chunks that arrived while the relay was busy come out joined, in order, byte for byte."""
    conn = Connection()
    events = [b"data: %d\n\n" % i for i in range(3)]
    wire = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
    wire += b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events)
    conn.data_received(wire)
    await conn.read_head(1)
    assert await conn.next_chunk(1) == b"".join(events)
    conn.data_received(b"0\r\n\r\n")
    assert await conn.next_chunk(1) is None
    assert conn.complete and conn.status == 200


async def test_unsolicited_bytes_on_an_idle_connection_retire_it() -> None:
    connections = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        try:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nfirst")
            await writer.drain()
            await asyncio.sleep(0.05)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 7\r\n\r\nphantom")  # nobody asked
            await writer.drain()
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 6\r\n\r\nsecond")
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    limits = httpx.Limits(max_connections=2, max_keepalive_connections=2, keepalive_expiry=30)
    async with server, httpx.AsyncClient(transport=LeanTransport(limits=limits)) as client:
        assert (await client.get(f"http://127.0.0.1:{port}/1")).content == b"first"
        await asyncio.sleep(0.15)
        assert (await client.get(f"http://127.0.0.1:{port}/2")).content == b"first"
    assert connections == 2  # the second request did not get the phantom response


@pytest.mark.parametrize(
    ("headers", "method", "path"),
    [
        ([(b"x-note", b"ok\r\nx-injected: 1")], "GET", "/x"),
        ([(b"x-note", b"nul\x00byte")], "GET", "/x"),
        ([(b"x-note", b"bare\rcr")], "GET", "/x"),
        ([(b"x bad name", b"v")], "GET", "/x"),
        ([(b"x-note:", b"v")], "GET", "/x"),
        ([], "GE T", "/x"),
    ],
    ids=["crlf-value", "nul-value", "cr-value", "space-name", "colon-name", "method"],
)
async def test_a_head_that_would_smuggle_bytes_is_never_sent(
    headers: list[tuple[bytes, bytes]], method: str, path: str
) -> None:
    """As h11 checks outbound heads: a bad byte anywhere raises LocalProtocolError and the
    upstream receives nothing at all."""
    received: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        received.append(await reader.read(65536))
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    limits = httpx.Limits(max_connections=2, max_keepalive_connections=2)
    transport = LeanTransport(limits=limits)
    async with server:
        url = httpx.URL(f"http://127.0.0.1:{port}").copy_with(raw_path=path.encode())
        request = httpx.Request(method, url, headers=headers)
        with pytest.raises(httpx.LocalProtocolError):
            await transport.handle_async_request(request)
        await asyncio.sleep(0.05)
    await transport.aclose()
    assert received == []
    assert transport.pool.open == 0


async def test_tabs_and_non_ascii_header_bytes_are_sent_as_they_are() -> None:
    reply = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"
    server, _ = await _http_server(reply)
    port = server.sockets[0].getsockname()[1]
    limits = httpx.Limits(max_connections=2, max_keepalive_connections=2)
    headers = [(b"x-user-id", "José".encode()), (b"x-note", b"a\tb")]
    async with server, httpx.AsyncClient(transport=LeanTransport(limits=limits)) as client:
        response = await client.get(f"http://127.0.0.1:{port}/x", headers=headers)
        assert response.json() == {}


@pytest.mark.parametrize(
    ("raised", "phase", "expected", "message"),
    [
        (OSError(), "connect", httpx.ConnectError, "OSError"),
        (OSError("no route to host"), "connect", httpx.ConnectError, "no route to host"),
        (TimeoutError(), "connect", httpx.ConnectTimeout, "timed out connecting to h:1"),
        (TimeoutError(), "pool", httpx.PoolTimeout, "no free upstream connection in time"),
        (ConnectionResetError(), "write", httpx.RemoteProtocolError, "(ConnectionResetError)"),
        (TimeoutError(), "read", httpx.ReadTimeout, "timed out waiting to read the upstream"),
        (TimeoutError(), "body", httpx.ReadTimeout, "timed out reading from the upstream"),
    ],
)
def test_every_wire_failure_is_an_httpx_error_with_something_to_say(
    raised: BaseException, phase: str, expected: type[Exception], message: str
) -> None:
    """From one table by phase (never an empty message: an OSError without text is named)."""
    request = httpx.Request("GET", "http://h:1/x")
    mapped = transport_module._as_httpx(raised, phase, request, "h:1")
    assert type(mapped) is expected and message in str(mapped) and str(mapped)
    assert mapped.request is request  # type: ignore[attr-defined]
    assert (mapped.__cause__ is raised) == (expected is httpx.ConnectError)  # for the TLS check
