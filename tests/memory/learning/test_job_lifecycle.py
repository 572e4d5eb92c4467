"""A job's life beside the chat: written before the response completes, withdrawn when the
exchange fails or is never relayed, applied once when a process dies mid-answer or mid-job, and
users served in parallel, one job each."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest
import respx
from pydantic_ai.messages import ModelMessage, ModelResponse
from pydantic_ai.models.function import AgentInfo
from sqlalchemy import delete

from app.memory.learning.jobs import JobQueue
from app.memory.store.db import writing
from app.memory.store.tables import ManagerJob
from tests.conftest import AppClientFactory
from tests.fakes import decided
from tests.helpers import completion_json, sse, sse_response
from tests.memory.learning.support import (
    ANN,
    Remembering,
    equals,
    kill,
    manager_client,
    memories,
    new_user_lines,
    no_jobs,
    services,
    until,
)


def slow_upstream(upstream: respx.Router, release: asyncio.Event, status: int = 200) -> None:
    """A model that starts streaming its answer, then thinks until `release` is set."""

    async def events() -> AsyncIterator[bytes]:
        yield sse({"role": "assistant", "content": "Noted"}, done=False)
        await release.wait()
        yield sse({"content": "."})

    async def answer(request: httpx.Request) -> httpx.Response:
        if status != 200:
            await release.wait()
            return httpx.Response(status, json={"error": {"message": "down"}})
        return httpx.Response(200, content=events(), headers={"content-type": "text/event-stream"})

    upstream.post("/chat/completions").mock(side_effect=answer)


async def _status(queue: JobQueue, status: str, count: int = 1) -> bool:
    return (await queue.counts())[status] == count


async def test_the_job_is_written_before_the_response_completes(
    make_client: AppClientFactory, upstream: respx.Router
) -> None:
    release = asyncio.Event()
    slow_upstream(upstream, release)
    client = await manager_client(make_client, Remembering())
    queue: JobQueue = services(client).jobs
    chat = asyncio.ensure_future(client.post(
        "/v1/chat/completions", json={"model": "m", "stream": True, "messages": [{"role": "user", "content": "I live in Oslo"}]}, headers=ANN
    ))  # fmt: skip
    await until(lambda: _status(queue, "awaiting"))  # while the model is still answering
    assert not chat.done()
    release.set()
    assert (await chat).status_code == 200
    await until(lambda: equals(memories(client), ["Lives in Oslo"]))


@pytest.mark.parametrize("stream", [False, True])
async def test_stats_show_the_job_pending_the_moment_the_answer_has_arrived(
    make_client: AppClientFactory, upstream: respx.Router, stream: bool
) -> None:
    """What a client (or a test) waits on: the job is pending as soon as the chat returns,
    through awaiting, queued and running, until it is applied."""
    answer = sse({"role": "assistant", "content": "Noted."})
    upstream.post("/chat/completions").mock(
        return_value=sse_response(answer)
        if stream
        else httpx.Response(200, json=completion_json("Noted."))
    )
    release = asyncio.Event()

    async def held(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        await release.wait()
        return decided(info, {"operations": []})

    client = await manager_client(make_client, held)
    chat = {"model": "m", "stream": stream,
            "messages": [{"role": "user", "content": "Remember that I live in Oslo"}]}  # fmt: skip
    assert (await client.post("/v1/chat/completions", json=chat, headers=ANN)).status_code == 200
    stats = (await client.get("/v1/memories/stats", headers=ANN)).json()["jobs"]
    assert stats["pending"] == 1 and stats["failed"] == 0
    release.set()
    await until(lambda: _pending(client, 0))


async def _pending(client: httpx.AsyncClient, count: int) -> bool:
    stats = (await client.get("/v1/memories/stats", headers=ANN)).json()["jobs"]
    return bool(stats["pending"] == count)


async def test_a_failed_exchange_withdraws_its_job_and_frees_its_turns(
    make_client: AppClientFactory, upstream: respx.Router
) -> None:
    release = asyncio.Event()
    release.set()
    slow_upstream(upstream, release, status=500)
    manager = Remembering()
    client = await manager_client(make_client, manager)
    queue: JobQueue = services(client).jobs
    messages = [{"role": "user", "content": "I live in Oslo"}]
    assert (
        await client.post(
            "/v1/chat/completions", json={"model": "m", "messages": messages}, headers=ANN
        )
    ).status_code == 500
    await services(client).runner.drain(5)
    assert sum((await queue.counts()).values()) == 0 and manager.seen == []
    upstream.routes.clear()
    upstream.post("/chat/completions").respond(json=completion_json("Noted."))
    await client.post(
        "/v1/chat/completions", json={"model": "m", "messages": messages}, headers=ANN
    )  # the retry
    await until(lambda: equals(memories(client), ["Lives in Oslo"]))


async def test_a_request_never_relayed_withdraws_the_job_begun_for_it(
    make_client: AppClientFactory, upstream_ok: respx.Route
) -> None:
    """The job is begun while recall's result is written into the body; a body that cannot be
    written back (deeper than orjson writes) is a 422 and never reaches the upstream: its job
    goes, and its turns are free for the conversation's next exchange."""
    client = await manager_client(make_client, Remembering())
    await client.post("/v1/memories", json={"content": "I live in Oslo by the fjord"}, headers=ANN)
    deep: object = []
    for _ in range(300):
        deep = [deep]
    messages = [{"role": "user", "content": "I moved to Oslo, what about the fjord?"}]
    body = {"model": "m", "messages": messages, "a": deep}
    response = await client.post("/v1/chat/completions", json=body, headers=ANN)
    assert response.status_code == 422 and not upstream_ok.called
    await services(client).runner.drain(5)
    assert sum((await services(client).jobs.counts()).values()) == 0
    await client.post(
        "/v1/chat/completions", json={"model": "m", "messages": messages}, headers=ANN
    )
    await until(
        lambda: equals(
            memories(client),
            sorted(["Moved to Oslo", "I live in Oslo by the fjord"]),  # the question is no fact
        )
    )


