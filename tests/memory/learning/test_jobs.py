"""The Manager's job queue: routine exchanges merge within the bound and the interval, a full
queue drops routine jobs only, failures retry then park (the CLI requeues them), a job applies
once, and a crash mid-job loses nothing."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
import respx
from pydantic_ai.messages import ModelMessage, ModelResponse
from pydantic_ai.models.function import AgentInfo
from sqlalchemy import event, insert, select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.memory.learning import jobs
from app.memory.learning.applier import Applier, JobGone
from app.memory.learning.decisions import Op, Operation
from app.memory.learning.extraction import MAX_JOB_TURNS, exchange
from app.memory.learning.jobs import JobQueue
from app.memory.learning.turns import turn
from app.memory.service import MemoryService
from app.memory.store.db import writing
from app.memory.store.memories import MemoryStore
from app.memory.store.records import now
from app.memory.store.tables import ManagerJob, MemorySource, ProcessedTurn
from tests.conftest import AppClientFactory
from tests.memory.learning.support import (
    ANN,
    Remembering,
    equals,
    kill,
    manager_client,
    memories,
    no_jobs,
    said,
    services,
    until,
)


async def test_routine_jobs_merge_only_within_the_bound(engine: AsyncEngine) -> None:
    sessions = MemoryStore(engine).sessions
    queue = JobQueue(sessions, limit=100)
    turns: list[ModelMessage] = []
    taken: set[str] = set()
    jobs = []
    for i in range(MAX_JOB_TURNS // 2 + 5):  # two turns an exchange
        turns += [turn("user", f"fact {i}"), turn("assistant", "ok")]
        found = exchange(turns, taken, threshold=1)
        assert found is not None
        taken |= set(found.fingerprints)
        queued = await queue.enqueue("ann", "m", found, interval_seconds=3600)
        assert queued is not None
        jobs.append(queued.job_id)
    assert len(set(jobs)) == 2 and await queue.counts() == {
        "awaiting": 0, "queued": 2, "running": 0, "failed": 0
    }  # fmt: skip
    async with sessions() as session:
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
    turns: list[ModelMessage] = [turn("user", "I live in Oslo"), turn("assistant", "ok")]
    first = exchange(turns, set(), threshold=1)
    assert first is not None
    await queue.enqueue("ann", "m", first, interval_seconds=0)
    (done,) = await queue.claim(5, exclude_users=set())
    async with store.writing("ann", MemorySource.MANAGER, job_id=done.id) as w:
        assert await queue.consume(w, done.id)  # the user's last job: the interval runs from now
    taken = set(first.fingerprints)
    for explicit in (False, True):
        start = len(turns)
        turns += [turn("user" if i % 2 == 0 else "assistant", f"turn {start + i}")
                  for i in range(MAX_JOB_TURNS // 2 + 8)]  # fmt: skip
        if explicit:
            turns[-2] = turn("user", "Remember that I am vegan")
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
    turns = [turn("user", "I live in Oslo"), turn("assistant", "ok")]
    first = exchange(turns, set(), threshold=1)
    assert first is not None
    one = await queue.enqueue("ann", "m", first, interval_seconds=0)
    (claimed,) = await queue.claim(5, exclude_users=set())  # the first runs; the next must wait
    later = [*turns, turn("user", "I have a cat"), turn("assistant", "ok")]
    second = exchange(later, set(first.fingerprints), threshold=1)
    third = exchange(
        [*later, turn("user", "I run")], set(first.fingerprints + second.fingerprints), threshold=1
    )  # type: ignore[union-attr]
    assert second is not None and third is not None
    two = await queue.enqueue("ann", "m", second, interval_seconds=3600)
    three = await queue.enqueue("ann", "m", third, interval_seconds=3600)
    assert claimed.id == one.job_id and two.job_id == three.job_id  # joined, due in an hour
    assert await queue.counts() == {"awaiting": 0, "queued": 1, "running": 1, "failed": 0}
    assert (
        await queue.claim(5, exclude_users=set()) == []
    )  # ann has one running; the next is not due
    explicit = exchange([*later, turn("user", "I run"), turn("assistant", "ok"), turn("user", "Remember that I'm vegan")],
                        set(first.fingerprints + second.fingerprints + third.fingerprints), threshold=1)  # fmt: skip
    assert explicit is not None and explicit.explicit
    merged = await queue.enqueue("ann", "m", explicit, interval_seconds=3600)
    assert merged.job_id != two.job_id and await queue.counts() == {
        "awaiting": 0,
        "queued": 1,
        "running": 1,
        "failed": 0,
    }
    async with store.writing("ann", MemorySource.MANAGER, job_id=claimed.id) as w:
        assert await queue.consume(w, claimed.id)  # the first job is applied
    (due,) = await queue.claim(5, exclude_users=set())
    _, new = due.turns()
    assert [text for _, text in said(new) if text != "ok"] == [
        "I have a cat",
        "I run",
        "Remember that I'm vegan",
    ]


async def test_a_full_queue_drops_the_oldest_routine_jobs_never_explicit(
    engine: AsyncEngine,
) -> None:
    queue = JobQueue(MemoryStore(engine).sessions, limit=2)
    explicit = exchange([turn("user", "Remember that I'm vegan")], set(), threshold=1)
    assert explicit is not None
    await queue.enqueue("u0", "m", explicit, interval_seconds=0)
    dropped = 0
    for i in range(1, 4):
        routine = exchange([turn("user", f"I have {i} cats")], set(), threshold=1)
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
    ((_job_id, user, reason, _answer),) = await queue.failed()
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
    with pytest.raises(JobGone):
        await Applier(service).apply(
            "ann", [Operation(op=Op.NEW, content="Lives in Oslo")], {}, job_id="gone", queue=queue
        )
    assert await memories(client) == []


@pytest.mark.parametrize("death", ["stop", "kill"])
async def test_a_process_ending_mid_job_loses_nothing_and_the_job_applies_once(
    make_client: AppClientFactory, upstream_ok: respx.Route, death: str
) -> None:
    """The process ends while the Manager is thinking: stopped, it hands the job back at once;
    killed (no renewals, nothing handed back), the job stays running until its lease runs out
    and then another process takes it up. Either way the job is applied once."""
    started = asyncio.Event()

    async def stuck(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        started.set()
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")

    # Killed, the job waits out its lease: 3 s, so that the second process's start (which warms
    # its Manager up) on a loaded machine stays well inside it when the lease is checked.
    lease = 1 if death == "stop" else 3
    first = await manager_client(make_client, stuck, manager_lease_seconds=lease)
    await first.post(
        "/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "I live in Oslo"}]},
        headers=ANN,
    )
    await asyncio.wait_for(started.wait(), 10)
    worker = services(first).worker
    await (worker.stop() if death == "stop" else kill(worker))  # nothing was committed
    queue: JobQueue = services(first).jobs
    held = {"awaiting": 0, "queued": 0, "running": 1, "failed": 0}
    back = {"awaiting": 0, "queued": 1, "running": 0, "failed": 0}
    assert await queue.counts() == (back if death == "stop" else held)

    manager = Remembering()
    # A new process on the same database: it runs nothing a live process holds.
    second = await manager_client(make_client, manager, manager_lease_seconds=lease)
    if death == "kill":
        await asyncio.sleep(0.3)
        assert manager.seen == [] and await queue.counts() == held  # the lease still runs
    await until(lambda: equals(memories(second), ["Lives in Oslo"]))
    await until(lambda: no_jobs(second))
    await asyncio.sleep(0.2)
    assert manager.seen == [["I live in Oslo"]] and await memories(second) == ["Lives in Oslo"]


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


async def test_turns_of_another_day_never_join_a_waiting_job(engine: AsyncEngine) -> None:
    """A job has one date (its memories' observed_at, the Manager's "today"): a routine job
    still queued since yesterday (its Manager down, retrying) does not take today's turns."""
    sessions = MemoryStore(engine).sessions
    queue = JobQueue(sessions, limit=100)
    turns: list[ModelMessage] = [turn("user", "I fly to Rome tomorrow"), turn("assistant", "ok")]
    first = exchange(turns, set(), threshold=1)
    assert first is not None
    yesterday = await queue.enqueue("ann", "m", first, interval_seconds=3600)
    assert yesterday is not None
    async with writing(sessions) as session:
        job = (
            await session.scalars(select(ManagerJob).where(ManagerJob.id == yesterday.job_id))
        ).one()
        job.created_at = job.created_at - timedelta(days=1)
    turns += [turn("user", "I land at 9"), turn("assistant", "ok")]
    second = exchange(turns, set(first.fingerprints), threshold=1)
    assert second is not None
    today = await queue.enqueue("ann", "m", second, interval_seconds=3600)
    assert today is not None and today.job_id != yesterday.job_id
    # the same day, the turns join as before
    turns += [turn("user", "I stay two nights"), turn("assistant", "ok")]
    third = exchange(turns, {*first.fingerprints, *second.fingerprints}, threshold=1)
    assert third is not None
    later = await queue.enqueue("ann", "m", third, interval_seconds=3600)
    assert later is not None and later.job_id == today.job_id


