"""The Manager's operations applied by the v4 rules, the dedup guard and pinned memories; every
change audited, kept in one transaction per job, and reaching the search index."""

from __future__ import annotations

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from app.memory.learning.applier import Applier
from app.memory.learning.decisions import Op, Operation
from app.memory.service import MemoryService
from app.memory.store.memories import MemoryStore
from app.memory.store.records import NewMemory
from app.memory.store.tables import MemoryType
from tests.fakes import FakeEmbedder


@pytest.fixture
def service(engine: AsyncEngine) -> MemoryService:
    return MemoryService(MemoryStore(engine), FakeEmbedder())  # type: ignore[arg-type]


async def seed(service: MemoryService, *contents: str, pinned: bool = False) -> dict[int, str]:
    """The memories, and the aliases a Manager prompt would show them with (1, 2, ...)."""
    records = (await service.add("ann", [NewMemory(c, pinned=pinned) for c in contents])).records
    return {i: r.id for i, r in enumerate(records, start=1)}


async def contents(service: MemoryService) -> set[str]:
    return {m.content for m in (await service.page("ann"))[0]}


async def test_new_creates_and_update_of_a_known_id_updates(service: MemoryService) -> None:
    aliases = await seed(service, "Lives in Oslo")
    outcomes = await Applier(service).apply("ann", [
        Operation(op=Op.NEW, content="Has a ginger cat called Tom", type=MemoryType.FACT),
        Operation(op=Op.UPDATE, id=1, content="Lives in Bergen since May"),
    ], aliases, job_id="job-1")  # fmt: skip
    assert [(o.result, o.reason) for o in outcomes] == [("created", None), ("updated", None)]
    assert outcomes[1].memory_id == aliases[1]
    assert await contents(service) == {"Has a ginger cat called Tom", "Lives in Bergen since May"}
    created = await service.get("ann", outcomes[0].memory_id or "")
    assert created is not None and created.source == "manager" and created.type == "fact"


@pytest.mark.parametrize("alias", [None, 99], ids=["no id", "unknown id"])
async def test_update_of_a_memory_never_shown_is_refused(
    service: MemoryService, alias: int | None
) -> None:
    aliases = await seed(service, "Lives in Oslo")
    (outcome,) = await Applier(service).apply(
        "ann", [Operation(op=Op.UPDATE, id=alias, content="Plays the cello")], aliases, job_id="j"
    )
    assert outcome.result == "failed" and "number of a memory shown" in (outcome.reason or "")
    assert await contents(service) == {"Lives in Oslo"}


async def test_an_update_unrelated_to_the_memory_it_names_creates_and_keeps_it(
    service: MemoryService,
) -> None:
    """A 1.5B model answered "UPDATE 2: Daughter Mia turns 7 on 3 May" over "Lives in Lyon"."""
    aliases = await seed(service, "Is vegetarian", "Lives in Lyon")
    outcomes = await Applier(service).apply("ann", [
        Operation(op=Op.UPDATE, id=2, content="Daughter Mia turns seven"),
        Operation(op=Op.UPDATE, id=1, content="Is strictly vegetarian"),  # related: updates
    ], aliases, job_id="j")  # fmt: skip
    assert [o.result for o in outcomes] == ["created", "updated"]
    assert "unrelated" in (outcomes[0].reason or "") and outcomes[0].memory_id != aliases[2]
    assert await contents(service) == {
        "Is strictly vegetarian", "Lives in Lyon", "Daughter Mia turns seven"
    }  # fmt: skip


async def test_a_line_of_the_prompt_is_never_a_memory(service: MemoryService) -> None:
    """A 1.5B model on LoCoMo wrote the transcript back: "ASSISTANT: Hey Caroline! ..."."""
    aliases = await seed(service, "Lives in Lyon")
    outcomes = await Applier(service).apply("ann", [
        Operation(op=Op.NEW, content="ASSISTANT: Hey Caroline! I'm swamped with the kids"),
        Operation(op=Op.NEW, content="USER: Hey Mel!"),
        Operation(op=Op.UPDATE, id=1, content="Current date and time: Monday 08 May 2023"),
        Operation(op=Op.NEW, content="The new exchange (decide from this): USER: hi"),
        Operation(op=Op.NEW, content="Paints sunsets over lakes"),
    ], aliases, job_id="j")  # fmt: skip
    assert [o.result for o in outcomes] == ["failed"] * 4 + ["created"]
    assert all("copies the prompt" in (o.reason or "") for o in outcomes[:4])
    assert await contents(service) == {"Lives in Lyon", "Paints sunsets over lakes"}


