"""A job parked as failed keeps the user's words: its episodes are written as it parks, recalled
while it waits, never written twice, and linked to its facts when a retry applies it."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
import respx
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart
from pydantic_ai.models.function import AgentInfo
from sqlalchemy import select

from app.memory.learning import parking
from app.memory.learning.jobs import JobQueue
from app.memory.learning.leases import Leases
from app.memory.learning.parking import KEPT, PARKED, park
from app.memory.store.records import NewMemory
from app.memory.store.tables import ManagerJob, MemoryEvent, MemoryLink, MemorySource
from tests.conftest import AppClientFactory
from tests.memory.learning.support import ANN, Remembering, manager_client, services, until

SAID = "I stopped eating meat years ago. My sister Ines lives in Porto."
WRITTEN = "Stopped eating meat years ago. Their sister Ines lives in Porto."
"""The fact the Manager here writes of SAID (its words), as the rules store it."""


class Unreliable(Remembering):
    """A Manager whose answers cannot be used until `fixed` (then it remembers every line)."""

    def __init__(self, *, raises: bool = False) -> None:
        super().__init__()
        self.fixed = False
        self.raises = raises
        self.calls = 0

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.calls += 1
        if self.fixed:
            return super().__call__(messages, info)
        if self.raises:
            raise ConnectionError("the manager's server is down")
        return ModelResponse(parts=[TextPart("sure! I will remember that")])


async def _chat(client: httpx.AsyncClient, text: str = SAID) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": text}]}
    response = await client.post("/v1/chat/completions", headers=ANN, json=body)
    assert response.status_code == 200


async def _parked(client: httpx.AsyncClient) -> bool:
    return bool((await services(client).jobs.counts())["failed"] == 1)


async def _listed(client: httpx.AsyncClient, kind: str) -> list[dict[str, Any]]:
    found = await client.get("/v1/memories", params={"type": kind, "limit": 100}, headers=ANN)
    assert found.status_code == 200
    return list(found.json()["data"])


async def _parked_chat(
    make_client: AppClientFactory, manager: Unreliable | None = None, **settings: Any
) -> tuple[httpx.AsyncClient, Unreliable]:
    """A client whose first chat's job ended parked (the Manager's answer unusable)."""
    manager = manager or Unreliable()
    settings = {"manager_max_retries": 0, **settings}
    client = await manager_client(make_client, manager, **settings)
    await _chat(client)
    await until(lambda: _parked(client))
    return client, manager


async def _no_jobs(client: httpx.AsyncClient) -> bool:
    return sum((await services(client).jobs.counts()).values()) == 0


async def _retried(client: httpx.AsyncClient, manager: Unreliable) -> None:
    """The Manager answers now; the parked job is retried and applied."""
    manager.fixed = True
    assert await services(client).jobs.retry_failed("ann") == 1
    await until(lambda: _no_jobs(client))


async def _payload(client: httpx.AsyncClient) -> dict[str, Any]:
    async with services(client).store.sessions() as session:
        return dict((await session.scalars(select(ManagerJob.payload))).one())


async def test_a_parked_jobs_words_are_kept_and_recalled_while_it_waits(
    make_client: AppClientFactory, upstream_ok: respx.Route
) -> None:
    client, _ = await _parked_chat(make_client)
    episodes = await _listed(client, "episode")
    assert [e["content"] for e in episodes] == [SAID]
    assert await _listed(client, "fact") == []  # the Manager decided nothing
    assert (await _payload(client))[KEPT] == [episodes[0]["id"]]
    history = (await client.get(f"/v1/memories/{episodes[0]['id']}/history", headers=ANN)).json()
    assert [e["detail"] for e in history["data"]] == [PARKED]
    # recalled in the next chat, whatever became of the Manager
    body = {"model": "m", "messages": [{"role": "user", "content": "Is Porto nice for meat?"}]}
    response = await client.post(
        "/v1/chat/completions", headers={**ANN, "X-Memory": "read-only"}, json=body
    )
    assert response.status_code == 200
    sent = upstream_ok.calls.last.request.content.decode()
    assert "My sister Ines lives in Porto" in sent


async def test_a_retried_job_links_its_facts_to_the_kept_episodes_and_writes_none_again(
    make_client: AppClientFactory, upstream_ok: respx.Route
) -> None:
    client, manager = await _parked_chat(make_client)
    (episode,) = await _listed(client, "episode")
    await _retried(client, manager)
    (fact,) = await _listed(client, "fact")
    assert fact["content"] == WRITTEN and [e["id"] for e in await _listed(client, "episode")] == [
        episode["id"]
    ]
    async with services(client).store.sessions() as session:
        links = (await session.execute(select(MemoryLink.fact_id, MemoryLink.episode_id))).all()
    assert [tuple(link) for link in links] == [(fact["id"], episode["id"])]
    # the episode is found by the fact drawn from it now (its index key), its words unchanged
    stored = await services(client).memory.store.get("ann", episode["id"])
    assert stored.content == SAID and stored.index_text is not None and SAID in stored.index_text
    # forgetting the fact takes the episode it came from, as for a job that never parked
    gone = await client.delete(f"/v1/memories/{fact['id']}", headers=ANN)
    assert gone.status_code == 200
    assert await _listed(client, "episode") == []


async def test_a_job_parked_after_its_attempts_keeps_its_words_once(
    make_client: AppClientFactory, upstream_ok: respx.Route
) -> None:
    """A Manager that cannot be reached: the job is tried, parked with its episodes; retried and
    parked again, it writes none a second time."""
    manager = Unreliable(raises=True)
    client = await manager_client(make_client, manager, manager_job_attempts=2)
    await _chat(client)
    await until(lambda: _parked(client))
    assert manager.calls >= 2
    first = await _listed(client, "episode")
    assert [e["content"] for e in first] == [SAID]
    assert await services(client).jobs.retry_failed("ann") == 1
    calls = manager.calls

    async def asked_again() -> bool:
        return manager.calls > calls and await _parked(client)

    await until(asked_again)
    assert await _listed(client, "episode") == first


async def test_a_kept_episode_deleted_meanwhile_is_not_brought_back(
    make_client: AppClientFactory, upstream_ok: respx.Route
) -> None:
    client, manager = await _parked_chat(make_client)
    (episode,) = await _listed(client, "episode")
    assert (await client.delete(f"/v1/memories/{episode['id']}", headers=ANN)).status_code == 200
    await _retried(client, manager)
    assert [f["content"] for f in await _listed(client, "fact")] == [WRITTEN]
    assert await _listed(client, "episode") == []
    async with services(client).store.sessions() as session:
        assert (await session.execute(select(MemoryLink))).all() == []


async def test_episodes_turned_off_a_parked_job_keeps_none(
    make_client: AppClientFactory, upstream_ok: respx.Route
) -> None:
    client, _ = await _parked_chat(make_client, episodes=False)
    assert await _listed(client, "episode") == []
    assert KEPT not in await _payload(client)


async def test_a_job_this_process_no_longer_holds_is_not_parked_and_keeps_nothing(
    make_client: AppClientFactory, upstream_ok: respx.Route
) -> None:
    """Its lease ran out and another process took it up: that one decides; nothing is written."""
    manager = Unreliable()
    client = await manager_client(make_client, manager, manager_enabled=True)
    queue: JobQueue = services(client).jobs
    await services(client).worker.stop()  # this test claims the job itself
    await _chat(client)

    async def queued() -> bool:
        return bool((await queue.counts())["queued"] == 1)

    await until(queued)
    (job,) = await queue.claim(1, exclude_users=set())
    other = Leases(services(client).store.sessions, owner="another process")
    assert not await park(services(client).memory, other, job, "down")
    assert await _listed(client, "episode") == []
    async with services(client).store.sessions() as session:
        assert (await session.execute(select(MemoryEvent))).all() == []
        assert (await session.scalars(select(ManagerJob.status))).one() == "running"


LATER = "I adopted a grey cat called Miso last week."


@pytest.mark.parametrize("later", [LATER, f"Remember that {LATER}"])  # routine, then explicit
async def test_turns_said_while_a_retried_job_waits_keep_their_words_once(
    make_client: AppClientFactory, upstream_ok: respx.Route, later: str
) -> None:
    """A retried job waits (behind another job, say) when the user says more: a routine
    exchange must not join it (its turns would get no episode) nor an explicit one take its
    turns along (they would get theirs twice)."""
    client, manager = await _parked_chat(make_client)
    worker = services(client).worker
    await worker.stop()
    queue: JobQueue = services(client).jobs
    assert await queue.retry_failed("ann") == 1
    await _chat(client, later)

    async def placed() -> bool:
        counts = await queue.counts()
        return bool(counts["awaiting"] == 0 and counts["queued"] == 2)

    await until(placed)
    manager.fixed = True
    worker._stopping = False
    await worker.start()
    await until(lambda: _no_jobs(client))
    assert any("Miso" in f["content"] for f in await _listed(client, "fact"))
    episodes = sorted(e["content"] for e in await _listed(client, "episode"))
    assert episodes == sorted([SAID, later])


async def test_a_retry_keeps_the_facts_linked_meanwhile_in_a_kept_episodes_key(
    make_client: AppClientFactory, upstream_ok: respx.Route
) -> None:
    client, manager = await _parked_chat(make_client)
    (episode,) = await _listed(client, "episode")
    memory = services(client).memory
    imported = NewMemory(
        "Has a cello", id="f0", linked=(episode["id"],), source=MemorySource.IMPORT
    )
    await memory.add("ann", [imported])
    await _retried(client, manager)
    assert len((await memory.store.linked("ann", [episode["id"]]))[episode["id"]]) == 2
    stored = await memory.store.get("ann", episode["id"])
    assert stored is not None and stored.index_text == f"{SAID} Has a cello. {WRITTEN}"


async def test_a_job_whose_episodes_cannot_be_kept_is_parked_all_the_same(
    make_client: AppClientFactory, upstream_ok: respx.Route, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = await manager_client(make_client, Unreliable(), manager_max_retries=0)

    async def broken(*_: Any, **__: Any) -> Any:
        raise RuntimeError("the embedder failed")

    monkeypatch.setattr(parking, "embed_for_store", broken)
    await _chat(client)
    await until(lambda: _parked(client))
    assert await _listed(client, "episode") == []
    assert KEPT not in await _payload(client)


async def test_a_job_is_counted_as_failed_once_it_is_parked_with_its_words(
    make_client: AppClientFactory, upstream_ok: respx.Route, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the failed-jobs metric counts can be read when it moves (it moved before the job was
    parked, and keeping its episodes takes a while)."""
    client = await manager_client(make_client, Unreliable(), manager_max_retries=0)
    real = parking.embed_for_store

    async def slow(*args: Any, **kwargs: Any) -> Any:
        await asyncio.sleep(0.3)
        return await real(*args, **kwargs)

    monkeypatch.setattr(parking, "embed_for_store", slow)
    await _chat(client)

    async def counted() -> bool:
        text = (await client.get("/metrics")).text
        return "memproxy_manager_jobs_failed_total 1.0" in text

    await until(counted)
    assert (await services(client).jobs.counts())["failed"] == 1
    assert [e["content"] for e in await _listed(client, "episode")] == [SAID]
