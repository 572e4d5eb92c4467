"""`memproxy memories ...` and `memproxy index rebuild` on the test's own database (conftest sets
MEMPROXY_DATABASE_URL), with the fake embedder standing in for the model."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from app import cli
from app.cli import memory as cli_memory
from tests.fakes import FakeEmbedder


def run(
    capsys: pytest.CaptureFixture[str], *argv: str, embedder: FakeEmbedder | None = None
) -> tuple[int, str, str]:
    code = cli.main(list(argv), embedder=embedder or FakeEmbedder())
    out, err = capsys.readouterr()
    return code, out, err


def test_add_list_search_export_import_delete(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out, _ = run(capsys, "memories", "add", "--user", "ann", "My cat Tom is ginger",
                       "--type", "fact", "--metadata", '{"from": "cli"}')  # fmt: skip
    assert code == 0
    cat_id = out.strip()
    assert (
        run(capsys, "memories", "add", "--user", "ann", "Prefers tea to coffee", "--pinned")[0] == 0
    )
    assert run(capsys, "memories", "add", "--user", "bob", "Bob rides a bike")[0] == 0

    code, out, _ = run(capsys, "memories", "list", "--user", "ann", "--json")
    listed = [orjson.loads(line) for line in out.splitlines()]
    assert code == 0 and {m["content"] for m in listed} == {
        "My cat Tom is ginger",
        "Prefers tea to coffee",
    }
    assert next(m for m in listed if m["id"] == cat_id)["metadata"] == {"from": "cli"}
    code, out, _ = run(capsys, "memories", "list", "--user", "ann")
    assert code == 0 and "2 memories of ann" in out and "ginger" in out

    code, out, _ = run(
        capsys, "memories", "search", "--user", "ann", "what colour is my cat Tom?", "--json"
    )
    hits = [orjson.loads(line) for line in out.splitlines()]
    assert code == 0 and hits[0]["id"] == cat_id and hits[0]["score"] > 0.3
    code, out, _ = run(
        capsys,
        "memories",
        "search",
        "--user",
        "bob",
        "cat Tom ginger",
        "--json",
        "--min-score",
        "0",
    )
    assert [h["content"] for h in map(orjson.loads, out.splitlines())] == ["Bob rides a bike"]

    exported = tmp_path / "ann.jsonl"
    code, _, err = run(capsys, "memories", "export", "--user", "ann", "--output", str(exported))
    assert code == 0 and "exported 2" in err and len(exported.read_bytes().splitlines()) == 2
    code, _, err = run(capsys, "memories", "import", "--user", "ann", str(exported))
    assert code == 0 and "imported 0, skipped 2" in err
    moved = tmp_path / "moved.jsonl"
    moved.write_bytes(b"".join(
        orjson.dumps({**orjson.loads(line), "id": f"c-{i}"}) + b"\n"
        for i, line in enumerate(exported.read_bytes().splitlines())
    ))  # fmt: skip
    code, _, err = run(capsys, "memories", "import", "--user", "carl", str(moved))
    assert code == 0 and "imported 2, skipped 0" in err

    code, _, err = run(capsys, "memories", "delete", "--user", "bob", cat_id)
    assert code == 1 and "deleted 0 of 1" in err  # not bob's to delete
    code, _, err = run(capsys, "memories", "delete", "--user", "ann", cat_id)
    assert code == 0 and "deleted 1 of 1" in err
    code, _, err = run(capsys, "memories", "delete", "--user", "ann", "--all")
    assert code == 2 and "--yes" in err
    code, _, err = run(capsys, "memories", "delete", "--user", "ann", "--all", "--yes")
    assert code == 0 and "deleted 1 memory of ann" in err
    assert run(capsys, "memories", "list", "--user", "ann", "--json")[1] == ""
    assert len(run(capsys, "memories", "list", "--user", "carl", "--json")[1].splitlines()) == 2


@pytest.mark.parametrize(("argv", "message"), [
    (["memories", "add", "--user", "ann", "   "], "content must not be empty"),
    (["memories", "add", "--user", "ann", "x" * 4001], "MEMPROXY_MEMORY_MAX_CHARS"),
    (["memories", "add", "--user", "ann", "ok", "--metadata", "[1]"], "metadata"),
    (["memories", "add", "--user", "ann", "ok", "--metadata", "{not json"], "--metadata is not JSON"),
    (["memories", "search", "--user", "ann", "q", "--limit", "0"], "--limit"),
    (["memories", "delete", "--user", "ann"], "name the ids"),
    (["memories", "import", "--user", "ann", "/no/such/file.jsonl"], "No such file"),
    (["memories", "add", "--user", "ann", "--file", "/no/such/file.txt"], "No such file"),
    (["memories", "edit", "--user", "ann", "some-id"], "nothing to change: give --content"),
    (["memories", "edit", "--user", "ann", "some-id", "--content", " "], "content must not be empty"),
    (["memories", "edit", "--user", "ann", "some-id", "--content", "x" * 4001], "MEMPROXY_MEMORY_MAX_CHARS"),
    (["memories", "edit", "--user", "ann", "some-id", "--metadata", "[1]"], "metadata"),
    (["memories", "move", "--from", "ann", "--to", "ann"], "same user"),
    (["users", "list", "--limit", "0"], "--limit"),
    (["users", "list", "--offset", "-1"], "--offset"),
    (["jobs", "list", "--job", "some-id"], "--job"),
], ids=["blank", "too long", "metadata list", "metadata not json", "limit", "no ids", "no file",
        "no text file", "edit nothing", "edit blank", "edit too long", "edit metadata",
        "move to self", "users limit", "users offset", "list a job"])  # fmt: skip
def test_bad_input_exits_2_with_a_message_and_changes_nothing(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    assert run(capsys, "db", "upgrade")[0] == 0  # reads need a database (tests/test_cli_startup.py)
    code, _, err = run(capsys, *argv)
    assert code == 2 and message in err
    assert run(capsys, "memories", "list", "--user", "ann", "--json")[1] == ""


def test_bad_import_line_names_the_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    source = tmp_path / "bad.jsonl"
    source.write_text(
        '{"id": "a1", "content": "fine"}\n{"id": "a2", "content": "ok", "type": "nope"}\n'
    )
    code, _, err = run(capsys, "memories", "import", "--user", "ann", str(source))
    assert code == 2 and "line 2" in err and "type" in err
    assert run(capsys, "memories", "list", "--user", "ann", "--json")[1] == ""  # all or nothing


def test_unknown_type_is_refused_by_the_parser(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(
            ["memories", "add", "--user", "ann", "x", "--type", "secret"], embedder=FakeEmbedder()
        )
    assert exit_.value.code == 2


def test_index_rebuild_re_embeds_with_a_new_model(capsys: pytest.CaptureFixture[str]) -> None:
    for user, count in (("ann", 3), ("bob", 2)):
        for i in range(count):
            run(capsys, "memories", "add", "--user", user, f"memory {i} of {user}")
    embedder = FakeEmbedder("model-b")
    code, _, err = run(capsys, "index", "rebuild", embedder=embedder)
    assert code == 0 and "indexed 5 memories of 2 users with model-b" in err
    assert sum(len(c) for c in embedder.calls) == 5
    embedder.calls.clear()
    code, _, err = run(capsys, "index", "rebuild", "--user", "ann", embedder=embedder)
    assert code == 0 and "indexed 3 memories of 1 user with" in err and embedder.calls == []
    code, out, _ = run(
        capsys,
        "memories",
        "search",
        "--user",
        "bob",
        "memory 1 of bob",
        "--json",
        embedder=embedder,
    )
    assert (
        orjson.loads(out.splitlines()[0])["content"] == "memory 1 of bob" and embedder.calls != []
    )


def test_get_and_stats(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "memories", "add", "--user", "ann", "Likes rye bread", "--pinned")
    memory_id = out.strip()
    code, out, _ = run(capsys, "memories", "get", "--user", "ann", memory_id)
    assert code == 0 and f"id:       {memory_id}\n" in out and "pinned:   yes\n" in out
    assert out.endswith("content:  Likes rye bread\n")  # every field, for people
    code, out, err = run(capsys, "memories", "get", "--user", "ann", memory_id, "--json")
    got = orjson.loads(out)
    assert code == 0 and (got["id"], got["content"], got["pinned"]) == (
        memory_id,
        "Likes rye bread",
        True,
    )
    code, out, err = run(capsys, "memories", "get", "--user", "bob", memory_id)
    assert code == 1 and out == "" and f"no memory {memory_id} of bob" in err  # not bob's
    code, out, _ = run(capsys, "memories", "stats", "--user", "ann")
    assert code == 0 and "memories: 1\n" in out and "by type:  fact 1\n" in out
    code, out, _ = run(capsys, "memories", "stats", "--user", "ann", "--json")
    stats = orjson.loads(out)
    assert code == 0 and (stats["total"], stats["pinned"], stats["by_type"]) == (1, 1, {"fact": 1})


def test_get_shows_content_in_full_and_as_it_is(capsys: pytest.CaptureFixture[str]) -> None:
    content = "Notes: [bold]not markup[/bold]\n" + "word " * 200
    memory_id = run(capsys, "memories", "add", "--user", "ann", content)[1].strip()
    code, out, _ = run(capsys, "memories", "get", "--user", "ann", memory_id)
    lines = out.splitlines()
    assert code == 0 and "content:  Notes: [bold]not markup[/bold]" in lines
    assert lines[-1] == " " * 10 + ("word " * 200).strip()  # one line, however long


def test_edit(capsys: pytest.CaptureFixture[str]) -> None:
    memory_id = run(capsys, "memories", "add", "--user", "ann", "Plays the cello")[1].strip()
    code, out, _ = run(capsys, "memories", "edit", "--user", "ann", memory_id, "--content",
                       "  Plays the viola  ", "--type", "preference", "--json")  # fmt: skip
    edited = orjson.loads(out)
    assert code == 0 and (edited["content"], edited["type"]) == ("Plays the viola", "preference")
    code, out, _ = run(capsys, "memories", "search", "--user", "ann", "viola", "--json")
    assert [orjson.loads(line)["id"] for line in out.splitlines()] == [memory_id]  # re-embedded
    code, out, _ = run(
        capsys, "memories", "edit", "--user", "ann", memory_id, "--metadata", '{"k": 1}'
    )
    assert code == 0 and 'metadata: {"k":1}' in out and "content:  Plays the viola" in out
    code, out, err = run(capsys, "memories", "edit", "--user", "bob", memory_id, "--type", "fact")
    assert code == 1 and out == "" and f"no memory {memory_id} of bob" in err
    got = orjson.loads(run(capsys, "memories", "get", "--user", "ann", memory_id, "--json")[1])
    assert (got["type"], got["metadata"]) == ("preference", {"k": 1})  # bob changed nothing


def test_pin_unpin_and_history(capsys: pytest.CaptureFixture[str]) -> None:
    memory_id = run(capsys, "memories", "add", "--user", "ann", "Owns a kayak")[1].strip()

    def pinned() -> bool:
        out = run(capsys, "memories", "get", "--user", "ann", memory_id, "--json")[1]
        return bool(orjson.loads(out)["pinned"])

    code, out, err = run(capsys, "memories", "pin", "--user", "ann", memory_id, "--json")
    assert code == 0 and orjson.loads(out) == {"pinned": 1, "not_found": []} and pinned()
    code, _, err = run(capsys, "memories", "pin", "--user", "ann", memory_id)  # already: no write
    assert code == 0 and "pinned 1 of 1" in err
    code, out, err = run(capsys, "memories", "unpin", "--user", "ann", "nope", memory_id, "--json")
    assert code == 1 and orjson.loads(out) == {"unpinned": 1, "not_found": ["nope"]}
    assert "no memory nope of ann" in err and not pinned()

    code, out, _ = run(capsys, "memories", "history", "--user", "ann", memory_id, "--json")
    events = [orjson.loads(line) for line in out.splitlines()]
    assert code == 0 and [(e["action"], e["actor"]) for e in events] == [
        ("created", "cli"),
        ("updated", "cli"),
        ("updated", "cli"),
    ]
    assert events[0]["after"] == "Owns a kayak" and events[0]["memory_id"] == memory_id
    code, out, _ = run(capsys, "memories", "history", "--user", "ann", memory_id)
    assert code == 0 and f"history of memory {memory_id}" in out and "created by cli" in out
    out = run(capsys, "memories", "get", "--user", "ann", memory_id, "--json")[1]
    assert orjson.loads(out)["source"] == "cli"  # written by the CLI, not the API
    code, out, err = run(capsys, "memories", "history", "--user", "bob", memory_id)
    assert code == 1 and out == "" and f"no history of memory {memory_id} of bob" in err


def test_reading_commands_do_not_load_the_model(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only add, search, import, index, edit of the content and delete of ids (what says the
    same goes too) embed; the rest must not load (maybe export) the model."""
    memory_id = run(capsys, "memories", "add", "--user", "ann", "Plays the cello")[1].strip()

    def no_model(*_: object) -> None:
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(cli_memory, "load_embedder", no_model)
    for argv in (
        ["memories", "list", "--user", "ann", "--json"],
        ["memories", "get", "--user", "ann", memory_id],
        ["memories", "stats", "--user", "ann"],
        ["memories", "history", "--user", "ann", memory_id],
        ["memories", "pin", "--user", "ann", memory_id],
        ["memories", "unpin", "--user", "ann", memory_id],
        ["memories", "edit", "--user", "ann", memory_id, "--type", "preference"],
        ["memories", "export", "--user", "ann"],
        ["users", "list"],
        ["jobs", "list"],
        ["memories", "move", "--from", "ann", "--to", "bob"],
        ["memories", "delete", "--user", "bob", "--all", "--yes"],
    ):
        code = cli.main(argv)
        assert code == 0, (argv, capsys.readouterr())
    with pytest.raises(AssertionError, match="the model was loaded"):  # search does embed
        cli.main(["memories", "search", "--user", "ann", "cello"])
    with pytest.raises(AssertionError, match="the model was loaded"):  # so does new content
        cli.main(["memories", "edit", "--user", "ann", "some-id", "--content", "Plays"])
    with pytest.raises(AssertionError, match="the model was loaded"):  # and a delete of ids
        cli.main(["memories", "delete", "--user", "ann", "some-id"])


def test_counts_are_pluralised(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    run(capsys, "memories", "add", "--user", "ann", "Has one memory")
    code, out, _ = run(capsys, "memories", "list", "--user", "ann")
    assert code == 0 and "1 memory of ann" in out
    code, _, err = run(
        capsys, "memories", "export", "--user", "ann", "--output", str(tmp_path / "x")
    )
    assert "exported 1 memory of ann" in err
    code, _, err = run(capsys, "jobs", "retry")
    assert code == 0 and "queued again: 0 failed jobs" in err
    code, _, err = run(capsys, "index", "rebuild")
    assert code == 0 and "indexed 1 memory of 1 user with" in err
