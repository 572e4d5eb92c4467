"""How long the answers under way still have once `memproxy serve` is asked to stop.

On SIGTERM or a first Ctrl-C uvicorn stops accepting connections, closes the idle ones and waits
for the requests under way; a stream from a slow model can take minutes. Its protocol
(:mod:`app.server`) starts the server's :class:`ShutdownGrace` when that shutdown begins and
hands it to every request in the ASGI scope (``scope["extensions"]["memproxy.shutdown"]``, see
:func:`grace_of`). ``MEMPROXY_SHUTDOWN_GRACE_SECONDS`` later the relay ends what is still under
way itself (:mod:`app.proxy.relay`): a stream with a final ``data: {"error": ...}`` event, an
answer not begun with a 503 ``shutting_down``, so that no client is cut mid-event and every
exchange reaches its completion hook (a Manager job awaiting the answer is handed back) before
the lifespan's shutdown. Under another ASGI server there is no grace: requests end as that
server ends them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextvars import ContextVar
from functools import partial
from typing import Any
from weakref import WeakKeyDictionary

EXTENSION = "memproxy.shutdown"
"""The ASGI scope extension that carries the server's grace: ``{"grace": ShutdownGrace}``."""

_begun_here = False
"""Whether a server of this process has begun shutting down (:func:`shutting_down`)."""
_unfinished = ContextVar("memproxy_unfinished_on_purpose", default=False)


def shutting_down() -> bool:
    """Whether a server of this process is shutting down: from then on a cancelled task is the
    server's doing (its limit, a second Ctrl-C), not a fault to report."""
    return _begun_here


def leave_unfinished() -> None:
    """The current request's body is left unfinished on purpose (the client must see a broken
    answer): the server's complaint about it is expected (:func:`left_unfinished`)."""
    _unfinished.set(True)


def left_unfinished() -> bool:
    """Whether the current request (this task's context) was left unfinished on purpose."""
    return _unfinished.get()


class ShutdownGrace:
    """One server's shutdown: begun when the server stops taking requests, over `seconds` later
    (at once for 0); then every watcher is called, once."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.begun = False
        self.over = False
        self._watchers: set[Callable[[], None]] = set()

    def begin(self) -> None:
        """The server is shutting down: start the clock (again: nothing)."""
        global _begun_here
        if not self.begun:
            self.begun = _begun_here = True
            asyncio.get_running_loop().call_later(self.seconds, self._end)

    def watch(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call `callback` when the grace is over (soon, when it is already); returns what
        forgets it (a request that ended in time)."""
        if self.over:
            handle = asyncio.get_running_loop().call_soon(callback)
            return handle.cancel
        self._watchers.add(callback)
        return partial(self._watchers.discard, callback)

    def _end(self) -> None:
        self.over = True
        watchers, self._watchers = self._watchers, set()
        for callback in watchers:
            callback()


def grace_of(scope: Any) -> ShutdownGrace | None:
    """The grace of the server serving the request of `scope` (None: not `memproxy serve`)."""
    extension = scope.get("extensions", {}).get(EXTENSION)
    grace = extension.get("grace") if isinstance(extension, dict) else None
    return grace if isinstance(grace, ShutdownGrace) else None


_graces: WeakKeyDictionary[object, ShutdownGrace] = WeakKeyDictionary()


def grace_for(server_state: object, seconds: float) -> ShutdownGrace:
    """The grace of the server whose shared state is `server_state` (one per server)."""
    grace = _graces.get(server_state)
    if grace is None:
        grace = _graces[server_state] = ShutdownGrace(seconds)
    return grace
