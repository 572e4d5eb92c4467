"""Past conversations as Manager jobs (app/memory/learning/history/plan.py, queue.py): cut by day
and size, dated when said, queued a conversation at a time (all of it or nothing), idempotent on
resend and resumable; run after the chats' jobs, never dropped for the queue's limit, never merged
with a chat's."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic_ai.messages import ModelRequest
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

import app.memory.learning.history.queue as history_queue
from app.memory.learning.extraction import CONTEXT_TURNS, exchange
from app.memory.learning.history.plan import JOB_TURNS, fingerprints, plan
from app.memory.learning.history.queue import HistoryQueue, run_id
from app.memory.learning.history.read import read_export
from app.memory.learning.job_kinds import HISTORY_JOB
from app.memory.learning.jobs import JobQueue
from app.memory.learning.turns import Role, dump, fingerprints_of, load, text_of, turn
from app.memory.store.memories import MemoryStore
from app.memory.store.tables import ManagerJob, ProcessedTurn
from tests.memory.learning.exports import MAY_1, dumped, gpt_linear, owui_linear

DAY = 24 * 3600


def chat(n: int, *, start: int = MAY_1, step: int = 60, title: str = "Chat") -> dict[str, Any]:
    """A chat of n exchanges: "fact i" and "ok i" (after the title but in the first chat)."""
    lead = "" if title == "Chat" else f"{title}: "
    said = [(r, f"{lead}{w} {i}") for i in range(n)
            for r, w in (("user", "fact"), ("assistant", "ok"))]  # fmt: skip
    return owui_linear(title, said, start=start, step=step)


def planned(raw: bytes, taken: set[str] | None = None) -> list[Any]:
    (conversation,) = read_export(raw).conversations
    marks = fingerprints(conversation)
    return plan(conversation, marks, {m for m in marks if m} if taken is None else taken)


def test_a_long_conversation_is_cut_into_jobs_of_the_worker_s_size() -> None:
    pieces = planned(dumped(chat(25)))  # 50 turns on one day
    assert [len(p.new) for p in pieces] == [JOB_TURNS, JOB_TURNS, 10]
    for piece in pieces:
        assert isinstance(piece.new[0], ModelRequest)  # from a user turn, answers with it
        assert len(piece.fingerprints) == len(piece.new) // 2
    assert [text_of(t) for t in pieces[1].context] == [text_of(t) for t in pieces[0].new][-6:]
    assert len(pieces[1].context) == CONTEXT_TURNS and not pieces[0].context


def test_a_conversation_over_days_is_a_job_a_day_dated_by_its_last_words() -> None:
    raw = dumped(owui_linear("Days", [
        ("user", "I moved to Oslo yesterday"), ("assistant", "Welcome"),
        ("user", "My sister visits tomorrow"), ("assistant", "Nice"),
    ], start=MAY_1, step=DAY // 2))  # fmt: skip
    first, second = planned(raw)
    assert [text_of(t) for t in first.new] == ["I moved to Oslo yesterday", "Welcome"]
    assert first.said_at == datetime(2024, 5, 1, 9, 30, tzinfo=UTC)
    assert [text_of(t) for t in second.new] == ["My sister visits tomorrow", "Nice"]
    assert second.said_at == datetime(2024, 5, 2, 9, 30, tzinfo=UTC)
    assert [text_of(t) for t in second.context] == ["I moved to Oslo yesterday", "Welcome"]
    # each turn keeps its own time
    assert [t.timestamp for t in second.new] == [
        datetime(2024, 5, 2, 9, 30, tzinfo=UTC),
        datetime(2024, 5, 2, 21, 30, tzinfo=UTC),
    ]


def test_only_the_turns_not_taken_are_planned_with_the_rest_as_context() -> None:
    raw = dumped(chat(5))
    (conversation,) = read_export(raw).conversations
    marks = fingerprints(conversation)
    users = [m for m in marks if m]
    (piece,) = plan(conversation, marks, set(users[3:]))  # a chat continued after an export
    assert [text_of(t) for t in piece.new] == ["fact 3", "ok 3", "fact 4", "ok 4"]
    assert len(piece.context) == CONTEXT_TURNS and piece.fingerprints == sorted(users[3:])
    assert planned(raw, set()) == []


def test_a_user_turn_fingerprint_is_a_chat_s() -> None:
    """So what a chat through memproxy already learned from is not learned from again."""
    raw = dumped(chat(3))
    (conversation,) = read_export(raw).conversations
    turns = [turn(s.role, s.text) for s in conversation.said]
    found = exchange(turns, set(), threshold=1)
    assert found is not None
    assert sorted(found.fingerprints) == sorted(m for m in fingerprints(conversation) if m)


def test_explicit_requests_and_long_turns() -> None:
    (piece,) = planned(dumped(owui_linear("Ask", [
        ("user", "Please remember that I am allergic to nuts " + "x" * 20000),
    ])))  # fmt: skip
    assert piece.explicit
    assert "characters left out" in text_of(piece.new[0])


async def test_learning_queues_each_conversation_once(engine: AsyncEngine) -> None:
    sessions = MemoryStore(engine).sessions
    history = HistoryQueue(sessions)
    raw = dumped(
        chat(25, title="Long"),
        owui_linear("Empty", []),
        chat(2, start=MAY_1 + DAY, title="Short"),
        owui_linear("Greeting", [("assistant", "Hello!")]),
    )
    export = read_export(raw)
    run = run_id("ann", raw)
    learned = await history.learn("ann", export, run=run, model="m")
    assert (learned.conversations, learned.messages, learned.queued, learned.jobs,
            learned.already, learned.skipped) == (4, 55, 2, 4, 0, 2)  # fmt: skip
    assert await history.progress("ann", run) == {"queued": 4, "running": 0, "failed": 0,
                                                  "pending": 4}  # fmt: skip
    async with sessions() as session:
        jobs = list(await session.scalars(select(ManagerJob).order_by(ManagerJob.key)))
    assert all(j.id.startswith(f"{HISTORY_JOB}{run}-") and len(j.id) <= 36 for j in jobs)
    assert [j.payload["said_at"] for j in jobs] == [  # each job's last user turn
        "2024-05-01T09:48:00+00:00", "2024-05-01T10:08:00+00:00", "2024-05-01T10:18:00+00:00",
        "2024-05-02T09:32:00+00:00",
    ]  # fmt: skip
    assert [j.payload["model"] for j in jobs] == ["m"] * 4
    # sent again: nothing new
    again = await history.learn("ann", export, run=run, model="m")
    assert (again.queued, again.jobs, again.already, again.skipped) == (0, 0, 2, 2)
    assert (await history.progress("ann", run))["pending"] == 4
    # another user's: their own
    assert (await history.learn("bob", export, run=run_id("bob", raw), model="m")).jobs == 4


async def test_a_learn_cut_off_goes_on_where_it_stopped(
    engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A conversation is written whole or not at all: here the second one's jobs fail to be
    written after its turns were recorded as taken; run again, the learn queues the rest."""
    sessions = MemoryStore(engine).sessions
    history = HistoryQueue(sessions)
    raw = dumped(chat(3, title="One"), chat(30, title="Two"), chat(2, title="Three"))
    export = read_export(raw)
    made = history_queue._row
    rows: list[dict[str, Any]] = []

    def clashing(*args: Any) -> dict[str, Any]:  # the second conversation's second job
        rows.append(made(*args))
        if len(rows) == 3:
            rows[-1]["id"] = rows[-2]["id"]
        return rows[-1]

    monkeypatch.setattr(history_queue, "BATCH_CONVERSATIONS", 1)  # a transaction each
    monkeypatch.setattr(history_queue, "_row", clashing)
    with pytest.raises(IntegrityError):
        await history.learn("ann", export, run="r", model="m")
    monkeypatch.setattr(history_queue, "_row", made)
    async with sessions() as session:
        kept = await session.scalar(select(func.count()).select_from(ProcessedTurn))
        jobs = await session.scalar(select(func.count()).select_from(ManagerJob))
    assert (kept, jobs) == (3, 1)  # the first conversation whole, nothing of the second
    learned = await history.learn("ann", export, run="r", model="m")
    assert (learned.already, learned.queued, learned.jobs) == (1, 2, 3 + 1)
    async with sessions() as session:
        kept = await session.scalar(select(func.count()).select_from(ProcessedTurn))
    assert kept == 3 + 30 + 2


