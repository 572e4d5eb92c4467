"""A large body's copies: read, it is joined off the event loop (CPython lets go of the GIL while
it copies a large join: the loop goes on serving); sent, it is written after its head as it is,
not copied into one piece with it. The bytes are the same either way."""

from __future__ import annotations

import asyncio
import hashlib
import threading
from typing import Any

import httpx
import pytest
from starlette.requests import Request

from app.proxy import _http11, body, offload
from app.proxy.offload import LARGE_BODY_BYTES
from app.proxy.transport import LeanTransport


def _request(chunks: list[bytes]) -> Request:
    messages = [{"type": "http.request", "body": c, "more_body": True} for c in chunks]
    messages.append({"type": "http.request", "body": b"", "more_body": False})

    async def receive() -> dict[str, Any]:
        return messages.pop(0)

    scope = {"type": "http", "method": "POST", "path": "/", "headers": []}
    return Request(scope, receive)


@pytest.mark.parametrize("size", [1000, 4 * LARGE_BODY_BYTES])
async def test_a_large_body_is_joined_off_the_event_loop(
    size: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    chunks = [bytes([i % 251]) * 4096 for i in range(-(-size // 4096))]
    joined_on: list[int] = []
    off_loop = offload.off_loop

    async def recorded(size: int, fn: Any, *args: Any) -> Any:
        def join(*a: Any) -> Any:
            joined_on.append(threading.get_ident())
            return fn(*a)

        return await off_loop(size, join, *args)

    monkeypatch.setattr(body, "off_loop", recorded)
    read = await body.read_body(_request(chunks), limit=10 * size)
    assert read == b"".join(chunks)
    loop_thread = threading.get_ident()
    assert (joined_on[0] != loop_thread) == (size > LARGE_BODY_BYTES)


def _upstream(received: list[bytes]) -> Any:
    """A one-request upstream that keeps each request's body in `received` and answers {}."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length")))  # fmt: skip
        received.append(await reader.readexactly(length))
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")
        await writer.drain()
        writer.close()

    return handle


async def test_a_large_body_is_written_after_its_head_not_joined_to_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    received: list[bytes] = []

    handle = _upstream(received)

    written: list[list[bytes]] = []
    send = _http11.Connection.send

    async def recorded(self: Any, data: Any, *args: Any) -> None:
        written.append(list(data))
        await send(self, data, *args)

    monkeypatch.setattr(_http11.Connection, "send", recorded)
    payload = bytes(range(256)) * (3 * 4096)  # 3 MB
    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with (
        server,
        httpx.AsyncClient(
            transport=LeanTransport(limits=httpx.Limits(max_connections=2))
        ) as client,
    ):
        response = await client.post(f"http://127.0.0.1:{port}/x", content=payload)
        small = await client.post(f"http://127.0.0.1:{port}/x", content=b'{"a": 1}')
    assert response.status_code == 200 and small.status_code == 200
    pieces, (joined,) = written
    assert joined.endswith(b'\r\n\r\n{"a": 1}')  # a small one: one write
    assert received[1] == b'{"a": 1}'
    assert len(pieces) == 2 and pieces[0].endswith(b"\r\n\r\n") and len(pieces[0]) < 1000
    assert pieces[1] == payload
    assert hashlib.sha256(received[0]).digest() == hashlib.sha256(payload).digest()


async def test_a_body_in_pieces_is_sent_as_they_are_each_large_one_a_slice_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A spliced body (views of the client's bytes between new pieces) goes out without a join,
    and no write gives the transport more than WRITE_SLICE bytes: asyncio's transport copies
    what the socket does not take into its buffer, on the event loop."""
    received: list[bytes] = []

    handle = _upstream(received)

    writes: list[int] = []
    made = _http11.Connection.connection_made

    def recording(self: Any, transport: Any) -> None:
        made(self, transport)
        write = transport.write
        transport.write = lambda data: (writes.append(len(data)), write(data))
        self.transport = transport

    monkeypatch.setattr(_http11.Connection, "connection_made", recording)
    client_body = bytes(range(256)) * (20 * 4096)  # 20 MB
    pieces: list[_http11.Piece] = [b"{", memoryview(client_body)[5:-5], b"new", client_body]
    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with (
        server,
        httpx.AsyncClient(transport=LeanTransport(limits=httpx.Limits(max_connections=1))) as c,
    ):
        request = c.build_request("POST", f"http://127.0.0.1:{port}/x")
        request.stream = _http11.Pieces(pieces)
        response = await c.send(request)
    assert response.status_code == 200
    whole = b"".join(pieces)
    assert hashlib.sha256(received[0]).digest() == hashlib.sha256(whole).digest()
    assert max(writes) <= _http11.WRITE_SLICE and sum(writes) > len(whole)  # the head too
    assert len(writes) >= len(whole) // _http11.WRITE_SLICE


class PausingTransport:
    """A transport whose buffer is full after every write, until the loop turns once."""

    def __init__(self, protocol: _http11.Connection) -> None:
        self.protocol = protocol
        self.writes: list[bytes] = []
        self.paused = False
        self.while_paused = 0  # bytes written since the buffer was last below its mark
        self.most_while_paused = 0

    def write(self, data: Any) -> None:
        self.writes.append(bytes(data))
        self.while_paused += len(data)
        self.most_while_paused = max(self.most_while_paused, self.while_paused)
        if not self.paused:
            self.paused = True
            self.protocol.pause_writing()
            asyncio.get_running_loop().call_soon(self.resume)

    def resume(self) -> None:
        self.paused = False
        self.while_paused = 0
        self.protocol.resume_writing()

    def close(self) -> None:
        self.protocol.connection_lost(None)


async def test_the_sender_waits_for_the_socket_after_every_slice_of_bytes() -> None:
    """Many pieces of under a slice (messages between new parts) are waited on as one large
    one: never more than two slices handed over while the buffer is full."""
    connection = _http11.Connection()
    transport = PausingTransport(connection)
    connection.connection_made(transport)  # type: ignore[arg-type]
    slice_ = _http11.WRITE_SLICE
    pieces: list[_http11.Piece] = [b"head", bytes(3 * slice_ + 5)]
    pieces += [memoryview(bytes([i]) * (slice_ // 3)) for i in range(20)]
    await connection.send(pieces, timeout=5)
    assert b"".join(transport.writes) == b"".join(pieces)
    assert max(len(w) for w in transport.writes) <= slice_
    assert transport.most_while_paused < 2 * slice_
    transport.close()
    with pytest.raises(_http11.Dead):
        await connection.send([bytes(2 * slice_)], timeout=5)


async def test_the_sender_stops_when_the_connection_closes_mid_body() -> None:
    connection = _http11.Connection()
    transport = PausingTransport(connection)
    connection.connection_made(transport)  # type: ignore[arg-type]
    resumed = 0
    resume = transport.resume

    def resume_then_close() -> None:
        nonlocal resumed
        resumed += 1
        resume()
        if resumed == 3:
            transport.close()  # the upstream went away after three slices

    transport.resume = resume_then_close  # type: ignore[method-assign]
    body = bytes(10 * _http11.WRITE_SLICE)
    with pytest.raises(_http11.Dead):
        await connection.send([b"head", body], timeout=5)
    assert sum(len(w) for w in transport.writes) <= 4 * _http11.WRITE_SLICE + 4