async def test_an_answer_arriving_after_midnight_keeps_its_turns_day(engine: AsyncEngine) -> None:
    """The turns said yesterday whose answer arrives today do not join today's waiting job."""
    sessions = MemoryStore(engine).sessions
    queue = JobQueue(sessions, limit=100)
    first = exchange([turn("user", "I fly to Rome tomorrow")], set(), threshold=1)
    assert first is not None
    late = await queue.enqueue("ann", "m", first, interval_seconds=3600, awaiting=True)
    assert late is not None
    async with writing(sessions) as session:
        job = (await session.scalars(select(ManagerJob).where(ManagerJob.id == late.job_id))).one()
        job.created_at = job.created_at - timedelta(days=1)
    second = exchange([turn("user", "I land at 9"), turn("assistant", "ok")], set(), threshold=1)
    assert second is not None
    assert await queue.enqueue("ann", "m", second, interval_seconds=3600) is not None
    await queue.complete(late.job_id, "ok", interval_seconds=3600)
    assert (await queue.counts())["queued"] == 2


async def test_a_jobs_turns_are_those_no_other_job_took_across_insert_batches(
    engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The database decides which turns are a job's, a batch of fingerprints at a time (one
    statement given many rows): two requests of one conversation that each saw no job take
    each turn once, whichever batch holds it."""
    monkeypatch.setattr(jobs, "INSERT_BATCH", 3)
    store = MemoryStore(engine)
    queue = JobQueue(store.sessions, limit=100)
    turns = [turn("user" if i % 2 == 0 else "assistant", f"turn {i}") for i in range(14)]
    first = exchange(turns[:8], set(), threshold=1)
    longer = exchange(turns, set(), threshold=1)  # as if the first were not written yet
    assert first is not None and longer is not None
    assert set(first.fingerprints) < set(longer.fingerprints) and len(longer.fingerprints) > 6
    # awaiting their answers, as chats queue them: two jobs, not one merged
    one = await queue.enqueue("ann", "m", first, interval_seconds=3600, awaiting=True)
    two = await queue.enqueue("ann", "m", longer, interval_seconds=3600, awaiting=True)
    assert one is not None and two is not None and one.job_id != two.job_id
    assert await queue.enqueue("ann", "m", longer, interval_seconds=3600) is None  # all taken
    async with store.sessions() as session:
        rows = await session.execute(select(ProcessedTurn.fingerprint, ProcessedTurn.job_id))
        owners = {f: j for f, j in rows.tuples()}
        payloads = [j.payload for j in await session.scalars(select(ManagerJob))]
    assert {f for f, j in owners.items() if j == one.job_id} == set(first.fingerprints)
    assert {f for f, j in owners.items() if j == two.job_id} == (
        set(longer.fingerprints) - set(first.fingerprints)
    )
    assert all("fingerprints" not in p for p in payloads)  # the rows say it, not the job
    assert await queue.processed("ann", longer.fingerprints) == set(longer.fingerprints)


async def test_a_withdrawn_job_frees_its_turns_by_its_id_in_one_statement(
    engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first job of a long conversation takes every turn; withdrawn, it frees them by its
    id, one statement however many (asyncpg refuses over 32,767 parameters), and only its own:
    another job's turns and the turns history marks stay taken."""
    monkeypatch.setattr(jobs, "INSERT_BATCH", 7)
    monkeypatch.setattr(jobs, "SQL_BATCH", 3)  # what a list of its turns would be cut by
    store = MemoryStore(engine)
    queue = JobQueue(store.sessions, limit=100)
    turns = [turn("user" if i % 2 == 0 else "assistant", f"turn {i}") for i in range(240)]
    other = exchange([turn("user", "another chat")], set(), threshold=1)
    found = exchange(turns, set(), threshold=1)
    assert other is not None and found is not None and len(found.fingerprints) == 120
    kept = await queue.enqueue("ann", "m", other, interval_seconds=3600, awaiting=True)
    queued = await queue.enqueue("ann", "m", found, interval_seconds=3600, awaiting=True)
    assert kept is not None and queued is not None
    async with writing(store.sessions) as session:  # as history marks a turn: no job named
        await session.execute(insert(ProcessedTurn).values(
            user_id="ann", fingerprint="h" * 64, created_at=now(), job_id=None))  # fmt: skip
    assert await queue.processed("ann", found.fingerprints) == set(found.fingerprints)
    statements: list[str] = []

    def count(_c: Any, _cur: Any, statement: str, *_: Any) -> None:
        if statement.lstrip().upper().startswith("DELETE FROM PROCESSED_TURNS"):
            statements.append(statement)

    event.listen(engine.sync_engine, "before_cursor_execute", count)
    try:
        await queue.withdraw(queued.job_id)
    finally:
        event.remove(engine.sync_engine, "before_cursor_execute", count)
    assert len(statements) == 1 and "job_id" in statements[0]
    assert await queue.processed("ann", found.fingerprints) == set()  # every turn free again
    taken = [*other.fingerprints, "h" * 64]
    assert await queue.processed("ann", taken) == set(taken)
