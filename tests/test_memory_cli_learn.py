"""``memproxy learn FILE --user U`` on the test's own database: the file checked whole (a bad one
is one line naming the place, exit 2, nothing queued), its conversations queued, a summary; then
it waits while a running server's Manager learns them (exit 1 when some failed)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest
from pydantic_ai.models.function import FunctionModel

import app.cli.learn
from app import cli
from tests.conftest import AppClientFactory
from tests.fakes import LEARN_AT_ONCE, unusable_manager
from tests.memory.learning.exports import MAY_1, dumped, gpt_linear, owui_linear
from tests.memory.learning.support import Remembering, manager_client, until

DAY = 24 * 3600
CHATS = dumped(
    owui_linear("Cello", [("user", "I play the cello"), ("assistant", "Lovely")]),
    owui_linear("Oslo", [("user", "I live in Oslo"), ("assistant", "Nice")], start=MAY_1 + DAY),
    owui_linear("Hello", [("assistant", "How can I help?")]),
)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


async def learning(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, export: Path, *argv: str
) -> tuple[int, str, str]:
    """``memproxy learn EXPORT --user ann`` waiting while the test's server learns: off the event
    loop, which that server runs on, polling often."""
    monkeypatch.setattr(app.cli.learn, "POLL_SECONDS", 0.05)
    code = await asyncio.to_thread(cli.main, ["learn", str(export), "--user", "ann", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def queued(capsys: pytest.CaptureFixture[str]) -> int:
    code, out, _ = run(capsys, "jobs", "list", "--json")
    assert code == 0
    return int(orjson.loads(out)["counts"]["queued"])


@pytest.fixture(autouse=True)
def _database() -> None:
    """The database memproxy serves (learn makes none: a missing one is a wrong path)."""
    assert cli.main(["db", "upgrade"]) == 0


@pytest.fixture
def export(tmp_path: Path) -> Path:
    path = tmp_path / "chat-export-1714555800000.json"
    path.write_bytes(CHATS)
    return path


def test_queued_with_a_summary_and_nothing_new_when_sent_again(
    capsys: pytest.CaptureFixture[str], export: Path
) -> None:
    code, out, err = run(capsys, "learn", str(export), "--user", "ann", "--no-wait", "--json")
    assert code == 0, err
    result = orjson.loads(out)
    assert {k: result[k] for k in ("object", "user_id", "format", "conversations", "messages",
                                   "queued_conversations", "jobs", "already_learned", "skipped",
                                   "pending", "failed")} == {
        "object": "memory.learn", "user_id": "ann", "format": "openwebui", "conversations": 3,
        "messages": 5, "queued_conversations": 2, "jobs": 2, "already_learned": 0, "skipped": 1,
        "pending": 2, "failed": 0,
    }  # fmt: skip
    assert "an Open WebUI export for ann" in err and "2 queued as 2 jobs" in err
    assert "2 jobs still to learn" in err
    assert queued(capsys) == 2

    code, out, err = run(capsys, "learn", str(export), "--user", "ann", "--no-wait")
    assert code == 0 and out == ""
    assert "0 queued as 0 jobs, 2 already learned, 1 skipped" in err
    assert f"(run {result['id']})" in err  # the same run: its jobs still pending
    assert queued(capsys) == 2


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (b"{oops", ["not valid JSON"]),
        (b"[]", ["no conversation"]),
        (dumped(owui_linear("Fine", [("user", "ok")]),
                owui_linear("Trip", [("user", "I like fjords"), ("assistant", 5)])),
         ['conversations[1] ("Trip"): chat.history.messages.m1.content must be a string']),
        (dumped(gpt_linear("Cello", [("user", "I play the cello")])),
         ["conversations[0] names no model", "MEMPROXY_MANAGER_MODEL"]),
    ],
    ids=["not JSON", "empty", "wrong type", "no model"],
)  # fmt: skip
def test_a_bad_file_is_one_line_exit_2_and_nothing_queued(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, body: bytes, words: list[str]
) -> None:
    path = tmp_path / "conversations.json"
    path.write_bytes(body)
    code, out, err = run(capsys, "learn", str(path), "--user", "ann", "--no-wait")
    assert code == 2 and out == ""
    (line,) = [line for line in err.splitlines() if not line.startswith("database:")]
    assert line.startswith("error: ")
    for word in words:
        assert word in line
    assert queued(capsys) == 0


def test_a_missing_file_a_named_model_and_the_manager_off(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code, _, err = run(capsys, "learn", str(tmp_path / "nope.json"), "--user", "ann")
    assert code == 2 and "nope.json" in err
    path = tmp_path / "conversations.json"
    path.write_bytes(dumped(gpt_linear("Cello", [("user", "I play the cello")])))
    code, _, err = run(capsys, "learn", str(path), "--user", "ann", "--no-wait", "--model", "m")
    assert code == 0 and "a ChatGPT export for ann" in err and "1 queued as 1 job" in err
    monkeypatch.setenv("MEMPROXY_MANAGER_ENABLED", "false")
    code, _, err = run(capsys, "learn", str(path), "--user", "ann")
    assert code == 2 and "the Manager is off" in err


async def test_it_waits_while_a_running_server_learns_them(
    capsys: pytest.CaptureFixture[str],
    export: Path,
    make_client: AppClientFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client = await manager_client(make_client, Remembering())  # the server, on the same database
    code, out, err = await learning(capsys, monkeypatch, export)
    assert code == 0 and out == "", err
    assert "waiting while memproxy serve's Manager learns 2 jobs" in err
    assert "learned: every job of this run is applied" in err

    async def learned() -> bool:
        found = await client.get(
            "/v1/memories", params={"type": "fact"}, headers={"X-User-Id": "ann"}
        )
        return sorted(m["content"] for m in found.json()["data"]) == [
            "Lives in Oslo",
            "Plays the cello",
        ]

    await until(learned)


async def test_failed_jobs_are_exit_1(
    capsys: pytest.CaptureFixture[str],
    export: Path,
    make_client: AppClientFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model, _ = unusable_manager()
    await make_client(manager_model=model, **LEARN_AT_ONCE)
    code, out, err = await learning(capsys, monkeypatch, export, "--json")
    assert code == 1
    assert orjson.loads(out)["failed"] == 2 and orjson.loads(out)["pending"] == 0
    assert "2 jobs failed: memproxy jobs list --user ann says why" in err
    assert isinstance(model, FunctionModel)