async def test_an_exchange_broken_by_an_unexpected_error_withdraws_its_job(
    make_client: AppClientFactory, upstream_ok: respx.Route, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An exception escaping the relay (a bug, a shutdown) ends the exchange as failed: the
    job begun for it goes, and the retry is learned."""
    client = await manager_client(make_client, Remembering())
    upstream = services(client).upstream
    working = upstream.open

    async def broken(request: httpx.Request) -> httpx.Response:
        raise RuntimeError("a bug in the relay")

    monkeypatch.setattr(upstream, "open", broken)
    messages = [{"role": "user", "content": "I live in Oslo"}]
    body = {"model": "m", "messages": messages}
    with pytest.raises(RuntimeError):  # the in-process transport re-raises what escaped
        await client.post("/v1/chat/completions", json=body, headers=ANN)
    await services(client).runner.drain(5)
    assert sum((await services(client).jobs.counts()).values()) == 0
    monkeypatch.setattr(upstream, "open", working)
    await client.post("/v1/chat/completions", json=body, headers=ANN)
    await until(lambda: equals(memories(client), ["Lives in Oslo"]))


async def test_a_process_dying_mid_answer_leaves_a_job_applied_once(
    make_client: AppClientFactory, upstream: respx.Router
) -> None:
    """The first process stops renewing its leases (as a process killed with -9) while its chat's
    answer is on its way: the second takes the awaiting job up once the lease has run out."""
    release = asyncio.Event()
    slow_upstream(upstream, release)
    first = await manager_client(make_client, Remembering(), manager_lease_seconds=0.6)
    await kill(services(first).worker)
    chat = asyncio.ensure_future(first.post(
        "/v1/chat/completions", json={"model": "m", "stream": True, "messages": [{"role": "user", "content": "I live in Oslo"}]}, headers=ANN
    ))  # fmt: skip
    await until(lambda: _status(services(first).jobs, "awaiting"))

    manager = Remembering()
    second = await manager_client(make_client, manager, manager_lease_seconds=0.6)
    await until(lambda: equals(memories(second), ["Lives in Oslo"]))
    release.set()  # the old process's answer arrives after all: its job is gone, nothing twice
    await chat
    await services(first).runner.drain(5)
    await asyncio.sleep(0.3)
    assert manager.seen == [["I live in Oslo"]] and await memories(second) == ["Lives in Oslo"]
    assert sum((await services(second).jobs.counts()).values()) == 0


class Gate:
    """A Manager that holds every decision until released, recording the jobs waiting at once
    (each as the user lines it was given)."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.waiting: list[list[str]] = []
        self.most = 0
        self.same_user_overlap = False

    async def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        lines = new_user_lines(messages)
        owners = {line.split()[0] for line in lines}  # "Ann ...", "Bob ..."
        if any(owners & {line.split()[0] for line in other} for other in self.waiting):
            self.same_user_overlap = True
        self.waiting.append(lines)
        self.most = max(self.most, len(self.waiting))
        await self.release.wait()
        self.waiting.remove(lines)
        ops = [{"op": "NEW", "content": line} for line in lines]
        return decided(info, {"operations": ops})


async def chat_as(client: httpx.AsyncClient, user: str, text: str) -> None:
    response = await client.post("/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": text}]},
                                 headers={"X-User-Id": user})  # fmt: skip
    assert response.status_code == 200