async def test_new_with_an_id_creates_and_leaves_that_memory_alone(service: MemoryService) -> None:
    """A chit-chat turn's NEW carrying id 1 once replaced "Vegetarian Salad" with a fact about
    Canberra: a NEW creates, whatever id it carries."""
    aliases = await seed(service, "Likes Vegetarian Salad")
    (outcome,) = await Applier(service).apply(
        "ann", [Operation(op=Op.NEW, id=1, content="Plays the cello")], aliases, job_id="j"
    )
    assert outcome.result == "created" and outcome.memory_id != aliases[1]
    assert await contents(service) == {"Likes Vegetarian Salad", "Plays the cello"}


async def test_update_of_a_memory_deleted_since_the_prompt_creates(service: MemoryService) -> None:
    aliases = await seed(service, "Lives in Oslo")
    await service.delete("ann", [aliases[1]])
    (outcome,) = await Applier(service).apply(
        "ann", [Operation(op=Op.UPDATE, id=1, content="Lives in Bergen")], aliases, job_id="j"
    )
    assert outcome.result == "created" and "deleted since" in (outcome.reason or "")
    assert await contents(service) == {"Lives in Bergen"}


async def test_delete_needs_a_known_id_and_spares_pinned_memories(service: MemoryService) -> None:
    aliases = await seed(service, "Lives in Oslo", "Likes jazz")
    aliases[3] = (await seed(service, "Allergic to peanuts", pinned=True))[1]
    outcomes = await Applier(service).apply("ann", [
        Operation(op=Op.DELETE, id=2),
        Operation(op=Op.DELETE),
        Operation(op=Op.DELETE, id=42),
        Operation(op=Op.DELETE, id=3),
    ], aliases, job_id="j")  # fmt: skip
    results = {(o.operation.id, o.result, o.reason) for o in outcomes}
    assert (2, "deleted", None) in results and (3, "failed", "pinned") in results
    assert {o.operation.id for o in outcomes if o.result == "failed"} == {None, 42, 3}
    assert await contents(service) == {"Lives in Oslo", "Allergic to peanuts"}


async def test_operations_without_content_fail_and_change_nothing(service: MemoryService) -> None:
    aliases = await seed(service, "Lives in Oslo")
    version = await service.store.version("ann")
    outcomes = await Applier(service).apply("ann", [
        Operation(op=Op.NEW, content="  "), Operation(op=Op.UPDATE, id=1),
    ], aliases, job_id="j")  # fmt: skip
    assert [o.result for o in outcomes] == ["failed", "failed"]
    assert await contents(service) == {"Lives in Oslo"}
    assert await service.store.version("ann") == version  # nothing to commit, nothing bumped


async def test_near_duplicates_are_not_created_twice(service: MemoryService) -> None:
    aliases = await seed(service, "Has a ginger cat called Tom")
    outcomes = await Applier(service, dedup_threshold=0.9).apply("ann", [
        Operation(op=Op.NEW, content="has a ginger cat called Tom"),  # same words: cosine 1
        Operation(op=Op.NEW, content="Has a ginger cat called Tom."),
        Operation(op=Op.NEW, content="Started learning the piano"),
        Operation(op=Op.NEW, content="started learning the PIANO"),  # repeats the one above
    ], aliases, job_id="j")  # fmt: skip
    assert [o.result for o in outcomes] == ["duplicate", "duplicate", "duplicate", "created"]
    assert outcomes[0].memory_id == aliases[1]
    assert await contents(service) == {"Has a ginger cat called Tom", "Started learning the piano"}


async def test_one_job_is_one_transaction_and_reaches_the_index(service: MemoryService) -> None:
    aliases = await seed(service, "Lives in Oslo", "Likes jazz")
    await service.search("ann", "warm up", limit=1, min_score=0)  # the index is built
    version = await service.store.version("ann")
    await Applier(service).apply("ann", [
        Operation(op=Op.NEW, content="Runs marathons"),
        Operation(op=Op.UPDATE, id=1, content="Lives in Bergen"),
        Operation(op=Op.DELETE, id=2),
    ], aliases, job_id="j")  # fmt: skip
    assert await service.store.version("ann") == version + 1
    found = await service.search("ann", "marathons Bergen jazz Oslo", limit=10, min_score=0.05)
    assert {f.memory.content for f in found} == {"Runs marathons", "Lives in Bergen"}


