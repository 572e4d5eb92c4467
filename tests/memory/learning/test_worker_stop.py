"""The Manager's worker always stops: a shutdown never waits on a task that swallowed its cancel.

On Python 3.11 ``asyncio.wait_for`` drops a cancel that arrives just as the awaited wake-up is
set; the worker's poll loop then ran on and the app's shutdown waited for it forever (seen as a
test run hanging under load). These tests pin the two guards: the loop waits with
``asyncio.timeout`` and ``stop()`` cancels until the task has really ended.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from app.memory.learning.worker import Worker, _cancelled
from tests.conftest import make_settings


async def test_a_task_that_swallows_a_cancel_is_cancelled_again() -> None:
    swallowed = 0

    async def stubborn() -> None:
        nonlocal swallowed
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                swallowed += 1
                if swallowed > 1:
                    raise

    task = asyncio.get_running_loop().create_task(stubborn())
    await asyncio.sleep(0)
    assert await ended(_cancelled(task)), "the task outlived its cancel"
    assert task.cancelled() and swallowed == 2


async def ended(work: Coroutine[Any, Any, None], within: float = 10.0) -> bool:
    """Whether `work` ends within `within` seconds. Not wait_for: cancelling a hung stop() would
    wait on the same stuck task, so a hang would block the test run instead of failing it."""
    task = asyncio.get_running_loop().create_task(work)
    done, _ = await asyncio.wait({task}, timeout=within)
    return task in done


class IdleQueue:
    """A queue with nothing to claim (all the poll loop asks of it here)."""

    lease_seconds = 30.0

    async def sync_clock(self) -> None:
        pass

    def let_go(self, job_id: str) -> None:
        pass

    async def renew(self) -> int:
        return 0

    async def expire(self) -> int:
        return 0

    async def release(self) -> int:
        return 0

    async def claim(self, n: int, *, exclude_users: set[str]) -> list[object]:
        return []


async def test_stop_right_after_a_wake_up_ends_the_poll_loop() -> None:
    for _ in range(20):
        # Only the poll loop runs: no service or Manager is ever asked for anything.
        worker = Worker(IdleQueue(), None, None, make_settings(manager_concurrency=1))  # type: ignore[arg-type]
        await worker.start()
        await asyncio.sleep(0.01)  # the loop now waits for a wake-up
        worker.wake()  # set, and cancelled in the same turn of the event loop
        assert await ended(worker.stop()), "stop() waited for the poll loop forever"
