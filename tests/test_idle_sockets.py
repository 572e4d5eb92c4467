"""Idle connections do not lock served ones out (issue 23, point 5), against a real uvicorn run as
`memproxy serve` runs it, over raw sockets, with a small MEMPROXY_MAX_CONNECTIONS.

Connections with nothing under way (silent, or kept alive between requests) make room for new
ones, oldest first; one part-way through a request head is not closed for room; only requests in
flight beyond the cap are refused. bench/idle_sockets.py measures
the same with the issue's load.
"""

from __future__ import annotations

import select
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import orjson
import pytest

from app.main import create_app
from app.server import uvicorn_options
from tests.conftest import make_settings
from tests.fakes import FakeEmbedder
from tests.servers import serve
from tests.test_limits import connect, read_response, served, still_serves

CAP = 20
HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
HALF_HEAD = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n"
"""HEALTHZ without the blank line that ends its head."""


@contextmanager
def silent_crowd(port: int, size: int) -> Iterator[list[int]]:
    """`size` connections that never send a byte, each reopened as soon as the server closes it
    (as an attacker would), from a thread; yields the count of reopenings (one item, updated)."""
    reopened = [0]
    stop = threading.Event()
    crowd = [connect(port) for _ in range(size)]

    def keep_up() -> None:
        while not stop.is_set():
            readable, _, _ = select.select(crowd, [], [], 0.05)
            for sock in readable:  # only an end of stream (or a reset) comes from the server
                sock.close()
                crowd[crowd.index(sock)] = connect(port)
                reopened[0] += 1

    thread = threading.Thread(target=keep_up, daemon=True)
    thread.start()
    try:
        yield reopened
    finally:
        stop.set()
        thread.join(10)
        for sock in crowd:
            sock.close()


def get(port: int) -> int:
    """The status of a GET /healthz on a new connection."""
    with connect(port) as sock:
        sock.sendall(HEALTHZ)
        return read_response(sock)[0]


def closed_by_server(sock: socket.socket) -> bool:
    readable, _, _ = select.select([sock], [], [], 0)
    return bool(readable) and sock.recv(1) == b""


def test_silent_sockets_over_the_cap_do_not_refuse_real_requests() -> None:
    with served(max_connections=CAP) as port, silent_crowd(port, CAP + 10) as reopened:
        time.sleep(1.2)  # the crowd is in, and past the second a new connection is given
        for _ in range(5):
            assert get(port) == 200
            time.sleep(0.1)
        assert reopened[0] > 0  # requests made room: the oldest silent sockets were closed


def test_a_burst_of_new_connections_beyond_the_cap_is_answered() -> None:
    with served(max_connections=CAP) as port:
        burst = [connect(port) for _ in range(CAP + 5)]
        try:
            time.sleep(0.1)  # all open before any sends its head
            for sock in burst:
                sock.sendall(HEALTHZ)
            # Each gets an answer (not the connection closed under it to make room for another).
            assert {read_response(sock)[0] for sock in burst} <= {200, 503}
        finally:
            for sock in burst:
                sock.close()


def test_kept_alive_connections_over_the_cap_do_not_block_a_new_one() -> None:
    with served(max_connections=CAP, crowded_keep_alive_seconds=60) as port:
        kept = []
        try:
            for _ in range(CAP + 5):  # each served once, then left open (not a byte more)
                sock = connect(port)
                kept.append(sock)
                sock.sendall(HEALTHZ)
                assert read_response(sock)[0] == 200
            assert get(port) == 200  # a new client is served at once, not after the keep-alive
            # Room was made by closing the connections idle the longest: the first ones.
            time.sleep(0.2)
            assert closed_by_server(kept[0])
            assert not closed_by_server(kept[-1])
            kept[-1].sendall(HEALTHZ)  # the newest is still kept alive, and serves
            assert read_response(kept[-1])[0] == 200
        finally:
            for sock in kept:
                sock.close()


@pytest.mark.parametrize("pipelined", [False, True], ids=["after-its-response", "pipelined"])
def test_a_kept_alive_connection_part_way_through_a_head_is_not_closed_for_room(
    pipelined: bool,
) -> None:
    cap = 2
    with (
        served(max_connections=cap, crowded_keep_alive_seconds=60) as port,
        connect(port) as begun,
        connect(port) as idle,
    ):
        begun.sendall(HEALTHZ + HALF_HEAD if pipelined else HEALTHZ)
        assert read_response(begun)[0] == 200  # begun: idle the longest ...
        idle.sendall(HEALTHZ)
        assert read_response(idle)[0] == 200
        if not pipelined:
            begun.sendall(HALF_HEAD)  # ... until its next request began
        time.sleep(0.1)  # read by the server
        assert get(port) == 200  # beyond the cap: room is made ...
        time.sleep(0.2)
        assert closed_by_server(idle)  # ... by closing the connection with nothing under way
        begun.sendall(b"\r\n")  # the rest of the head
        assert read_response(begun)[0] == 200


def test_a_new_connection_part_way_through_its_first_head_is_not_closed_for_room() -> None:
    cap = 2
    with served(max_connections=cap) as port, connect(port) as begun, connect(port) as silent:
        begun.sendall(HALF_HEAD)
        time.sleep(1.2)  # both past the grace; begun, the older, has a request under way
        assert get(port) == 200  # beyond the cap: room is made by closing the silent one
        time.sleep(0.2)
        assert closed_by_server(silent)
        assert not closed_by_server(begun)
        begun.sendall(b"\r\n")
        assert read_response(begun)[0] == 200


def test_requests_in_flight_beyond_the_cap_still_get_503() -> None:
    cap = 3
    with served(max_connections=cap) as port:
        busy = []
        try:
            for _ in range(cap):  # bodies announced and never sent: each request is in flight
                sock = connect(port)
                busy.append(sock)
                sock.sendall(
                    b"POST /v1/memories HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                    b"Content-Length: 100\r\nExpect: 100-continue\r\n\r\n"
                )
                assert sock.recv(100).startswith(b"HTTP/1.1 100 ")  # the app is reading it
            for _ in range(3):
                with connect(port) as sock:
                    sock.sendall(HEALTHZ)
                    status, headers, body = read_response(sock)
                assert status == 503 and headers["retry-after"] == "1"
                assert orjson.loads(body)["error"]["code"] == "server_busy"
                assert headers["connection"] == "close"
        finally:
            for sock in busy:
                sock.close()
        # Once the requests in flight are gone (the server notices in its own time), it serves.
        deadline = time.monotonic() + 20
        while get(port) != 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        still_serves(port)


def test_under_crowding_keep_alive_connections_are_closed_sooner() -> None:
    settings = make_settings(max_connections=CAP, crowded_keep_alive_seconds=0.3)
    app = create_app(settings, embedder=FakeEmbedder())
    options = uvicorn_options(settings) | {"timeout_keep_alive": 60, "log_level": "warning"}
    with serve(app, **options) as url:
        port = int(url.rsplit(":", 1)[1])
        crowd = [connect(port) for _ in range(CAP * 3 // 4)]  # three quarters: crowded
        try:
            with connect(port) as client:
                client.sendall(HEALTHZ)
                assert read_response(client)[0] == 200
                client.settimeout(10)  # well before uvicorn's keep-alive of 60 s
                assert client.recv(1) == b""
        finally:
            for sock in crowd:
                sock.close()