async def test_history_shows_why_a_memory_exists_and_is_private(client: httpx.AsyncClient) -> None:
    service: MemoryService = client._transport.app.state.services.memory  # type: ignore[attr-defined]
    created = (
        await client.post(
            "/v1/memories", json={"content": "Lives in Oslo"}, headers={"X-User-Id": "ann"}
        )
    ).json()
    await Applier(service).apply(
        "ann",
        [Operation(op=Op.UPDATE, id=1, content="Lives in Bergen")],
        {1: created["id"]},
        job_id="job-7",
    )
    await Applier(service).apply(
        "ann", [Operation(op=Op.DELETE, id=1)], {1: created["id"]}, job_id="job-8"
    )

    history = await client.get(
        f"/v1/memories/{created['id']}/history", headers={"X-User-Id": "ann"}
    )
    assert history.status_code == 200
    events = [
        (e["action"], e["actor"], e["job_id"], e["before"], e["after"])
        for e in history.json()["data"]
    ]
    assert events == [
        ("created", "api", None, None, "Lives in Oslo"),
        ("updated", "manager", "job-7", "Lives in Oslo", "Lives in Bergen"),
        ("deleted", "manager", "job-8", "Lives in Bergen", None),
    ]
    other = await client.get(f"/v1/memories/{created['id']}/history", headers={"X-User-Id": "bob"})
    assert other.status_code == 404 and set(other.json()["error"]) >= {
        "message",
        "type",
        "param",
        "code",
    }


async def test_deleting_all_memories_erases_their_history_fingerprints_and_jobs(
    client: httpx.AsyncClient,
) -> None:
    from app.memory.learning.extraction import exchange
    from app.memory.learning.jobs import JobQueue
    from app.memory.learning.turns import turn

    services = client._transport.app.state.services  # type: ignore[attr-defined]
    created = (
        await client.post(
            "/v1/memories", json={"content": "Lives in Oslo"}, headers={"X-User-Id": "ann"}
        )
    ).json()
    await client.delete(f"/v1/memories/{created['id']}", headers={"X-User-Id": "ann"})
    history = await client.get(
        f"/v1/memories/{created['id']}/history", headers={"X-User-Id": "ann"}
    )
    assert [e["action"] for e in history.json()["data"]] == [
        "created",
        "deleted",
    ]  # one deletion keeps it
    queue: JobQueue = services.jobs
    found = exchange([turn("user", "I have a cat")], set(), threshold=1)
    assert found is not None
    await queue.enqueue("ann", "m", found, interval_seconds=0)
    await queue.enqueue("bob", "m", found, interval_seconds=0)

    await client.delete("/v1/memories", params={"confirm": "true"}, headers={"X-User-Id": "ann"})
    gone = await client.get(f"/v1/memories/{created['id']}/history", headers={"X-User-Id": "ann"})
    assert gone.status_code == 404
    assert await queue.counts("ann") == {"awaiting": 0, "queued": 0, "running": 0, "failed": 0}
    assert await queue.processed("ann", found.fingerprints) == set()
    assert (await queue.counts("bob"))["queued"] == 1  # another user's are untouched


async def test_a_job_that_changes_nothing_bumps_no_version(service: MemoryService) -> None:
    aliases = await seed(service, "Allergic to peanuts", pinned=True)
    version = await service.store.version("ann")
    (outcome,) = await Applier(service).apply(
        "ann", [Operation(op=Op.DELETE, id=1)], aliases, job_id="j"
    )
    assert outcome.result == "failed" and await service.store.version("ann") == version


async def test_an_update_never_makes_a_memory_a_copy_of_another(service: MemoryService) -> None:
    """A 1.5B model on LoCoMo UPDATEd several memories with one sentence: they became copies,
    and what they held was lost."""
    aliases = await seed(service, "Lives in Oslo", "Plays the cello", "Has a cat")
    outcomes = await Applier(service).apply("ann", [
        Operation(op=Op.UPDATE, id=1, content="Has a cat"),  # the text of memory 3
        Operation(op=Op.UPDATE, id=2, content="Plays the cello every Sunday"),
        Operation(op=Op.UPDATE, id=3, content="Plays the cello every Sunday"),  # a repeat
    ], aliases, job_id="j")  # fmt: skip
    assert sorted(o.result for o in outcomes) == ["duplicate", "duplicate", "updated"]
    assert outcomes[0].memory_id == aliases[3]
    assert await contents(service) == {"Lives in Oslo", "Plays the cello every Sunday", "Has a cat"}
