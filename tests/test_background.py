"""The background runner's drain at shutdown (app/background.py): what runs is waited for, what
it spawns meanwhile too (a response's after-work spawns the recall counters' write), and what
outlives the grace is cancelled."""

from __future__ import annotations

import asyncio

from app.background import BackgroundRunner


async def test_drain_waits_for_what_the_running_tasks_spawn_meanwhile() -> None:
    runner = BackgroundRunner()
    done: list[str] = []

    async def counters() -> None:
        await asyncio.sleep(0.05)
        done.append("counters")

    async def after_response() -> None:
        await asyncio.sleep(0.05)
        runner.spawn(counters(), name="counters")
        done.append("after")

    runner.spawn(after_response(), name="after")
    await runner.drain(2.0)
    assert done == ["after", "counters"]


async def test_drain_cancels_what_outlives_the_grace() -> None:
    runner = BackgroundRunner()
    cancelled = asyncio.Event()

    async def forever() -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    runner.spawn(forever(), name="forever")
    await runner.drain(0.05)
    assert cancelled.is_set()