async def test_chats_jobs_run_first_and_are_never_merged_into_a_history_job(
    engine: AsyncEngine,
) -> None:
    sessions = MemoryStore(engine).sessions
    queue = JobQueue(sessions, limit=100)
    export = read_export(dumped(chat(25)))
    await HistoryQueue(sessions).learn("ann", export, run="r", model="m")
    found = exchange([turn("user", "I live in Oslo"), turn("assistant", "ok")], set(),
                     threshold=1)  # fmt: skip
    assert found is not None
    chat_job = await queue.enqueue("ann", "m", found, interval_seconds=0)
    assert chat_job is not None
    other = exchange([turn("user", "I am Bob"), turn("assistant", "hi")], set(), threshold=1)
    assert other is not None
    bob_job = await queue.enqueue("bob", "m", other, interval_seconds=0)
    assert bob_job is not None
    assert (await queue.counts())["queued"] == 3 + 2  # the chat's own jobs
    (first,) = await queue.claim(1, exclude_users=set())
    assert first.id == chat_job.job_id  # queued after ann's history, run before it
    (second,) = await queue.claim(1, exclude_users=set())
    assert second.id == bob_job.job_id  # ann has a job running; bob's chat before any history
    assert await queue.claim(1, exclude_users=set()) == []  # one job of a user at a time
    async with queue._sessions() as session, session.begin():
        for job in (first, second):
            await session.delete(await session.scalar(
                select(ManagerJob).where(ManagerJob.id == job.id)
            ))  # fmt: skip
    (third,) = await queue.claim(1, exclude_users=set())
    assert third.id.startswith(HISTORY_JOB)
    assert third.created_at == datetime(2024, 5, 1, 9, 48, tzinfo=UTC)  # said then
    _, new = third.turns()
    assert text_of(new[0]) == "fact 0"


