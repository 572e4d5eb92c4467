"""`memproxy memories move|import --ids new`, `users list` and `jobs`: the commands that act
across users, on the test's own database (conftest), with the fake embedder."""

from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path

import orjson
import pytest

from app.cli import memory_write
from app.memory.store.db import create_engine
from app.memory.store.records import now
from app.memory.store.tables import JobStatus, ManagerJob
from app.schemas.users import UserPublic
from tests.test_memory_cli import run


def add(capsys: pytest.CaptureFixture[str], user: str, *contents: str) -> list[str]:
    """Each content added as a memory of the user; their ids."""
    return [run(capsys, "memories", "add", "--user", user, text)[1].strip() for text in contents]


def listed(capsys: pytest.CaptureFixture[str], user: str) -> dict[str, str]:
    """The user's memories: content by id."""
    out = run(capsys, "memories", "list", "--user", user, "--json")[1]
    return {m["id"]: m["content"] for m in map(orjson.loads, out.splitlines())}


def history(capsys: pytest.CaptureFixture[str], user: str, memory_id: str) -> list[dict[str, str]]:
    out = run(capsys, "memories", "history", "--user", user, memory_id, "--json")[1]
    return [orjson.loads(line) for line in out.splitlines()]


def failed_job(user: str) -> str:
    """A job of the user parked as failed, straight in the database; its id."""
    job_id = str(uuid.uuid4())

    async def insert() -> None:
        engine = create_engine(os.environ["MEMPROXY_DATABASE_URL"])
        async with engine.begin() as connection:
            await connection.execute(ManagerJob.__table__.insert().values(
                id=job_id, user_id=user, explicit=False, status=JobStatus.FAILED.value,
                attempts=5, next_attempt_at=now(), payload={"new": [{"role": "user"}]},
                error="ConnectionError: manager unreachable", created_at=now(),
            ))  # fmt: skip
        await engine.dispose()

    asyncio.run(insert())
    return job_id


def test_move_gives_every_memory_with_its_history(capsys: pytest.CaptureFixture[str]) -> None:
    kayak, tea = add(capsys, "ann", "Owns a kayak", "Drinks tea")
    assert run(capsys, "memories", "pin", "--user", "ann", kayak)[0] == 0
    add(capsys, "bob", "Bob rides a bike")
    code, out, err = run(capsys, "memories", "move", "--from", "ann", "--to", "bob", "--json")
    assert code == 0 and orjson.loads(out) == {
        "moved": 2,
        "jobs": 0,
        "from_user": "ann",
        "to_user": "bob",
    }
    assert "moved 2 memories and 0 jobs from ann to bob" in err
    assert listed(capsys, "ann") == {}
    moved = listed(capsys, "bob")
    assert moved[kayak] == "Owns a kayak" and moved[tea] == "Drinks tea" and len(moved) == 3
    events = history(capsys, "bob", kayak)
    assert [e["action"] for e in events] == ["created", "updated", "moved"]
    assert events[-1]["detail"] == "moved from user 'ann'"
    assert {e["actor"] for e in events} == {"cli"}  # the move too, not "api"
    code, _, err = run(capsys, "memories", "history", "--user", "ann", kayak)
    assert code == 1 and "no history" in err  # it went along
    code, out, err = run(capsys, "memories", "move", "--from", "ann", "--to", "bob")
    assert code == 1 and out == "" and "nothing to move: ann has no memories" in err


def test_move_takes_the_jobs_along(capsys: pytest.CaptureFixture[str]) -> None:
    add(capsys, "ann", "Owns a kayak")
    failed_job("ann")
    code, _, err = run(capsys, "memories", "move", "--from", "ann", "--to", "bob")
    assert code == 0 and "moved 1 memory and 1 job from ann to bob" in err
    failures = orjson.loads(run(capsys, "jobs", "list", "--user", "bob", "--json")[1])["failures"]
    assert [f["user_id"] for f in failures] == ["bob"]


