"""Forgetting over a capacity through the memory API (issue 27, point 4): the dry run says what
would leave and why and changes nothing; forgetting moves it to the forgotten memories, listed
with the reason and when they are erased; one comes back with its id; every bad input is an
OpenAI-shaped 4xx that changes nothing; one user never sees another's."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import httpx
from sqlalchemy import update

from app.memory.store.records import now
from app.memory.store.tables import Memory
from tests.conftest import AppClientFactory
from tests.helpers import assert_openai_error
from tests.memory.learning.support import services
from tests.memory_api_support import ANN, BOB, add, count


async def aged(client: httpx.AsyncClient, memory_id: str, days: float) -> None:
    at = now() - timedelta(days=days)
    async with services(client).memory.store.sessions() as session, session.begin():
        await session.execute(
            update(Memory).where(Memory.id == memory_id).values(created_at=at, updated_at=at)
        )


async def three(client: httpx.AsyncClient) -> list[dict[str, Any]]:
    made = [await add(client, text) for text in ("Ann sails", "Ann knits", "Ann bakes bread")]
    for memory, days in zip(made, (300, 10, 200), strict=True):
        await aged(client, memory["id"], days)
    return made


async def test_dry_run_then_forget_then_put_back(make_client: AppClientFactory) -> None:
    client = await make_client(max_facts=1)
    sails, knits, bakes = await three(client)
    dry = await client.post("/v1/memories/forget", json={"dry_run": True}, headers=ANN)
    assert dry.status_code == 200, dry.text
    body = dry.json()
    assert (body["object"], body["dry_run"], body["max_facts"]) == ("memory.forgetting", True, 1)
    assert [m["id"] for m in body["forgotten"]] == [sails["id"], bakes["id"]]
    assert body["forgotten"][0]["content"] == "Ann sails"
    assert "over the capacity of 1 facts (3 held)" in body["forgotten"][0]["reason"]
    assert await count(client) == 3  # a dry run changes nothing

    done = await client.post("/v1/memories/forget", headers=ANN)
    assert done.status_code == 200 and not done.json()["dry_run"]
    assert [m["id"] for m in done.json()["forgotten"]] == [sails["id"], bakes["id"]]
    assert await count(client) == 1

    listed = (await client.get("/v1/memories/forgotten", headers=ANN)).json()
    assert listed["total"] == 2 and {m["id"] for m in listed["data"]} == {sails["id"], bakes["id"]}
    first = next(m for m in listed["data"] if m["id"] == sails["id"])
    assert first["object"] == "memory.forgotten" and first["reason"].startswith("over the")
    assert (first["cause"], first["ended_at"]) == ("forgotten", None)
    kept_for = datetime.fromisoformat(first["erased_after"]) - datetime.fromisoformat(
        first["forgotten_at"]
    )
    assert kept_for == timedelta(days=90)
    history = (await client.get(f"/v1/memories/{sails['id']}/history", headers=ANN)).json()
    assert history["data"][-1]["action"] == "forgotten"
    assert history["data"][-1]["actor"] == "api"

    back = await client.post(f"/v1/memories/forgotten/{sails['id']}/restore", headers=ANN)
    assert back.status_code == 200, back.text
    assert (back.json()["id"], back.json()["content"]) == (sails["id"], "Ann sails")
    got = (await client.get(f"/v1/memories/{sails['id']}", headers=ANN)).json()
    # its first writing kept (300 days ago), written again now: the next run spares it
    written = datetime.fromisoformat(got["created_at"])
    assert abs(written - (now() - timedelta(days=300))) < timedelta(minutes=5)
    assert abs(datetime.fromisoformat(got["updated_at"]) - now()) < timedelta(minutes=5)
    assert (await client.get("/v1/memories/forgotten", headers=ANN)).json()["total"] == 1
    again = await client.post(f"/v1/memories/forgotten/{sails['id']}/restore", headers=ANN)
    assert_openai_error(again, 404, param="memory_id")
    assert knits["id"] in {
        m["id"] for m in (await client.get("/v1/memories", headers=ANN)).json()["data"]
    }


async def test_no_capacity_forgets_nothing(client: httpx.AsyncClient) -> None:
    await three(client)
    done = await client.post("/v1/memories/forget", json={}, headers=ANN)
    assert done.status_code == 200 and done.json()["forgotten"] == []
    assert await count(client) == 3


async def test_bad_requests_are_openai_errors_and_change_nothing(
    make_client: AppClientFactory,
) -> None:
    client = await make_client(max_facts=1)
    await three(client)
    for body in ({"dry_run": "maybe"}, {"dry_run": False, "all": True}, [1]):
        response = await client.post("/v1/memories/forget", json=body, headers=ANN)
        assert_openai_error(response, 422)
    bad_json = await client.post(
        "/v1/memories/forget", content=b"{", headers={**ANN, "Content-Type": "application/json"}
    )
    assert bad_json.status_code in (400, 422) and "error" in bad_json.json()
    for params in ({"limit": 0}, {"limit": 1001}, {"offset": -1}, {"limit": "x"}):
        response = await client.get("/v1/memories/forgotten", params=params, headers=ANN)
        assert_openai_error(response, 422)
    missing = await client.post("/v1/memories/forgotten/nope/restore", headers=ANN)
    assert_openai_error(missing, 404, param="memory_id")
    wrong = await client.get("/v1/memories/forgotten/nope/restore", headers=ANN)
    assert wrong.status_code in (404, 405) and "error" in wrong.json()
    assert await count(client) == 3  # nothing changed, and it still serves
    assert (await client.post("/v1/memories/forget", headers=ANN)).status_code == 200


async def test_a_user_never_sees_or_restores_another_s(make_client: AppClientFactory) -> None:
    client = await make_client(max_facts=1)
    sails, _, _ = await three(client)
    await client.post("/v1/memories/forget", headers=ANN)
    assert (await client.get("/v1/memories/forgotten", headers=BOB)).json()["total"] == 0
    theirs = await client.post(f"/v1/memories/forgotten/{sails['id']}/restore", headers=BOB)
    assert_openai_error(theirs, 404, param="memory_id")
    assert (await client.get("/v1/memories/forgotten", headers=ANN)).json()["total"] == 2


async def test_the_jobs_list_says_which_job_is_idle_work(client: httpx.AsyncClient) -> None:
    await add(client, "Ann sails")
    assert await services(client).jobs.queue_idle(0) == 1
    jobs = (await client.get("/v1/memories/jobs", headers=ANN)).json()["data"]
    assert [(j["kind"], j["status"], j["messages"]) for j in jobs] == [("idle", "queued", 0)]
    stats = (await client.get("/v1/memories/stats", headers=ANN)).json()["jobs"]
    assert (stats["pending"], stats["idle"]) == (0, 1)
