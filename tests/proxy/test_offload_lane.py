"""The heavy steps of large bodies run on one worker thread, in turn (app/proxy/offload.py):
two threads running Python beside the event loop left it waiting 38-47 ms for the GIL. A small
body's step runs right where it is called, and the caller's context variables go along."""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time

import pytest

from app.proxy.offload import LARGE_BODY_BYTES, in_lane, off_loop

LARGE = LARGE_BODY_BYTES + 1
REQUEST = contextvars.ContextVar[str]("REQUEST", default="-")


class Overlap:
    """Counts how many calls are inside :meth:`step` at once, and on which threads."""

    def __init__(self) -> None:
        self.inside = 0
        self.most = 0
        self.threads: set[int] = set()
        self.seen: list[str] = []
        self._lock = threading.Lock()

    def step(self, name: str) -> str:
        with self._lock:
            self.inside += 1
            self.most = max(self.most, self.inside)
            self.threads.add(threading.get_ident())
            self.seen.append(REQUEST.get())
        time.sleep(0.02)  # lets go of the GIL: threads of a pool would be inside together
        with self._lock:
            self.inside -= 1
        return name


async def _as(request: str, overlap: Overlap, name: str, size: int) -> str:
    REQUEST.set(request)
    return await off_loop(size, overlap.step, name)


async def test_large_steps_of_concurrent_requests_take_turns_on_one_thread() -> None:
    overlap = Overlap()
    names = [f"step {i}" for i in range(4)]
    done = await asyncio.gather(
        *(_as(f"request {i}", overlap, n, LARGE) for i, n in enumerate(names)),
        in_lane(overlap.step, "freeing"),
    )
    assert done == [*names, "freeing"]  # each caller gets its own step's result
    assert overlap.most == 1 and len(overlap.threads) == 1
    assert threading.get_ident() not in overlap.threads
    assert sorted(overlap.seen) == ["-", *(f"request {i}" for i in range(4))]


async def test_a_small_step_runs_on_the_loop_beside_a_large_one() -> None:
    inside, release = threading.Event(), threading.Event()

    def large() -> int:
        inside.set()
        assert release.wait(5)
        return threading.get_ident()

    running = asyncio.ensure_future(off_loop(LARGE, large))
    assert await asyncio.to_thread(inside.wait, 5)  # the large step holds the lane
    assert await off_loop(10, threading.get_ident) == threading.get_ident()  # not queued
    release.set()
    assert await running != threading.get_ident()


async def test_a_failing_step_raises_in_its_caller_and_the_lane_goes_on() -> None:
    def fails() -> None:
        raise ValueError("bad body")

    with pytest.raises(ValueError, match="bad body"):
        await off_loop(LARGE, fails)
    assert await off_loop(LARGE, Overlap().step, "next") == "next"