def test_import_with_new_ids_copies_another_users_export(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    ids = add(capsys, "ann", "Owns a kayak", "Drinks tea")
    export = tmp_path / "ann.jsonl"
    assert run(capsys, "memories", "export", "--user", "ann", "--output", str(export))[0] == 0
    code, _, err = run(capsys, "memories", "import", "--user", "bob", str(export))
    assert code == 2 and "already in use" in err  # the ids are ann's: kept, they would clash
    code, out, _ = run(
        capsys, "memories", "import", "--user", "bob", str(export), "--ids", "new", "--json"
    )
    assert code == 0 and orjson.loads(out) == {"imported": 2, "skipped": 0}
    copies = listed(capsys, "bob")
    assert sorted(copies.values()) == ["Drinks tea", "Owns a kayak"] and not set(copies) & set(ids)
    assert listed(capsys, "ann") == dict(zip(ids, ["Owns a kayak", "Drinks tea"], strict=True))
    details = {history(capsys, "bob", copy)[0]["detail"] for copy in copies}
    assert details == {f"imported as a copy of memory {memory_id}" for memory_id in ids}
    assert {e["action"] for memory_id in ids for e in history(capsys, "ann", memory_id)} == {
        "created"
    }


def test_import_with_new_ids_keeps_links_across_its_batches(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CLI writes a big file in batches: a fact links to the copy of its episode written in
    an earlier batch (it was dropped), and the episode is found by the fact (its index key)."""
    monkeypatch.setattr(memory_write, "BATCH", 2)
    lines = [
        {"id": "e-1", "type": "episode", "content": "I stopped eating meat years ago."},
        *({"id": f"x-{i}", "content": f"Owns {i} kayaks"} for i in range(3)),
        {"id": "f-1", "content": "Is vegetarian", "linked": ["e-1"]},
    ]
    source = tmp_path / "ann.jsonl"
    source.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines))
    code, out, _ = run(
        capsys, "memories", "import", "--user", "bob", str(source), "--ids", "new", "--json"
    )
    assert code == 0 and orjson.loads(out) == {"imported": 5, "skipped": 0}
    exported = tmp_path / "bob.jsonl"
    assert run(capsys, "memories", "export", "--user", "bob", "--output", str(exported))[0] == 0
    copies = {m["content"]: m for m in map(orjson.loads, exported.read_bytes().splitlines())}
    fact, episode = copies["Is vegetarian"], copies["I stopped eating meat years ago."]
    assert fact["linked"] == [episode["id"]] and episode["linked"] == [fact["id"]]
    assert {fact["id"], episode["id"]}.isdisjoint({"f-1", "e-1"})
    out = run(capsys, "memories", "search", "--user", "bob", "vegetarian", "--json")[1]
    assert episode["id"] in {m["id"] for m in map(orjson.loads, out.splitlines())}


def test_an_import_line_without_id_is_a_new_memory(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    source = tmp_path / "lines.jsonl"
    source.write_text('{"content": "Owns a kayak"}\n{"id": "k-1", "content": "Drinks tea"}\n')
    code, out, _ = run(capsys, "memories", "import", "--user", "ann", str(source), "--json")
    assert code == 0 and orjson.loads(out) == {"imported": 2, "skipped": 0}
    code, out, _ = run(capsys, "memories", "import", "--user", "ann", str(source), "--json")
    assert code == 0 and orjson.loads(out) == {"imported": 1, "skipped": 1}  # k-1 is there
    assert sorted(listed(capsys, "ann").values()) == ["Drinks tea", "Owns a kayak", "Owns a kayak"]


def test_users_list(capsys: pytest.CaptureFixture[str]) -> None:
    add(capsys, "ann", "Owns a kayak", "Drinks tea")
    add(capsys, "bob", "Bob rides a bike")
    code, out, _ = run(capsys, "users", "list", "--json")
    users = [orjson.loads(line) for line in out.splitlines()]
    assert code == 0 and [(u["id"], u["memories"]) for u in users] == [("bob", 1), ("ann", 2)]
    assert users[0]["last_activity"] >= users[1]["last_activity"]  # latest activity first
    # The API's schema (GET /v1/users): the same field names, times in UTC ending in Z.
    assert set(users[0]) == set(UserPublic.model_fields) and users[0]["object"] == "user"
    assert users[0]["last_activity"].endswith("Z")
    code, out, _ = run(capsys, "users", "list", "--limit", "1", "--offset", "1", "--json")
    assert [orjson.loads(line)["id"] for line in out.splitlines()] == ["ann"]
    code, out, _ = run(capsys, "users", "list", "--limit", "1")
    assert code == 0 and "2 users (1-1 shown)" in out and "bob" in out and "ann" not in out


def test_jobs_list_and_retry(capsys: pytest.CaptureFixture[str]) -> None:
    add(capsys, "ann", "Owns a kayak")
    job_id = failed_job("ann")
    code, out, _ = run(capsys, "jobs", "list", "--user", "ann", "--json")
    listing = orjson.loads(out)
    assert code == 0 and listing["counts"]["failed"] == 1
    assert [(j["job_id"], j["status"], j["messages"]) for j in listing["jobs"]] == [
        (job_id, "failed", 1)
    ]
    code, out, _ = run(capsys, "jobs", "list", "--user", "ann")
    assert code == 0 and f"failed {job_id} user=ann: ConnectionError" in out
    assert "1 job of ann" in out and "5 attempts" in out  # the user's jobs, in a table
    code, out, err = run(capsys, "jobs", "retry", "--job", "nope", "--json")
    assert code == 1 and orjson.loads(out) == {"retried": 0} and "no failed job nope" in err
    code, out, _ = run(capsys, "jobs", "retry", "--job", job_id, "--json")
    assert code == 0 and orjson.loads(out) == {"retried": 1}
    listing = orjson.loads(run(capsys, "jobs", "list", "--json")[1])
    assert listing["counts"]["queued"] == 1 and "jobs" not in listing  # only with --user
