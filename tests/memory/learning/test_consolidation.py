"""Consolidation at idle time (issue 27, point 2): near copies merge into the one said last
without a model; the model merges facts that say the same (only in the facts' words, only
facts alike) and supersedes those a newer fact shows no longer true; what leaves goes to the
archive with its cause, an event naming the fact that holds it, its provenance handed on, and
can be put back; pinned facts stay; a bound stops the run where the next one goes on."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse
from pydantic_ai.models.function import AgentInfo, FunctionModel
from sqlalchemy import delete, select, update
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker

from app.memory.aging.forgetting import Forgetting
from app.memory.learning import consolidation
from app.memory.learning.applier import JobGone
from app.memory.learning.consolidation import Consolidation
from app.memory.learning.idle import IdleWork
from app.memory.learning.jobs import JobQueue
from app.memory.learning.manager import Manager
from app.memory.learning.tidy_checks import same_details
from app.memory.search.parts import embed_for_store
from app.memory.service import MemoryService
from app.memory.store.memories import MemoryStore
from app.memory.store.records import NewMemory
from app.memory.store.tables import (
    ManagerJob,
    ManagerState,
    MemoryEvent,
    MemoryLink,
    MemorySource,
    MemoryType,
)
from app.memory.store.upkeep import merge, supersede
from app.metrics import Metrics
from tests.conftest import make_settings
from tests.fakes import FakeEmbedder, decided
from tests.memory.learning.support import until
from tests.memory.learning.test_idle_jobs import chat_job, idle_jobs, queue_of, worker_for

DAY = datetime(2026, 3, 1, tzinfo=UTC)


class Tidier:
    """The model: answers each group by the first rule whose words are all in its prompt."""

    def __init__(self, rules: list[tuple[tuple[str, ...], dict[str, Any]]]) -> None:
        self.rules = rules
        self.prompts: list[str] = []

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        request = next(m for m in messages if isinstance(m, ModelRequest))
        prompt = str(request.parts[-1].content)  # type: ignore[union-attr]
        assert (info.instructions or "").startswith(consolidation.INSTRUCTIONS[:40])
        self.prompts.append(prompt)
        for words, answer in self.rules:
            if all(w in prompt for w in words):
                return decided(info, answer)
        return decided(info, {"same": [], "memory": "", "outdated": []})


def tidying(engine: AsyncEngine, rules: Any = (), **options: Any) -> tuple[Consolidation, Tidier]:
    settings = make_settings(consolidation_cosine=0.3, **options)
    tidier = Tidier(list(rules))
    manager = Manager(settings, http_client=httpx.AsyncClient(), model=FunctionModel(tidier))
    service = MemoryService(MemoryStore(engine), FakeEmbedder())
    return Consolidation(service, manager, settings), tidier


async def add(service: MemoryService, user: str, *said: tuple[str, int]) -> list[str]:
    written = await service.add(
        user, [NewMemory(text, observed_at=DAY + timedelta(days=d)) for text, d in said]
    )
    return [r.id for r in written.records]


async def events(engine: AsyncEngine, user: str, action: str) -> list[tuple[str, str | None]]:
    async with async_sessionmaker(engine)() as session:
        rows = await session.execute(
            select(MemoryEvent.memory_id, MemoryEvent.detail)
            .where(MemoryEvent.user_id == user, MemoryEvent.action == action)
        )  # fmt: skip
        return [(a, b) for a, b in rows]


async def jobs(queue: JobQueue) -> list[str]:
    """Every job in the queue, of any kind."""
    async with queue._sessions() as session:
        return list(await session.scalars(select(ManagerJob.id)))


async def contents(service: MemoryService, user: str) -> list[str]:
    return sorted(r.content for r in (await service.page(user, limit=100, offset=0))[0])


async def test_near_copies_merge_into_the_one_said_last_without_a_model(
    engine: AsyncEngine,
) -> None:
    tidy, tidier = tidying(engine)
    service = tidy._service
    older, other = await add(service, "ann", ("Lives in Oslo, Norway.", 0), ("Plays chess.", 0))
    episode = await service.add("ann", [NewMemory("I moved to Oslo", type=MemoryType.EPISODE)])
    async with service.store.writing("ann", MemorySource.API) as w:
        w.link(older, episode.records[0].id)
    (newer,) = await add(service, "ann", ("Lives in Oslo Norway", 5))
    done = await tidy.run("ann", since=0, model="", job_id="idle-test")
    assert (done.merged, done.superseded, done.asked) == (1, 0, 0)
    assert tidier.prompts == []  # no model was named: only the copies merge
    assert await contents(service, "ann") == ["I moved to Oslo", "Lives in Oslo Norway",
                                              "Plays chess."]  # fmt: skip
    assert await events(engine, "ann", "merged") == [(older, f"merged into {newer}: "
                                                      "Lives in Oslo Norway")]  # fmt: skip
    (gone,), _ = await service.store.forgotten("ann", limit=10)
    assert (gone.id, gone.cause, gone.links) == (older, "merged", [episode.records[0].id])
    async with async_sessionmaker(engine)() as session:
        links = list(await session.execute(select(MemoryLink.fact_id, MemoryLink.episode_id)))
    assert [tuple(x) for x in links] == [(newer, episode.records[0].id)]  # provenance follows
    again = await tidy.run("ann", since=0, model="m", job_id="idle-again")
    assert (again.merged, again.superseded) == (0, 0)
    assert other in {r.id for r in (await service.page("ann", limit=10, offset=0))[0]}


@pytest.mark.parametrize("second", [
    "Has a dentist appointment at the clinic on the main street on May 10.",  # another day
    "Has a dentist appointment at the clinic on the main street on June 3.",  # another month
])  # fmt: skip
async def test_near_copies_that_name_other_numbers_or_names_are_two_facts(
    engine: AsyncEngine, second: str
) -> None:
    """Alike enough to merge by their vectors alone, but not the same: they go to the model,
    and with none they both stay (the soak's "keeps profile thing 0" and "... thing 1" were
    merged, two of a user's profile facts gone)."""
    tidy, tidier = tidying(engine)
    first = "Has a dentist appointment at the clinic on the main street on May 3."
    vectors = FakeEmbedder()
    assert float(vectors.vector(first) @ vectors.vector(second)) >= 0.9  # a copy by the cosine
    await add(service := tidy._service, "ann", (first, 0), (second, 1))
    done = await tidy.run("ann", since=0, model="", job_id="idle-test")
    assert (done.merged, done.asked) == (0, 0)
    assert await contents(service, "ann") == sorted([first, second])
    asked = await tidy.run("ann", since=0, model="m", job_id="idle-again")
    assert (asked.merged, asked.asked) == (0, 1) and len(tidier.prompts) == 1


@pytest.mark.parametrize(("a", "b"), [
    ("Lives in Oslo, Norway.", "Lives in Oslo Norway"),
    ("The user has 2 kids.", "Has 2 kids."),
    ("Moved house. Likes it.", "Moved house. likes it"),
    ("Lives in New York", "Lives in new york"),
    ("Went hiking with Tom", "went hiking with tom"),
    ("Walks Anna's dog", "Walks Anna\u2019s dog"),
    ("Owes $1,000 to the bank", "Owes $1000 to the bank"),
    ("Came 3rd in the race", "Came third in the race"),
    ("User's favourite colour is blue", "Favourite colour is blue"),
])  # fmt: skip
def test_near_copies_name_the_same_numbers_and_names(a: str, b: str) -> None:
    assert same_details(a, b) and same_details(b, a)


@pytest.mark.parametrize(("a", "b"), [
    ("soak-01 keeps profile thing 0", "soak-01 keeps profile thing 1"),
    ("Lives in Oslo.", "Lives in Bergen."),
    ("Anna's birthday is on 3 May.", "Bob's birthday is on 3 May."),
    ("Caroline: went to the park", "Melanie: went to the park"),
    ("Sees Dr. Smith on Monday", "Sees Dr. Jones on Monday"),
    ('Loves the book "Dune"', 'Loves the book "Emma"'),
    ("Has two cats", "Has three cats"),
])  # fmt: skip
def test_facts_that_name_other_numbers_or_names_are_not_near_copies(a: str, b: str) -> None:
    assert not same_details(a, b) and not same_details(b, a)


@pytest.mark.parametrize(("said", "merged"), [
    (("Has a dentist appointment on May 3.", "Has a dentist appointment on May 10."),
     "Has a dentist appointment on May 10."),
    (("Anna's birthday is on 3 May.", "Bob's birthday is on 3 May."),
     "Bob's birthday is on 3 May."),
])  # fmt: skip
async def test_a_merge_that_drops_a_number_or_a_name_is_refused(
    engine: AsyncEngine, said: tuple[str, str], merged: str
) -> None:
    """Alike, grounded, most words kept: all the other checks pass."""
    tidy, tidier = tidying(engine, [((), {"same": [1, 2], "memory": merged, "outdated": []})])
    await add(tidy._service, "ann", (said[0], 0), (said[1], 1))
    done = await tidy.run("ann", since=0, model="m", job_id="idle-test")
    assert done.merged == 0 and done.refused == done.asked == len(tidier.prompts) == 1
    assert await contents(tidy._service, "ann") == sorted(said)


async def test_the_model_merges_what_says_the_same_and_supersedes_what_ended(
    engine: AsyncEngine,
) -> None:
    tidy, tidier = tidying(engine, [
        (("dog", "beagle"), {"same": [1, 2], "memory": "Has a beagle dog named Max.",
                             "outdated": []}),
        (("Lyon", "Paris"), {"same": [], "memory": "", "outdated": [1]}),
    ])  # fmt: skip
    service = tidy._service
    dog, lyon = await add(service, "ann", ("Has a dog named Max.", 0),
                          ("The user lives in Lyon.", 1))  # fmt: skip
    beagle, paris = await add(service, "ann", ("Has a dog named Max, a beagle.", 20),
                              ("The user moved to Paris.", 30))  # fmt: skip
    done = await tidy.run("ann", since=0, model="m", job_id="idle-test")
    assert (done.merged, done.superseded) == (1, 1)
    assert await contents(service, "ann") == ["Has a beagle dog named Max.",
                                              "The user moved to Paris."]  # fmt: skip
    assert any(p.startswith("[1] (01 March 2026) Has a dog named Max.") for p in tidier.prompts)
    merged = await service.get("ann", beagle)  # the one said last holds them
    assert merged is not None and merged.content == "Has a beagle dog named Max."
    assert await events(engine, "ann", "superseded") == [
        (lyon, f"no longer true since 2026-03-31: The user moved to Paris. ({paris})")
    ]
    archived = {m.id: m for m in (await service.store.forgotten("ann", limit=10))[0]}
    assert archived[lyon].cause == "superseded"
    assert archived[lyon].ended_at == DAY + timedelta(days=30)
    assert archived[dog].cause == "merged"
    # put back from the archive, same id, recalled again
    forgetting = Forgetting(service, Forgetting.configured(service, make_settings()).capacities)
    await forgetting.restore("ann", lyon)
    assert "The user lives in Lyon." in await contents(service, "ann")


@pytest.mark.parametrize(
    "answer",
    [
        {"same": [1, 2], "memory": "Has a beagle and a cat named Rex.", "outdated": []},
        {"same": [1, 2], "memory": "", "outdated": []},
        {"same": [2, 7], "memory": "Has a beagle dog named Max.", "outdated": [9, 0]},
        {"same": [1, 2], "memory": "Has a dog.", "outdated": []},  # drops what they said
        {"same": [], "memory": "", "outdated": [1]},  # the newer says nothing changed
    ],
    ids=["new-words", "no-memory", "unknown-numbers", "lossy", "no-change-told"],
)
async def test_an_answer_the_checks_refuse_changes_nothing(
    engine: AsyncEngine, answer: dict[str, Any]
) -> None:
    tidy, _ = tidying(engine, [(("dog",), answer)])
    service = tidy._service
    await add(service, "ann", ("Has a dog named Max.", 0), ("Has a dog named Max, a beagle.", 20))
    done = await tidy.run("ann", since=0, model="m", job_id="idle-test")
    assert (done.merged, done.superseded) == (0, 0)
    assert await contents(service, "ann") == ["Has a dog named Max, a beagle.",
                                              "Has a dog named Max."]  # fmt: skip


async def test_pinned_facts_stay_and_keep_their_words(engine: AsyncEngine) -> None:
    tidy, _ = tidying(engine, [
        (("dog",), {"same": [1, 2], "memory": "Has a beagle dog named Max.", "outdated": []}),
        (("Lyon",), {"same": [], "memory": "", "outdated": [1]}),
    ])  # fmt: skip
    service = tidy._service
    await service.add("ann", [
        NewMemory("Has a dog named Max.", pinned=True, observed_at=DAY),
        NewMemory("The user lives in Lyon.", pinned=True, observed_at=DAY),
        NewMemory("Lives in Oslo, Norway.", pinned=True, observed_at=DAY),
    ])  # fmt: skip
    await add(service, "ann", ("Has a dog named Max, a beagle.", 9), ("The user moved to Paris.", 9),
              ("Lives in Oslo Norway", 9))  # fmt: skip
    done = await tidy.run("ann", since=0, model="m", job_id="idle-test")
    assert (done.merged, done.superseded) == (0, 0)
    assert len(await contents(service, "ann")) == 6


async def test_a_bound_stops_the_run_where_the_next_goes_on(
    engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(consolidation, "MAX_ASKED", 1)
    tidy, tidier = tidying(engine)
    service = tidy._service
    for day, tea in enumerate(("green", "black", "oolong")):  # three versions
        await add(service, "ann", (f"The user likes {tea} tea.", day))
    first = await tidy.run("ann", since=0, model="m", job_id="idle-1")
    assert first.asked == 1 and first.stopped_at is not None
    second = await tidy.run("ann", since=first.stopped_at, model="m", job_id="idle-2")
    assert second.asked == 1 and second.stopped_at is not None
    assert second.stopped_at > first.stopped_at
    assert len(tidier.prompts) == 2


async def test_an_unusable_answer_leaves_the_group_and_an_unreachable_model_stops_the_run(
    engine: AsyncEngine,
) -> None:
    settings = make_settings(consolidation_cosine=0.3, manager_max_retries=0)
    asked: list[str] = []

    def babble(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        asked.append("x")
        return decided(info, {"same": "everything"})

    manager = Manager(settings, http_client=httpx.AsyncClient(), model=FunctionModel(babble))
    service = MemoryService(MemoryStore(engine), FakeEmbedder())
    tidy = Consolidation(service, manager, settings)
    await add(service, "ann", ("The user likes green tea.", 0), ("The user likes black tea.", 1),
              ("Lives in Oslo, Norway.", 2), ("Lives in Oslo Norway", 3))  # fmt: skip
    done = await tidy.run("ann", since=0, model="m", job_id="idle-test")
    assert done.refused == done.asked > 0 and done.merged == 1  # the copies merged all the same

    def down(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        raise TimeoutError  # as the job's time bound ends a call: the model is unavailable

    tidy = Consolidation(service, Manager(settings, http_client=httpx.AsyncClient(),
                                          model=FunctionModel(down)), settings)  # fmt: skip
    await add(service, "bob", ("The user likes green tea.", 0), ("The user likes black tea.", 1),
              ("The user likes oolong tea.", 2))  # fmt: skip
    done = await tidy.run("bob", since=0, model="m", job_id="idle-test")
    assert done.asked == 1 and done.stopped_at == 0 and done.unreachable  # asked again later


@pytest.mark.parametrize("usable", [(), (3,)])
async def test_a_model_whose_answers_are_unusable_three_times_in_a_row_is_asked_no_more(
    engine: AsyncEngine, usable: tuple[int, ...]
) -> None:
    """The run goes through every fact all the same (near copies merge, nothing is left for
    the next idle job); one usable answer starts the count again."""
    settings = make_settings(consolidation_cosine=0.3, manager_max_retries=0)
    questions: dict[str, None] = {}

    def babble(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        request = next(m for m in messages if isinstance(m, ModelRequest))
        questions.setdefault(str(request.parts[-1].content))  # type: ignore[union-attr]
        if len(questions) in usable:
            return decided(info, {"same": [], "memory": "", "outdated": []})
        return decided(info, {"same": "everything"})

    manager = Manager(settings, http_client=httpx.AsyncClient(), model=FunctionModel(babble))
    service = MemoryService(MemoryStore(engine), FakeEmbedder())
    tidy = Consolidation(service, manager, settings)
    teas = "green black oolong white yellow herbal jasmine mint chai rooibos matcha sencha".split()
    await add(service, "ann", *((f"The user likes {t} tea.", d) for d, t in enumerate(teas)),
              ("Lives in Oslo, Norway.", 20), ("Lives in Oslo Norway", 21))  # fmt: skip
    done = await tidy.run("ann", since=0, model="m", job_id="idle-test")
    assert done.gave_up and done.stopped_at is None
    assert done.asked == len(questions) == max(usable, default=0) + 3
    assert done.refused == done.asked - len(usable)
    assert done.merged == 1  # the copies, after the model was given up
    assert "Lives in Oslo Norway" in await contents(service, "ann")


async def test_the_idle_job_asks_the_model_of_the_users_last_chat(engine: AsyncEngine) -> None:
    """End to end through the worker: the chat's model is recorded, the idle job names it, the
    model's merge is applied, and the job is done with nothing more due."""
    settings = make_settings(idle_seconds=0.05, manager_lease_seconds=0.6,
                             consolidation_cosine=0.3, manager_steps="one")  # fmt: skip
    tidier = Tidier([
        (("dog", "beagle"), {"same": [1, 2], "memory": "Has a beagle dog named Max.",
                             "outdated": []}),
    ])  # fmt: skip
    seen: list[str] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if (info.instructions or "").startswith(consolidation.INSTRUCTIONS[:40]):
            return tidier(messages, info)
        seen.append("chat")
        return decided(info, {"operations": []})

    from app.memory.learning.worker import Worker

    queue = queue_of(engine)
    service = MemoryService(MemoryStore(engine), FakeEmbedder())
    manager = Manager(settings, http_client=httpx.AsyncClient(), model=FunctionModel(model))
    await add(service, "ann", ("Has a dog named Max.", 0), ("Has a dog named Max, a beagle.", 20))
    await chat_job(queue, "ann")
    metrics = Metrics()
    worker = Worker(queue, service, manager, settings, metrics)
    await worker.start()
    try:

        async def merged() -> bool:
            held = await contents(service, "ann")
            return "Has a beagle dog named Max." in held and not await jobs(queue)

        await until(merged, seconds=20)
    finally:
        await worker.stop()
    assert "Has a dog named Max." not in await contents(service, "ann")
    assert seen == ["chat", "chat"]  # its words gave no fact: queued once more at idle time
    assert metrics.memories_consolidated.labels("merged")._value.get() == 1
    assert len(tidier.prompts) == 1  # the idle job asked: its payload named the chat's "m"


async def test_two_replicas_consolidating_at_once_merge_each_copy_once(
    engines: list[AsyncEngine],
) -> None:
    service = MemoryService(MemoryStore(engines[0]), FakeEmbedder())
    users = [f"user{i}" for i in range(5)]
    for user in users:
        for day, thing in enumerate(("chess", "tango", "sailing")):
            await add(service, user, (f"Plays {thing} on Sundays.", day),
                      (f"Plays {thing} on Sundays", day + 10))  # fmt: skip
    workers = [worker_for(e, Metrics(), manager_concurrency=3, consolidation=True)
               for e in engines]  # fmt: skip
    for worker in workers:
        await worker.start()
    try:

        async def settled() -> bool:
            held = [len(await contents(service, user)) for user in users]
            return held == [3] * len(users) and not await idle_jobs(queue_of(engines[0]))

        await until(settled, seconds=30)
    finally:
        for worker in workers:
            await worker.stop()
    for user in users:
        assert len(await events(engines[0], user, "merged")) == 3
        assert await contents(service, user) == [f"Plays {t} on Sundays"
                                                 for t in ("chess", "sailing", "tango")]  # fmt: skip
        assert len((await service.store.forgotten(user, limit=10))[0]) == 3


async def test_an_idle_job_another_process_took_up_consolidates_nothing(
    engines: list[AsyncEngine],
) -> None:
    a, b = queue_of(engines[0]), queue_of(engines[1])
    service = MemoryService(MemoryStore(engines[0]), FakeEmbedder())
    await add(service, "ann", ("Plays chess on Sundays.", 0), ("Plays chess on Sundays", 3))
    assert await a.queue_idle(0) == 1
    (job,) = await a.claim(1, exclude_users=set())
    await asyncio.sleep(0.9)  # A stops renewing: B takes the job up
    assert await b.expire() == 1
    (again,) = await b.claim(1, exclude_users=set())
    settings = make_settings()
    with pytest.raises(JobGone):
        await IdleWork(a, service, settings, Metrics()).run(job)
    assert len(await contents(service, "ann")) == 2
    done = await IdleWork(b, service, settings, Metrics()).run(again)
    assert done.tidied.merged == 1
    assert await contents(service, "ann") == ["Plays chess on Sundays"]


async def test_the_dates_tell_which_fact_ended_not_the_model(engine: AsyncEngine) -> None:
    """A small model flags either fact of a pair: the older one leaves, once the newer says
    that something changed."""
    tidy, _ = tidying(engine, [(("coffee",), {"same": [], "memory": "", "outdated": [2]})])
    service = tidy._service
    (morning,) = await add(service, "ann", ("Drinks coffee every morning.", 0))
    (quit,) = await add(service, "ann", ("Quit coffee last month.", 40))
    done = await tidy.run("ann", since=0, model="m", job_id="idle-test")
    assert done.superseded == 1
    assert await contents(service, "ann") == ["Quit coffee last month."]
    assert [m for m, _ in await events(engine, "ann", "superseded")] == [morning]
    assert quit


async def test_a_fact_changed_while_the_model_thought_is_left_as_it_is(engine: AsyncEngine) -> None:
    """The user edits the fact a merge would go into, between the read and the write."""
    tidy, _ = tidying(engine)
    service = tidy._service
    dog, beagle = await add(service, "ann", ("Has a dog named Max.", 0),
                            ("Has a dog named Max, a beagle.", 20))  # fmt: skip
    await service.update("ann", beagle, content="Has a dog named Max, a beagle, and a cat.")
    (embedded,) = await embed_for_store(service.embedder, ["Has a beagle dog named Max."])
    async with service.store.writing("ann", MemorySource.UPKEEP) as w:
        merged = await merge(w, beagle, [dog], "Has a beagle dog named Max.",
                             embedding=embedded.embedding, model=embedded.model,
                             read={dog: "Has a dog named Max.",
                                   beagle: "Has a dog named Max, a beagle."})  # fmt: skip
    assert merged is None
    async with service.store.writing("ann", MemorySource.UPKEEP) as w:
        assert not await supersede(w, dog, beagle, read={dog: "Has a dog named Max.",
                                                         beagle: "Has a dog."})  # fmt: skip
    assert len(await contents(service, "ann")) == 2


@pytest.mark.parametrize("down", [False, True], ids=["bound", "model-down"])
async def test_an_idle_job_stopped_early_records_where_the_next_goes_on(
    engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch, down: bool
) -> None:
    """The version recorded is where consolidation stopped; after a bound the next idle job
    comes at the next look, after a model that could not be reached only once the user's quiet
    time has passed again (it is not asked at every look)."""
    monkeypatch.setattr(consolidation, "MAX_ASKED", 1)
    queue = queue_of(engine)
    settings = make_settings(consolidation_cosine=0.3, idle_seconds=600)
    tidier = Tidier([])

    def unreachable(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        raise TimeoutError  # as a job's time bound ends a call: unavailable

    model = FunctionModel(unreachable if down else tidier)
    manager = Manager(settings, http_client=httpx.AsyncClient(), model=model)
    service = MemoryService(MemoryStore(engine), FakeEmbedder())
    for day, tea in enumerate(("green", "black", "oolong")):
        await add(service, "ann", (f"The user likes {tea} tea.", day))
    await chat_job(queue, "ann")  # the model of the user's chat: "m"
    async with queue._sessions() as session, session.begin():
        await session.execute(delete(ManagerJob))  # the chat's job done
    assert await queue.queue_idle(0) == 1
    (job,) = await queue.claim(1, exclude_users=set())
    done = await IdleWork(queue, service, settings, Metrics(), manager).run(job)
    assert done.upto is not None and done.tidied.asked == 1
    async with queue._sessions() as session:
        version = await session.scalar(select(ManagerState.idle_version))
    assert version == done.upto
    if down:
        assert await queue.queue_idle(0) == 0  # not before the quiet time has passed again
        async with queue._sessions() as session, session.begin():
            await session.execute(update(ManagerState).values(idle_after=None))
    assert await queue.queue_idle(0) == 1
    (again,) = await queue.claim(1, exclude_users=set())
    assert again.payload["since"] == done.upto  # it goes on from there


async def test_a_user_past_a_capacity_who_chats_on_gets_forgetting_alone(
    engine: AsyncEngine,
) -> None:
    queue = queue_of(engine)
    settings = make_settings(max_facts=2)
    tidier = Tidier([])
    manager = Manager(settings, http_client=httpx.AsyncClient(), model=FunctionModel(tidier))
    service = MemoryService(MemoryStore(engine), FakeEmbedder())
    await add(service, "ann", ("The user likes green tea.", 0), ("The user likes black tea.", 1),
              ("The user likes oolong tea.", 2), ("Lives in Oslo, Norway.", 3),
              ("Lives in Oslo Norway", 4))  # fmt: skip
    work = IdleWork(queue, service, settings, Metrics(), manager)
    assert await work.learned("ann")
    (job,) = await queue.claim(1, exclude_users=set(), idle_first=True)
    done = await work.run(job)
    assert len(done.forgotten) == 3 and done.tidied.asked == 0 and tidier.prompts == []
    assert done.tidied.merged == 0  # not even the copies: that waits for the user's quiet time
    async with queue._sessions() as session:
        assert await session.scalar(select(ManagerState.idle_version)) is None
