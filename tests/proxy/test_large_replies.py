"""A large answer is read in a worker thread once the exchange is over; a small one on the loop.

The Manager's job gets the assistant's answer (`Completion.read`): an answer of tens of
megabytes (an upstream echoing a pasted document) took ~60 ms to read on the event loop, every
other request waiting (bench/loop_stall.py, `text, on`, after the request).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
import respx

import app.proxy.completion as completion
import app.proxy.hooks as hooks
from app.proxy.offload import LARGE_BODY_BYTES
from tests.conftest import AppClientFactory
from tests.helpers import sse, sse_response
from tests.memory.learning.support import Prompted, manager_client, no_jobs, until

ANN = {"X-User-Id": "ann"}


def reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The thread of each reading of an answer, from now on."""
    threads: list[int] = []
    real = completion.read_reply

    def recording(*args: Any, **kwargs: Any) -> Any:
        threads.append(threading.get_ident())
        return real(*args, **kwargs)

    monkeypatch.setattr(hooks, "read_reply", recording)
    return threads


@pytest.mark.parametrize("large", [True, False])
async def test_the_answer_is_read_off_the_loop_when_large(
    make_client: AppClientFactory,
    upstream: respx.Router,
    monkeypatch: pytest.MonkeyPatch,
    large: bool,
) -> None:
    text = "a long answer about the sea " * (LARGE_BODY_BYTES // 14) if large else "Tea, noted."
    events = sse(
        {"role": "assistant", "content": ""}, {"content": text[:1000]}, {"content": text[1000:]}
    )
    upstream.post("/chat/completions").mock(return_value=sse_response(events))
    manager = Prompted()
    client = await manager_client(make_client, manager)
    loop_thread = threading.get_ident()
    threads = reads(monkeypatch)
    chat = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "I like tea"}]}
    response = await client.post("/v1/chat/completions", json=chat, headers=ANN)
    assert response.status_code == 200 and response.text.count("data:") == 4
    await until(lambda: no_jobs(client))
    assert len(threads) == 1 and (threads[0] != loop_thread) is large  # read once
    assert manager.prompts and text[:60] in manager.prompts[0]  # the job had the answer


async def test_an_answer_is_read_once_whoever_asks(monkeypatch: pytest.MonkeyPatch) -> None:
    text = "x" * (2 * LARGE_BODY_BYTES)
    events = sse({"role": "assistant", "content": ""}, {"content": text})
    calls = reads(monkeypatch)
    done = hooks.Completion(hooks.Outcome.COMPLETED, 200, [events], sse=True)
    first, second = await asyncio.gather(done.read(), done.read())
    assert first is second is done.reply is await done.read()
    assert first.assistant_text == text and len(calls) == 1