async def test_history_jobs_neither_count_nor_are_dropped_for_the_queue_limit(
    engine: AsyncEngine,
) -> None:
    sessions = MemoryStore(engine).sessions
    queue = JobQueue(sessions, limit=1)
    await HistoryQueue(sessions).learn("ann", read_export(dumped(chat(45))), run="r", model="m")
    for user in ("bob", "carl"):
        found = exchange([turn("user", f"I am {user}")], set(), threshold=1)
        assert found is not None
        queued = await queue.enqueue(user, "m", found, interval_seconds=0)
        assert queued is not None
        assert queued.dropped == (user == "carl")  # bob's, at the limit of chats' jobs
    assert (await queue.counts())["queued"] == 5 + 1


async def test_a_chat_turn_learned_from_an_export_is_not_queued_again(engine: AsyncEngine) -> None:
    sessions = MemoryStore(engine).sessions
    queue = JobQueue(sessions, limit=100)
    raw = dumped(gpt_linear("Chess", [("user", "I play chess"), ("assistant", "Fun")]))
    await HistoryQueue(sessions).learn("ann", read_export(raw), run="r", model="m")
    turns = [turn("user", "I play chess"), turn("assistant", "Fun"), turn("user", "and go")]
    processed = await queue.processed("ann", [f for _, f in fingerprints_of(turns)])
    found = exchange(turns, processed, threshold=1)
    assert found is not None
    assert [text_of(t) for t in found.new] == ["and go"]  # only the new turn


def test_a_history_job_s_turns_load_with_their_times() -> None:
    (piece,) = planned(dumped(chat(1)))
    loaded = load(dump(piece.new))
    assert [m.timestamp for m in loaded] == [t.timestamp for t in piece.new]


async def test_a_turn_said_in_two_conversations_of_a_file_is_queued_once(
    engine: AsyncEngine,
) -> None:
    sessions = MemoryStore(engine).sessions
    raw = dumped(
        owui_linear("A", [("user", "hi"), ("assistant", "Hello!"), ("user", "I am Ann")]),
        owui_linear("B", [("user", "hi"), ("assistant", "Hello!"), ("user", "I like tea")]),
    )
    learned = await HistoryQueue(sessions).learn("ann", read_export(raw), run="r", model="m")
    assert (learned.queued, learned.jobs) == (2, 2)
    async with sessions() as session:
        jobs = list(await session.scalars(select(ManagerJob).order_by(ManagerJob.key)))
    news = [[text_of(t) for t in load(j.payload["new"])] for j in jobs]
    assert news == [["hi", "Hello!", "I am Ann"], ["I like tea"]]
    assert [text_of(t) for t in load(jobs[1].payload["context"])] == ["hi", "Hello!"]


async def test_turns_a_chat_takes_while_a_learn_plans_are_the_chat_s(
    engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    sessions = MemoryStore(engine).sessions
    history = HistoryQueue(sessions)
    said: list[tuple[Role, str]] = [("user", "I play chess"), ("assistant", "Fun"),
                                    ("user", "and go")]  # fmt: skip
    export = read_export(dumped(owui_linear("Games", list(said))))
    found = exchange([turn(r, t) for r, t in said[:2]], set(), threshold=1)
    assert found is not None

    async def stale(user_id: str, marks: list[str]) -> set[str]:  # read before the chat wrote
        await JobQueue(sessions).enqueue("ann", "m", found, interval_seconds=0)
        return set()

    monkeypatch.setattr(history._queue, "processed", stale)
    learned = await history.learn("ann", export, run="r", model="m")
    assert (learned.queued, learned.jobs) == (1, 1)
    async with sessions() as session:
        (job,) = await session.scalars(select(ManagerJob).where(ManagerJob.id.like("learn-%")))
    assert [text_of(t) for t in load(job.payload["new"])] == ["and go"]
    assert [text_of(t) for t in load(job.payload["context"])] == ["I play chess", "Fun"]
