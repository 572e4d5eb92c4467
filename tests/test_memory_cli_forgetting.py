"""`memproxy memories forget [--dry-run]`, `forgotten` and `restore` (issue 27, point 4) on the
test's own database: the dry run lists what would leave with its reason and changes nothing;
forgetting moves it to the forgotten memories; restore puts one back (exit 1 for an id that is
not a forgotten memory of the user)."""

from __future__ import annotations

import orjson
import pytest

from tests.test_memory_cli import run


def test_forget_dry_run_forgotten_and_restore(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = []
    for text in ("Ann sails", "Ann knits", "Ann bakes bread"):
        code, out, _ = run(capsys, "memories", "add", "--user", "ann", text)
        ids.append(out.strip())
    monkeypatch.setenv("MEMPROXY_MAX_FACTS", "1")
    code, out, err = run(capsys, "memories", "forget", "--user", "ann", "--dry-run", "--json")
    planned = [orjson.loads(line) for line in out.splitlines()]
    assert code == 0 and [m["id"] for m in planned] == ids[:2]  # the least recently written
    assert planned[0]["reason"].startswith("over the capacity of 1 facts (3 held)")
    assert "would forget 2 memories of ann (capacities: facts 1, episodes 50000)" in err
    code, out, _ = run(capsys, "memories", "list", "--user", "ann", "--json")
    assert len(out.splitlines()) == 3

    code, out, err = run(capsys, "memories", "forget", "--user", "ann")
    assert code == 0 and "forgot 2 memories of ann" in err and "Ann sails" in out
    code, out, _ = run(capsys, "memories", "forgotten", "--user", "ann", "--json")
    assert code == 0 and {orjson.loads(line)["id"] for line in out.splitlines()} == set(ids[:2])

    code, out, err = run(capsys, "memories", "restore", "--user", "ann", ids[0], "--json")
    assert code == 0 and orjson.loads(out)["content"] == "Ann sails" and f"put back {ids[0]}" in err
    code, _, err = run(capsys, "memories", "restore", "--user", "ann", ids[0])
    assert code == 1 and f"no forgotten memory {ids[0]} of ann" in err
    code, _, err = run(capsys, "memories", "restore", "--user", "bob", ids[1])
    assert code == 1
    code, out, _ = run(capsys, "memories", "forgotten", "--user", "ann")
    assert code == 0 and "Ann knits" in out and "Ann sails" not in out


def test_forget_needs_a_user(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        run(capsys, "memories", "forget", "--dry-run")
    assert exited.value.code == 2
