"""What the memory commands print: `--json` is machine output alone on stdout, progress bars
(with their rate) go to stderr and only on a terminal, ids are whole on a narrow terminal; and
`memories add --file`, which writes in batches as `import` does."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import orjson
import pytest

from app.cli import memory_write as cli_memory_write
from app.memory.service import MemoryService
from app.memory.store.records import NewMemory, Written
from tests.test_memory_cli import run
from tests.test_memory_cli_users import add, failed_job, listed

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
RATE = re.compile(r"\d[\d,]*/s")


@pytest.fixture
def terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rich takes stdout and stderr for a terminal (FORCE_COLOR): progress bars are drawn."""
    monkeypatch.setenv("FORCE_COLOR", "1")


@pytest.fixture
def batches(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Batches of 4 memories (not 256, to keep the test small); the size of each add."""
    sizes: list[int] = []
    real_add = MemoryService.add

    async def spy(self: MemoryService, user_id: str, items: list[NewMemory]) -> Written:
        sizes.append(len(items))
        return await real_add(self, user_id, items)

    monkeypatch.setattr(cli_memory_write, "BATCH", 4)
    monkeypatch.setattr(MemoryService, "add", spy)
    return sizes


@pytest.mark.usefixtures("terminal")
@pytest.mark.parametrize("argv", [
    ["memories", "list", "--user", "ann"],
    ["memories", "get", "--user", "ann", "{kayak}"],
    ["memories", "stats", "--user", "ann"],
    ["memories", "history", "--user", "ann", "{kayak}"],
    ["memories", "search", "--user", "ann", "kayak"],
    ["memories", "add", "--user", "ann", "Drinks tea"],
    ["memories", "add", "--user", "ann", "--file", "{notes}"],
    ["memories", "edit", "--user", "ann", "{kayak}", "--content", "Owns two kayaks"],
    ["memories", "pin", "--user", "ann", "{kayak}"],
    ["memories", "unpin", "--user", "ann", "{kayak}"],
    ["memories", "delete", "--user", "ann", "{tent}"],
    ["memories", "move", "--from", "ann", "--to", "bob"],
    ["memories", "export", "--user", "ann"],
    ["memories", "import", "--user", "carl", "{export}", "--ids", "new"],
    ["users", "list"],
    ["jobs", "list", "--user", "ann"],
    ["jobs", "retry"],
    ["index", "rebuild"],
], ids=lambda argv: " ".join(argv[:2] + ["--file"] * ("--file" in argv)))  # fmt: skip
def test_json_is_machine_output_alone_on_stdout(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, argv: list[str]
) -> None:
    kayak, tent = add(capsys, "ann", "Owns a kayak", "Has a tent")
    failed_job("ann")
    notes, export = tmp_path / "notes.txt", tmp_path / "ann.jsonl"
    notes.write_text("Likes maps\nReads atlases\n")
    export.write_bytes(run(capsys, "memories", "export", "--user", "ann")[1].encode())
    names = {"kayak": kayak, "tent": tent, "notes": notes, "export": export}
    code, out, err = run(capsys, *[a.format(**names) for a in argv], "--json")
    assert code == 0, err
    rows = [orjson.loads(line) for line in out.splitlines()]  # JSON Lines, nothing else
    assert rows and all(isinstance(row, dict) for row in rows)
    assert not RATE.search(err)  # no progress bar with --json


def test_import_in_batches_with_a_progress_bar(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, terminal: None, batches: list[int]
) -> None:
    source = tmp_path / "ten.jsonl"
    source.write_bytes(b"".join(orjson.dumps({"content": f"note {i}"}) + b"\n" for i in range(10)))
    code, out, err = run(capsys, "memories", "import", "--user", "ann", str(source))
    assert code == 0 and out == "" and batches == [4, 4, 2]
    shown = ANSI.sub("", err)
    assert re.search(r"importing .*10/10 .*\d[\d,]*/s", shown), shown  # count and rate
    assert "imported 10, skipped 0" in shown


def test_no_progress_bar_off_a_terminal(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, batches: list[int]
) -> None:
    (tmp_path / "notes.txt").write_text("a\nb\nc\nd\ne\n")
    code, out, err = run(capsys, "memories", "add", "--user", "ann", "--file",
                         str(tmp_path / "notes.txt"))  # fmt: skip
    assert code == 0 and batches == [4, 1] and not RATE.search(err) and "\x1b" not in err
    assert len(out.split()) == 5


def test_add_file_adds_a_memory_per_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, terminal: None, batches: list[int]
) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_bytes("Likes maps\n\n   \n  Reads atlases  \r\nOwns a globe 🌍\n".encode())
    code, out, err = run(capsys, "memories", "add", "--user", "ann", "--file", str(notes),
                         "--type", "preference", "--pinned")  # fmt: skip
    ids = out.splitlines()
    assert code == 0 and len(ids) == 3 and all(str(uuid.UUID(i)) == i for i in ids)  # ids alone
    assert "added 3 memories of ann" in ANSI.sub("", err) and RATE.search(ANSI.sub("", err))
    assert listed(capsys, "ann") == dict(
        zip(ids, ["Likes maps", "Reads atlases", "Owns a globe 🌍"], strict=True)
    )
    got = orjson.loads(run(capsys, "memories", "get", "--user", "ann", ids[0], "--json")[1])
    assert (got["type"], got["pinned"]) == ("preference", True)


@pytest.mark.parametrize(("content", "message"), [
    (b"fine\n" + b"x" * 4001 + b"\n", "(line 2.content)"),
    (b"fine\n\n   \n", None),
    (b"\n \n", "nothing to add"),
    (b"caf\xe9\n", "is not UTF-8 text"),
], ids=["too long", "blank", "empty", "latin-1"])  # fmt: skip
def test_add_file_checks_every_line_first(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, content: bytes, message: str | None
) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_bytes(content)
    code, _, err = run(capsys, "memories", "add", "--user", "ann", "--file", str(notes))
    if message is None:  # blank lines are skipped, not refused
        assert code == 0 and list(listed(capsys, "ann").values()) == ["fine"]
        return
    assert code == 2 and message in err
    assert listed(capsys, "ann") == {}  # nothing written


def test_ids_are_whole_on_a_narrow_terminal(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "60")
    user = str(uuid.uuid4())
    long = "A memory long enough to wrap many times in a narrow table cell " * 3
    ids = add(capsys, user, long, "Owns a kayak")
    job_id = failed_job(user)
    search = ["memories", "search", "--user", user, "memory kayak", "--min-score", "0"]
    shown = {
        "list": run(capsys, "memories", "list", "--user", user)[1],
        "search": run(capsys, *search)[1],
        "history": run(capsys, "memories", "history", "--user", user, ids[0])[1],
        "users": run(capsys, "users", "list")[1],
        "jobs": run(capsys, "jobs", "list", "--user", user)[1],
    }
    tables = [shown[name] for name in ("list", "search", "history", "users")]
    assert max(len(line) for out in tables for line in out.splitlines()) <= 60
    for name, wanted in [("list", ids), ("search", ids), ("history", ids[:1]), ("users", [user]),
                         ("jobs", [job_id])]:  # fmt: skip
        lines = shown[name].splitlines()
        assert all(any(i in line for line in lines) for i in wanted), (name, shown[name])


def test_an_import_that_fails_part_way_says_what_it_wrote(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, batches: list[int]
) -> None:
    (bobs,) = add(capsys, "bob", "Bob rides a bike")
    lines = [{"content": f"note {i}"} for i in range(4)] + [{"id": bobs, "content": "taken"}]
    source = tmp_path / "lines.jsonl"
    source.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines))
    code, _, err = run(capsys, "memories", "import", "--user", "ann", str(source))
    assert code == 2 and batches[-2:] == [4, 1]
    assert "stopped after 4 memories were written" in err and "already in use" in err
    assert len(listed(capsys, "ann")) == 4
