"""Which client connections `memproxy serve` keeps when they crowd ``MEMPROXY_MAX_CONNECTIONS``.

uvicorn counts every open connection toward its limit, so sockets that send nothing, or idle
keep-alive connections, locked every request out (503). Here only requests being served count
toward the refusal. Connections with nothing under way (opened and sent nothing yet, or kept
alive between requests) are kept while there is room: when a request head completes with more
connections open than the cap, the connection that has waited the longest is closed, first among
those that sent nothing for `grace` seconds, then among the idle keep-alive ones (as nginx reuses
its idle connections when it runs out of them). HTTP lets a server close an idle connection at
any time. A connection whose request began (a byte of its head received) is never closed to make
room: the header timeout bounds its head, and its request is then answered.

Room is made for requests, not for connections: a crowd of silent sockets that reconnects as
soon as one is closed would otherwise close itself in a loop (each reconnection closing another
one), burning the CPU the requests need. (Measured with bench/idle_sockets.py, 1,050 silent
sockets and a cap of 1,000: closing the oldest for each new connection made them reconnect
~700-900 times a second instead of ~100 and the requests' p99 ~100-500 ms instead of ~50; so
did cutting the header timeout to 1 s while crowded, ~350-800 a second, p99 ~400 ms.) Silent
connections beyond the cap are bounded by the header timeout instead, as they were before.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Protocol
from weakref import WeakKeyDictionary


class Droppable(Protocol):
    """A connection the book may close to make room."""

    def drop(self) -> None:
        """Close the connection at once, without an answer (nothing is under way on it)."""


class ConnectionBook:
    """The open connections of one server: how many, and which have nothing under way, oldest
    first."""

    grace = 1.0
    """Seconds a new connection has to begin its first request before it may be closed to make
    room (a burst of clients connects before any of their heads is read)."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._open: set[Droppable] = set()
        self._fresh: OrderedDict[Droppable, float] = OrderedDict()
        """Nothing received yet, in the order they opened: when."""
        self._idle: OrderedDict[Droppable, None] = OrderedDict()
        """Kept alive between requests, in the order they became idle."""

    @property
    def crowded(self) -> bool:
        """Open connections reach three quarters of the cap: keep-alive waits are cut short."""
        return len(self._open) * 4 >= self.cap * 3

    def opened(self, connection: Droppable, now: float) -> None:
        """Count a new connection, opened at `now`."""
        self._open.add(connection)
        self._fresh[connection] = now

    def begun(self, connection: Droppable) -> None:
        """A request began on the connection (part of its head came): it is no longer closed to
        make room."""
        self._fresh.pop(connection, None)
        self._idle.pop(connection, None)

    def serving(self, connection: Droppable, now: float, *, make_room: bool) -> None:
        """A request head is complete: the connection is kept until its response is done, and
        with `make_room`, beyond the cap, the connection waiting the longest is closed."""
        self._fresh.pop(connection, None)
        self._idle.pop(connection, None)
        while make_room and len(self._open) > self.cap:
            oldest = self._oldest(now)
            if oldest is None:  # the others have requests under way, or are new
                return
            self.closed(oldest)
            oldest.drop()

    def idle(self, connection: Droppable) -> None:
        """The connection answered its requests and waits for the next one (none begun)."""
        if connection in self._open:
            self._idle[connection] = None

    def closed(self, connection: Droppable) -> None:
        """The connection is gone (or going): it no longer counts."""
        self._open.discard(connection)
        self._fresh.pop(connection, None)
        self._idle.pop(connection, None)

    def _oldest(self, now: float) -> Droppable | None:
        if self._fresh:
            connection, opened = next(iter(self._fresh.items()))  # the oldest
            if now - opened >= self.grace:
                return connection
        return next(iter(self._idle), None)


_books: WeakKeyDictionary[object, ConnectionBook] = WeakKeyDictionary()


def book_of(server_state: object, cap: int) -> ConnectionBook:
    """The book of the server whose shared state is `server_state` (one per server)."""
    book = _books.get(server_state)
    if book is None:
        book = _books[server_state] = ConnectionBook(cap)
    return book
