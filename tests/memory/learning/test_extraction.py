"""Memory extraction end to end in-process: chats become durable Manager jobs (a FunctionModel
stands in for the LLM, respx for the upstream), each turn is extracted once, jobs survive crashes
and apply exactly once."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import httpx
import pytest
import respx
from pydantic_ai import models
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.memory.learning.applier import Applier
from app.memory.learning.decisions import Op, Operation
from app.memory.learning.extraction import (
    CONTEXT_TURNS,
    MAX_JOB_TURNS,
    exchange,
    fingerprints_of,
    is_explicit,
)
from app.memory.learning.jobs import JobQueue
from app.memory.learning.turns import Turn
from app.memory.service import MemoryService
from app.memory.store.memories import MemoryStore
from app.memory.store.tables import ManagerJob, MemorySource
from tests.conftest import AppClientFactory
from tests.helpers import completion_json, sse

ANN = {"X-User-Id": "ann"}
FACTS = [
    "I live in Oslo",
    "My cat is called Tom",
    "I work as a nurse",
    "Sushi is my favourite food",
    "My sister Eva studies law",
    "I run marathons",
    "We drive a green Volvo",
    "I speak Portuguese",
    "Jazz helps me relax",
    "Our garden has apple trees",
]  # distinct words: the fake embedder finds no near-duplicates among them


@pytest.fixture(autouse=True)
def _no_real_models(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(models, "ALLOW_MODEL_REQUESTS", False)  # restored after the test
    yield


def new_user_lines(messages: list[ModelMessage]) -> list[str]:
    prompt = str(next(m for m in messages if isinstance(m, ModelRequest)).parts[-1].content)  # type: ignore[union-attr]
    new = prompt.split("The new exchange (decide from this):", 1)[1]
    return re.findall(r"^USER: (.*)$", new, re.M)


class Remembering:
    """A Manager that makes each new user line a memory, and records what it was shown."""

    def __init__(self) -> None:
        self.seen: list[list[str]] = []

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        lines = new_user_lines(messages)
        self.seen.append(lines)
        ops = [{"op": "NEW", "content": line, "type": "fact"} for line in lines]
        return ModelResponse(parts=[ToolCallPart(info.output_tools[0].name, {"operations": ops})])


def services(client: httpx.AsyncClient) -> Any:
    return client._transport.app.state.services  # type: ignore[attr-defined]


async def until(check: Callable[[], Awaitable[bool]], seconds: float = 10) -> None:
    async def loop() -> None:
        while not await check():  # noqa: ASYNC110 (database state: nothing to await on)
            await asyncio.sleep(0.02)

    await asyncio.wait_for(loop(), seconds)


async def memories(client: httpx.AsyncClient, user: str = "ann") -> list[str]:
    data = (
        await client.get("/v1/memories", params={"limit": 1000}, headers={"X-User-Id": user})
    ).json()["data"]
    return sorted(m["content"] for m in data)


@pytest.fixture
def upstream_ok(upstream: respx.Router) -> respx.Route:
    return upstream.post("/chat/completions").respond(json=completion_json("Noted."))


async def manager_client(
    make_client: AppClientFactory, model: Any, **settings: Any
) -> httpx.AsyncClient:
    settings = {"manager_enabled": True, "processing_interval": 0, "conversation_threshold": 1,
                "manager_retry_seconds": 0, **settings}  # fmt: skip
    client: httpx.AsyncClient = await make_client(manager_model=FunctionModel(model), **settings)
    return client


@pytest.mark.parametrize("text", [
    "Please remember that my wife is called Ana", "remember my PIN hint is the cat", "Don't forget I'm vegan",
    "Keep in mind I live in Porto now", "Please note: I prefer metric units", "Forget that I live in Oslo",
    "That's no longer true, I quit smoking", "From now on call me Sam", "I no longer work at Acme",
])  # fmt: skip
def test_explicit_requests_are_recognised(text: str) -> None:
    assert is_explicit(text)


@pytest.mark.parametrize("text", [
    "Do you remember the capital of Peru?", "What is the weather like?", "I forgot my umbrella",
    "Note the difference between these two functions", "How long is a marathon?",
])  # fmt: skip
def test_ordinary_messages_are_not_explicit(text: str) -> None:
    assert not is_explicit(text)


def test_exchange_takes_only_new_turns_and_waits_for_the_threshold() -> None:
    turns = [
        Turn("user", "I live in Oslo"),
        Turn("assistant", "Nice!"),
        Turn("user", "I have a cat"),
    ]
    assert exchange(turns[:1], set(), threshold=2) is None  # one user message: too early
    first = exchange(turns, set(), threshold=2)
    assert (
        first is not None
        and first.new == turns
        and first.context == []
        and len(first.fingerprints) == 2
    )
    later = [*turns, Turn("assistant", "Cute"), Turn("user", "I also run")]
    second = exchange(later, set(first.fingerprints), threshold=2)
    assert second is not None and second.context == [*turns, Turn("assistant", "Cute")]
    assert second.new == [Turn("user", "I also run")] and len(second.fingerprints) == 1
    assert exchange(later, set(first.fingerprints + second.fingerprints), threshold=2) is None
    explicit = exchange([Turn("user", "Remember that I'm allergic to nuts")], set(), threshold=5)
    assert explicit is not None and explicit.explicit


async def test_a_ten_turn_chat_creates_each_memory_once(
    make_client: AppClientFactory, upstream_ok: respx.Route
) -> None:
    manager = Remembering()
    client = await manager_client(make_client, manager)
    conversation: list[dict[str, Any]] = [{"role": "system", "content": "Be kind."}]
    for fact in FACTS:
        conversation.append({"role": "user", "content": fact})
        response = await client.post(
            "/v1/chat/completions", json={"model": "m", "messages": conversation}, headers=ANN
        )
        assert response.status_code == 200
        conversation.append({"role": "assistant", "content": "Noted."})
    expected = sorted(FACTS)
    await until(lambda: _equals(memories(client), expected))
    await until(lambda: _no_jobs(client))
    shown = [line for call in manager.seen for line in call]
    assert sorted(shown) == expected  # every user turn reached the Manager exactly once
    assert await memories(client) == expected


async def test_a_huge_turn_reaches_the_manager_as_its_start_and_end(
    make_client: AppClientFactory, upstream: respx.Router
) -> None:
    """A pasted document in a turn is cut for the Manager (the job and its prompt stay small);
    the request to remember before it, and the question after it, are kept."""
    prompts: list[str] = []

    def manager(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        prompts.append(
            str(next(m for m in messages if isinstance(m, ModelRequest)).parts[-1].content)
        )  # type: ignore[union-attr]
        return ModelResponse(parts=[ToolCallPart(info.output_tools[0].name, {"operations": []})])

    upstream.post("/chat/completions").respond(json=completion_json("Noted. " + "y" * 50_000))
    client = await manager_client(make_client, manager)
    text = "Remember that I play chess. " + "x" * 300_000 + " What opening suits me?"
    response = await client.post(
        "/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": text}]},
        headers=ANN,
    )
    assert response.status_code == 200
    await until(lambda: _no_jobs(client))
    (prompt,) = prompts
    assert len(prompt) < 20_000  # two turns of at most ~8k characters, and the frame
    assert "USER: Remember that I play chess." in prompt and "What opening suits me?" in prompt
    assert "characters left out ...]" in prompt


async def _equals(coro: Awaitable[list[str]], expected: list[str]) -> bool:
    return await coro == expected


async def _no_jobs(client: httpx.AsyncClient) -> bool:
    counts = await services(client).jobs.counts()
    return sum(counts.values()) == 0


@pytest.mark.parametrize(("headers", "messages"), [
    ({"X-OpenWebUI-Task": "title_generation"}, [{"role": "user", "content": "My cat is Tom"}]),
    ({"X-Memory": "off"}, [{"role": "user", "content": "My cat is Tom"}]),
    ({"X-Memory": "read-only"}, [{"role": "user", "content": "My cat is Tom"}]),
    ({}, [{"role": "user", "content": "My cat is Tom"},
          {"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
          {"role": "tool", "tool_call_id": "c", "content": "tool says hi"}]),
], ids=["task", "memory off", "read-only", "tool continuation"])  # fmt: skip
async def test_no_job_for_tasks_tool_continuations_or_memory_off(
    make_client: AppClientFactory,
    upstream_ok: respx.Route,
    headers: dict[str, str],
    messages: list[dict[str, Any]],
) -> None:
    manager = Remembering()
    client = await manager_client(make_client, manager)
    await client.post(
        "/v1/chat/completions",
        json={"model": "m", "messages": messages},
        headers={**ANN, **headers},
    )
    await services(client).runner.drain(5)
    assert await services(client).jobs.counts() == {
        "awaiting": 0,
        "queued": 0,
        "running": 0,
        "failed": 0,
    }
    assert manager.seen == [] and await memories(client) == []


async def test_threshold_holds_routine_chats_but_not_explicit_requests(
    make_client: AppClientFactory, upstream_ok: respx.Route
) -> None:
    manager = Remembering()
    client = await manager_client(make_client, manager, conversation_threshold=3)
    await client.post(
        "/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "I like tea"}]},
        headers=ANN,
    )
    await services(client).runner.drain(5)
    assert manager.seen == []
    explicit = [{"role": "user", "content": "Please remember that my sister is Eva"}]
    await client.post(
        "/v1/chat/completions", json={"model": "m", "messages": explicit}, headers=ANN
    )
    await until(lambda: _equals(memories(client), ["Please remember that my sister is Eva"]))


def test_a_long_conversation_first_seen_gives_its_last_turns_and_takes_them_all() -> None:
    turns = [
        Turn("user" if i % 2 == 0 else "assistant", f"turn {i}")
        for i in range(2 * MAX_JOB_TURNS + 11)
    ]  # starts and ends with a user turn
    found = exchange(turns, set(), threshold=1)
    assert found is not None
    assert len(found.new) <= MAX_JOB_TURNS and found.new[0].role == "user"
    assert found.new == turns[-len(found.new) :] and len(found.new) >= MAX_JOB_TURNS - 1
    assert found.context == turns[-len(found.new) - CONTEXT_TURNS : -len(found.new)]
    assert len(found.fingerprints) == MAX_JOB_TURNS + 6  # every user turn is taken
    # The marks index context + new: the job keeps exactly the new user turns.
    marks = dict(found.marks)
    offset = len(found.context)
    assert [marks[offset + i] for i, t in enumerate(found.new) if t.role == "user"] == [
        f for i, f in fingerprints_of(turns) if i >= len(turns) - len(found.new)
    ]
    assert exchange(turns, set(found.fingerprints), threshold=1) is None  # none left for later


async def test_routine_jobs_merge_only_within_the_bound(engine: AsyncEngine) -> None:
    queue = JobQueue(MemoryStore(engine).sessions, limit=100)
    turns: list[Turn] = []
    taken: set[str] = set()
    jobs = []
    for i in range(MAX_JOB_TURNS // 2 + 5):  # two turns an exchange
        turns += [Turn("user", f"fact {i}"), Turn("assistant", "ok")]
        found = exchange(turns, taken, threshold=1)
        assert found is not None
        taken |= set(found.fingerprints)
        queued = await queue.enqueue("ann", "m", found, interval_seconds=3600)
        assert queued is not None
        jobs.append(queued.job_id)
    assert len(set(jobs)) == 2 and await queue.counts() == {
        "awaiting": 0, "queued": 2, "running": 0, "failed": 0
    }  # fmt: skip
    async with queue._sessions() as session:
        sizes = sorted(len(job.payload["new"]) for job in await session.scalars(select(ManagerJob)))
    assert sizes == [10, MAX_JOB_TURNS]  # nothing dropped, no job over the bound


async def test_an_explicit_job_that_cannot_take_the_waiting_one_along_still_runs_now(
    engine: AsyncEngine,
) -> None:
    """Jobs of a user run oldest first: an explicit job queued on its own (the two together
    would be over the bound) makes the routine one before it due now, instead of waiting the
    processing interval behind it."""
    store = MemoryStore(engine)
    queue = JobQueue(store.sessions, limit=100)
    turns: list[Turn] = [Turn("user", "I live in Oslo"), Turn("assistant", "ok")]
    first = exchange(turns, set(), threshold=1)
    assert first is not None
    await queue.enqueue("ann", "m", first, interval_seconds=0)
    (done,) = await queue.claim(5, exclude_users=set())
    async with store.writing("ann", MemorySource.MANAGER, job_id=done.id) as w:
        assert await queue.consume(w, done.id)  # the user's last job: the interval runs from now
    taken = set(first.fingerprints)
    for explicit in (False, True):
        start = len(turns)
        turns += [Turn("user" if i % 2 == 0 else "assistant", f"turn {start + i}")
                  for i in range(MAX_JOB_TURNS // 2 + 8)]  # fmt: skip
        if explicit:
            turns[-2] = Turn("user", "Remember that I am vegan")
        found = exchange(turns, taken, threshold=1)
        assert found is not None and found.explicit is explicit
        taken |= set(found.fingerprints)
        await queue.enqueue("ann", "m", found, interval_seconds=3600)
    assert (await queue.counts())["queued"] == 2
    (claimed,) = await queue.claim(5, exclude_users=set())  # was [] for an hour
    assert not claimed.explicit  # the older one first, then the explicit one


async def test_exchanges_within_the_interval_join_one_job(engine: AsyncEngine) -> None:
    store = MemoryStore(engine)
    queue = JobQueue(store.sessions, limit=100)
    turns = [Turn("user", "I live in Oslo"), Turn("assistant", "ok")]
    first = exchange(turns, set(), threshold=1)
    assert first is not None
    one = await queue.enqueue("ann", "m", first, interval_seconds=0)
    (claimed,) = await queue.claim(5, exclude_users=set())  # the first runs; the next must wait
    later = [*turns, Turn("user", "I have a cat"), Turn("assistant", "ok")]
    second = exchange(later, set(first.fingerprints), threshold=1)
    third = exchange(
        [*later, Turn("user", "I run")], set(first.fingerprints + second.fingerprints), threshold=1
    )  # type: ignore[union-attr]
    assert second is not None and third is not None
    two = await queue.enqueue("ann", "m", second, interval_seconds=3600)
    three = await queue.enqueue("ann", "m", third, interval_seconds=3600)
    assert claimed.id == one.job_id and two.job_id == three.job_id  # joined, due in an hour
    assert await queue.counts() == {"awaiting": 0, "queued": 1, "running": 1, "failed": 0}
    assert (
        await queue.claim(5, exclude_users=set()) == []
    )  # ann has one running; the next is not due
    explicit = exchange([*later, Turn("user", "I run"), Turn("assistant", "ok"), Turn("user", "Remember that I'm vegan")],
                        set(first.fingerprints + second.fingerprints + third.fingerprints), threshold=1)  # fmt: skip
    assert explicit is not None and explicit.explicit
    merged = await queue.enqueue("ann", "m", explicit, interval_seconds=3600)
    assert merged.job_id != two.job_id and await queue.counts() == {
        "awaiting": 0,
        "queued": 1,
        "running": 1,
        "failed": 0,
    }
    await queue.retry_later(claimed.id, "done elsewhere", 0)  # the first job leaves "running"
    async with store.writing("ann", MemorySource.MANAGER, job_id=claimed.id) as w:
        assert await queue.consume(w, claimed.id)
    (due,) = await queue.claim(5, exclude_users=set())
    assert [text for _, text in due.payload["new"] if text != "ok"] == [
        "I have a cat",
        "I run",
        "Remember that I'm vegan",
    ]


async def test_a_full_queue_drops_the_oldest_routine_jobs_never_explicit(
    engine: AsyncEngine,
) -> None:
    queue = JobQueue(MemoryStore(engine).sessions, limit=2)
    explicit = exchange([Turn("user", "Remember that I'm vegan")], set(), threshold=1)
    assert explicit is not None
    await queue.enqueue("u0", "m", explicit, interval_seconds=0)
    dropped = 0
    for i in range(1, 4):
        routine = exchange([Turn("user", f"I have {i} cats")], set(), threshold=1)
        assert routine is not None
        dropped += (await queue.enqueue(f"u{i}", "m", routine, interval_seconds=0)).dropped
    assert dropped == 2 and (await queue.counts())["queued"] == 2
    users = sorted(job.user_id for job in await queue.claim(10, exclude_users=set()))
    assert users == ["u0", "u3"]  # the explicit one stayed, the newest routine one too


async def test_failures_retry_then_park_and_jobs_retry_requeues(
    make_client: AppClientFactory, upstream_ok: respx.Route
) -> None:
    calls = 0

    def unreachable(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        nonlocal calls
        calls += 1
        raise ConnectionError("manager unreachable")

    client = await manager_client(make_client, unreachable, manager_job_attempts=3)
    await client.post(
        "/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "I live in Oslo"}]},
        headers=ANN,
    )
    queue: JobQueue = services(client).jobs
    await until(lambda: _failed(queue))
    assert calls == 3
    ((_job_id, user, reason),) = await queue.failed()
    assert user == "ann" and "manager unreachable" in (reason or "")
    assert await queue.retry_failed("ann") == 1
    await until(lambda: _failed(queue))  # still unreachable: parked again after 3 more attempts
    assert calls == 6


async def _failed(queue: JobQueue) -> bool:
    return (await queue.counts())["failed"] == 1


async def test_a_job_already_applied_is_not_applied_again(make_client: AppClientFactory) -> None:
    client = await make_client()
    service: MemoryService = services(client).memory
    queue = JobQueue(service.store.sessions)
    outcomes = await Applier(service).apply(
        "ann", [Operation(op=Op.NEW, content="Lives in Oslo")], {}, job_id="gone", queue=queue
    )
    assert outcomes == [] and await memories(client) == []


async def test_a_crash_mid_job_loses_nothing_and_applies_once(
    make_client: AppClientFactory, upstream_ok: respx.Route
) -> None:
    """The process stops while the Manager is thinking; the next start finishes the job, once."""
    started = asyncio.Event()

    async def stuck(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        started.set()
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")

    first = await manager_client(make_client, stuck)
    await first.post(
        "/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "I live in Oslo"}]},
        headers=ANN,
    )
    await asyncio.wait_for(started.wait(), 10)
    worker = services(first).worker
    await worker.stop()  # the process dies: the job stays "running", nothing was committed
    queue: JobQueue = services(first).jobs
    assert await queue.counts() == {"awaiting": 0, "queued": 0, "running": 1, "failed": 0}

    manager = Remembering()
    second = await manager_client(make_client, manager)  # a new process on the same database
    await until(lambda: _equals(memories(second), ["I live in Oslo"]))
    await until(lambda: _no_jobs(second))
    await asyncio.sleep(0.2)
    assert manager.seen == [["I live in Oslo"]] and await memories(second) == ["I live in Oslo"]


async def test_failed_jobs_show_in_stats_and_the_cli_requeues_them(
    make_client: AppClientFactory, upstream_ok: respx.Route, capsys: pytest.CaptureFixture[str]
) -> None:
    def unreachable(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        raise ConnectionError("manager unreachable")

    client = await manager_client(make_client, unreachable, manager_job_attempts=1)
    await client.post(
        "/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "I live in Oslo"}]},
        headers=ANN,
    )
    queue: JobQueue = services(client).jobs
    await until(lambda: _failed(queue))
    await services(client).worker.stop()  # the CLI is another process
    stats = (await client.get("/v1/memories/stats", headers=ANN)).json()["jobs"]
    assert stats["failed"] == 1 and "manager unreachable" in stats["failures"][0]["reason"]
    assert (await client.get("/v1/memories/stats", headers={"X-User-Id": "bob"})).json()["jobs"][
        "failed"
    ] == 0

    from app import cli
    from tests.fakes import FakeEmbedder

    assert await asyncio.to_thread(cli.main, ["jobs", "list"], embedder=FakeEmbedder()) == 0
    listed = capsys.readouterr().out
    assert "failed 1" in listed and "user=ann: ConnectionError: manager unreachable" in listed
    assert (
        await asyncio.to_thread(
            cli.main, ["jobs", "retry", "--user", "ann"], embedder=FakeEmbedder()
        )
        == 0
    )
    assert "queued again: 1" in capsys.readouterr().err
    assert (await queue.counts("ann"))["queued"] == 1


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
    await until(lambda: _equals(memories(client), ["I live in Oslo"]))


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
    await until(lambda: _equals(memories(client), ["I live in Oslo"]))


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
    messages = [{"role": "user", "content": "I live in Oslo, what about the fjord?"}]
    body = {"model": "m", "messages": messages, "a": deep}
    response = await client.post("/v1/chat/completions", json=body, headers=ANN)
    assert response.status_code == 422 and not upstream_ok.called
    await services(client).runner.drain(5)
    assert sum((await services(client).jobs.counts()).values()) == 0
    await client.post(
        "/v1/chat/completions", json={"model": "m", "messages": messages}, headers=ANN
    )
    await until(
        lambda: _equals(
            memories(client), sorted([messages[0]["content"], "I live in Oslo by the fjord"])
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
    await until(lambda: _equals(memories(client), ["I live in Oslo"]))


async def test_a_process_dying_mid_answer_leaves_a_job_applied_once(
    make_client: AppClientFactory, upstream: respx.Router
) -> None:
    release = asyncio.Event()
    slow_upstream(upstream, release)
    first = await manager_client(make_client, Remembering())
    await services(first).worker.stop()
    chat = asyncio.ensure_future(first.post(
        "/v1/chat/completions", json={"model": "m", "stream": True, "messages": [{"role": "user", "content": "I live in Oslo"}]}, headers=ANN
    ))  # fmt: skip
    await until(lambda: _status(services(first).jobs, "awaiting"))

    manager = Remembering()
    second = await manager_client(make_client, manager)  # the restarted process
    await until(lambda: _equals(memories(second), ["I live in Oslo"]))
    release.set()  # the old process's answer arrives after all: its job is gone, nothing twice
    await chat
    await services(first).runner.drain(5)
    await asyncio.sleep(0.3)
    assert manager.seen == [["I live in Oslo"]] and await memories(second) == ["I live in Oslo"]
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
        return ModelResponse(parts=[ToolCallPart(info.output_tools[0].name, {"operations": ops})])


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
    await until(lambda: _equals(memories(client, "cy"), ["Cy paints"]))
    await until(lambda: _equals(memories(client, "ann"), ["Ann keeps bees", "Ann lives in Oslo"]))
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
        await until(lambda user=user, text=text: _equals(memories(second, user), [text]))  # type: ignore[misc]
    await until(lambda: _no_jobs(second))
    assert sorted(line for call in manager.seen for line in call) == sorted(users.values())
