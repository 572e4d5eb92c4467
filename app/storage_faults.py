"""Which errors mean the database failed, whether its writes fail now, and how long a chat's job
write may take.

A failure of the database's (:func:`storage_failure`): the server is down, restarting or refusing
connections, a connection was cut, the database is locked beyond patience, full, read-only (a
standby after a failover) or its disk fails. Such a failure passes: a client is answered 503 with
``Retry-After`` (:class:`app.errors.StorageUnavailable`, :mod:`app.error_handlers`), a chat's
Manager job is written again within a bound (:class:`WriteBound`, :mod:`app.memory.chat.job_write`),
and ``/readyz`` says not ready while writes fail (:func:`write_failure`: every write transaction
reports to :func:`wrote`). A bug, a refusal of the data (a constraint violated, bad SQL, a value
out of range) or an OSError of memproxy's own (a file, a timeout of its own) is none of these:
it stays an error of memproxy's, a 500.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractContextManager, asynccontextmanager, contextmanager, nullcontext
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from sqlalchemy import exc as sa
from sqlalchemy.engine import Engine
from sqlalchemy.ext.asyncio import AsyncEngine

from app.errors import causes, first_line

POSTGRES_CLASSES = ("08", "40", "53", "57", "58")
"""SQLSTATE classes of a failing server: connection exception, transaction rollback (deadlock,
serialization), insufficient resources (disk full, out of memory, too many connections),
operator intervention (shutdown, restart, "cannot connect now"), system error (I/O)."""
POSTGRES_STATES = frozenset({"25006"})
"""A write in a read-only transaction: the server is a standby (after a failover)."""
SQLITE_CODES = frozenset({5, 6, 7, 8, 10, 13, 14, 15})
"""SQLite's primary result codes of a failing file: BUSY, LOCKED, NOMEM, READONLY, IOERR, FULL,
CANTOPEN, PROTOCOL (``SQLITE_ERROR``, 1, is bad SQL or a missing table: not among them)."""
SQLITE_TEXTS = (
    "database is locked",
    "disk i/o error",
    "database or disk is full",
    "unable to open database",
    "readonly database",
)
BUGS = (sa.IntegrityError, sa.ProgrammingError, sa.DataError, sa.NotSupportedError)
DRIVERS = ("asyncpg", "aiosqlite", "sqlite3", "psycopg")
"""The database drivers: an OSError they raise, or one under an error of theirs, is the network
or the file under the database."""
CONNECTING = ("sqlalchemy.pool", "sqlalchemy.dialects", "sqlalchemy.connectors")
"""Where SQLAlchemy connects: an OSError raised through it is the database refusing or not
answering (asyncpg's refused connection comes out bare, not wrapped in a DBAPI error)."""


def storage_failure(exc: BaseException) -> bool:
    """True when `exc` (or what caused it) is the database failing, not memproxy or the data."""
    under_driver = False  # an error of the driver's came before, caused by what follows
    for link in causes(exc):
        if isinstance(link, BUGS):
            return False
        if isinstance(link, sa.TimeoutError | sa.DisconnectionError):
            return True  # no connection from the pool in time; one found dead
        if isinstance(link, sa.DBAPIError) and (
            link.connection_invalidated or link.statement is None
        ):
            return True  # the connection broke, or could not be opened at all
        if isinstance(link, OSError) and (under_driver or _raised_through(link)):
            return True  # refused, reset, unreachable, timed out: the network to the database
        if _sqlstate_fails(getattr(link, "sqlstate", None) or getattr(link, "pgcode", None)):
            return True
        code = getattr(link, "sqlite_errorcode", None)
        if isinstance(code, int) and code & 0xFF in SQLITE_CODES:
            return True
        if code is None and isinstance(link, sa.OperationalError) and _sqlite_text(link):
            return True
        under_driver = under_driver or _driver_error(link)
    return False


def _raised_through(error: BaseException) -> bool:
    """Whether `error` came up through a driver's code, or SQLAlchemy's connecting (its
    traceback)."""
    tb = error.__traceback__
    while tb is not None:
        if str(tb.tb_frame.f_globals.get("__name__", "")).startswith(DRIVERS + CONNECTING):
            return True
        tb = tb.tb_next
    return False


def _driver_error(error: BaseException) -> bool:
    return isinstance(error, sa.DBAPIError) or type(error).__module__.startswith(DRIVERS)


def _sqlite_text(error: sa.OperationalError) -> bool:
    """SQLite's words for a failing file (an error made without its code)."""
    return any(t in str(error.orig).lower() for t in SQLITE_TEXTS)


def _sqlstate_fails(state: object) -> bool:
    return isinstance(state, str) and (state[:2] in POSTGRES_CLASSES or state in POSTGRES_STATES)


@dataclass(frozen=True, slots=True)
class WriteFailure:
    reason: str
    """The error, in one line (no statement, no parameters)."""
    since: float
    """When writes began failing (``time.monotonic()``)."""


_failing: weakref.WeakKeyDictionary[Engine, WriteFailure] = weakref.WeakKeyDictionary()


@contextmanager
def reporting(engine: object) -> Iterator[None]:
    """Around a write transaction on `engine` (:func:`app.memory.store.db.writing`): how it
    ended is what :func:`write_failure` says."""
    try:
        yield
    except Exception as exc:
        wrote(engine, exc)
        raise
    wrote(engine, None)


def wrote(engine: object, error: BaseException | None) -> None:
    """A write transaction on `engine` ended: committed (`error` None) or failed with `error`.
    Only the database's failures mark it; a bug or a refused value says nothing of it. (A
    session maker bound to no engine: nothing to say.)"""
    if not isinstance(engine, AsyncEngine):
        return
    if error is None:
        _failing.pop(engine.sync_engine, None)
    elif storage_failure(error):
        held = _failing.get(engine.sync_engine)
        since = held.since if held is not None else time.monotonic()
        reason = f"{type(error).__name__}: {first_line(error)}"
        _failing[engine.sync_engine] = WriteFailure(reason[:200], since)


def write_failure(engine: AsyncEngine) -> WriteFailure | None:
    """How writes on `engine` fail, while the last one did; None when it committed."""
    return _failing.get(engine.sync_engine)


_watched: ContextVar[WriteBound | None] = ContextVar("memproxy_write_bound", default=None)


class WriteBound:
    """How long a write may take: `seconds` from now (the loop's clock), not counting the time it
    waits its turn on a busy SQLite file (:func:`waiting_turn`: the database answers, another
    writer holds its lock), unless that wait fails (locked beyond the write's patience), nor
    the work set :meth:`aside` (the machine's, not the database's)."""

    def __init__(self, seconds: float) -> None:
        self._loop = asyncio.get_running_loop()
        self._deadline = self._loop.time() + seconds
        self._turns = 0  # waits for a turn under way
        self._changed: asyncio.Future[None] = self._loop.create_future()

    def watch(self) -> None:
        """Bind the writes of the running task (and of the tasks it starts) to this bound."""
        _watched.set(self)

    def out_of_time(self, after: float = 0.0) -> bool:
        """Whether the bound is past, or will be in `after` seconds (never while in a turn)."""
        return self._turns == 0 and self._loop.time() + after >= self._deadline

    async def wait(self, work: asyncio.Future[Any]) -> bool:
        """Wait for `work` (never cancelling it) while the bound lasts: whether it is done."""
        while not work.done():
            left = None if self._turns else self._deadline - self._loop.time()
            if left is not None and left <= 0:
                return False
            changed = self._changed
            await asyncio.wait({work, changed}, timeout=left, return_when=asyncio.FIRST_COMPLETED)
        return True

    @contextmanager
    def turn(self) -> Iterator[None]:
        """A wait for a turn (:func:`waiting_turn`): the bound stops meanwhile, and moves on by
        as long once the turn came; a wait that failed counts."""
        started, outermost = self._loop.time(), self._turns == 0
        self._turns += 1
        self._change()
        try:
            yield
            if outermost:
                self._deadline += self._loop.time() - started
        finally:
            self._turns -= 1
            self._change()

    def aside(self) -> AbstractContextManager[None]:
        """Work of the write's that is not the database's (a large body's turns made off the
        loop: seconds for a 50 MB conversation on a busy machine): the bound stops meanwhile,
        as for a turn. It bounds how long the database takes to answer, not the machine."""
        return self.turn()

    def _change(self) -> None:
        self._changed.set_result(None)
        self._changed = self._loop.create_future()


def waiting_turn() -> AbstractContextManager[None]:
    """Around a write's wait for its turn at a busy database (:func:`app.memory.store.db.writing`
    on SQLite): the :class:`WriteBound` the running task watches, if any, stops meanwhile."""
    bound = _watched.get()
    return nullcontext() if bound is None else bound.turn()


@asynccontextmanager
async def queued(lock: asyncio.Lock) -> AsyncIterator[None]:
    """`lock` held for the block, the wait for it being a turn (:func:`waiting_turn`): the
    writers ahead of this one in the process's queue hold it."""
    with waiting_turn():
        await lock.acquire()
    try:
        yield
    finally:
        lock.release()