async def test_users_run_in_parallel_up_to_the_concurrency_one_job_each(
    make_client: AppClientFactory, upstream_ok: respx.Route
) -> None:
    gate = Gate()
    client = await manager_client(make_client, gate, manager_concurrency=2)
    for user, text in (("ann", "Ann lives in Oslo"), ("bob", "Bob plays chess"), ("cy", "Cy paints"),
                       ("ann", "Ann keeps bees")):  # fmt: skip
        await chat_as(client, user, text)
    await until(lambda: _at_least(gate, 2))
    await asyncio.sleep(0.3)  # time for a third to start, if anything allowed it
    assert len(gate.waiting) == 2 and not gate.same_user_overlap
    gate.release.set()
    await until(lambda: equals(memories(client, "cy"), ["Cy paints"]))
    await until(lambda: equals(memories(client, "ann"), ["Ann keeps bees", "Ann lives in Oslo"]))
    assert gate.most == 2 and not gate.same_user_overlap


async def _at_least(gate: Gate, count: int) -> bool:
    return len(gate.waiting) >= count


async def test_every_job_survives_a_crash_and_applies_once(
    make_client: AppClientFactory, upstream_ok: respx.Route
) -> None:
    gate = Gate()
    first = await manager_client(make_client, gate, manager_concurrency=2)
    users = {"ann": "Ann lives in Oslo", "bob": "Bob plays chess", "cy": "Cy paints"}
    for user, text in users.items():
        await chat_as(first, user, text)
    await until(lambda: _at_least(gate, 2))  # two mid-job, one queued
    await services(first).worker.stop()  # the process dies

    manager = Remembering()
    second = await manager_client(make_client, manager)
    for user, text in users.items():
        await until(lambda user=user, text=text: equals(memories(second, user), [text]))  # type: ignore[misc]
    await until(lambda: no_jobs(second))
    assert sorted(line for call in manager.seen for line in call) == sorted(users.values())


async def test_a_job_another_process_applied_meanwhile_is_skipped_not_counted(
    make_client: AppClientFactory, upstream: respx.Router
) -> None:
    """Between the claim and the commit, another process applied the job (and deleted it):
    this run applies nothing, and counts the job as skipped, not as applied."""
    asked: list[int] = []

    async def manager(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        async with writing(services(client).store.sessions) as session:  # the other process
            await session.execute(delete(ManagerJob))
        asked.append(1)
        return decided(info, {"operations": [{"op": "NEW", "content": "Keeps bees"}]})

    upstream.post("/chat/completions").respond(json=completion_json("Noted."))
    client = await manager_client(make_client, manager)
    chat = {"model": "m", "messages": [{"role": "user", "content": "Remember that I keep bees"}]}
    await client.post("/v1/chat/completions", json=chat, headers=ANN)

    async def skipped() -> bool:
        return "memproxy_manager_jobs_skipped_total 1.0" in (await client.get("/metrics")).text

    await until(skipped)
    text = (await client.get("/metrics")).text
    assert "memproxy_manager_jobs_applied_total 0.0" in text and asked == [1]
    assert await memories(client) == []
