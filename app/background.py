"""Work done after a response, in the background: fire-and-forget tasks that shutdown waits for."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

logger = logging.getLogger("memproxy.hooks")  # the name its log lines always had


class BackgroundRunner:
    """Runs fire-and-forget coroutines: keeps them referenced, logs their failures, and lets
    shutdown wait for them (bounded) instead of cutting them off."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[object]] = set()

    def spawn(self, coro: Coroutine[Any, Any, object], *, name: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[object]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("background task %s failed", task.get_name(), exc_info=task.exception())

    async def drain(self, grace_seconds: float) -> None:
        """Wait up to `grace_seconds` for running tasks, those they spawn meanwhile included
        (a response's after-work spawns the recall counters' write), then cancel what is
        left."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_seconds
        while self._tasks and loop.time() < deadline:
            await asyncio.wait(set(self._tasks), timeout=deadline - loop.time())
        still_running = set(self._tasks)
        for task in still_running:
            task.cancel()
        if still_running:
            logger.warning("cancelled %d background task(s) at shutdown", len(still_running))
            await asyncio.gather(*still_running, return_exceptions=True)
