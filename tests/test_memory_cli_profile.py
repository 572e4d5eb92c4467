"""`memproxy memories ...` and a memory's `observed_at` and `profile` (issue 25, points 5 and 6):
``add --profile --observed-at``, ``edit --observed-at``, ``profile`` / ``unprofile`` (as
``pin`` / ``unpin``), ``list --profile|--no-profile``; every view shows both. Bad dates are
exit 2 naming the field, with nothing written."""

from __future__ import annotations

import orjson
import pytest

from app import cli
from tests.fakes import FakeEmbedder


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(["memories", *argv], embedder=FakeEmbedder())
    out, err = capsys.readouterr()
    return code, out, err


def listed(capsys: pytest.CaptureFixture[str], *flags: str) -> list[str]:
    code, out, _ = run(capsys, "list", "--user", "ann", "--json", *flags)
    assert code == 0
    return sorted(orjson.loads(line)["content"] for line in out.splitlines())


def test_add_edit_mark_list_and_show(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "add", "--user", "ann", "Is vegetarian", "--profile",
                       "--observed-at", "2024-05-01T09:30:00+02:00", "--json")  # fmt: skip
    veg = orjson.loads(out)
    assert code == 0 and (veg["profile"], veg["observed_at"]) == (True, "2024-05-01T07:30:00Z")
    tea = run(capsys, "add", "--user", "ann", "Likes tea")[1].strip()
    assert listed(capsys, "--profile") == ["Is vegetarian"]
    assert listed(capsys, "--no-profile") == ["Likes tea"]

    code, out, _ = run(capsys, "list", "--user", "ann")
    assert "fact · 2024-05-01 · profile" in out  # the day it was said, and the mark
    code, out, _ = run(capsys, "get", "--user", "ann", veg["id"])
    assert "profile:  yes\n" in out and "observed: 2024-05-01 07:30:00\n" in out

    code, out, err = run(capsys, "profile", "--user", "ann", tea, "--json")
    assert code == 0 and orjson.loads(out) == {"marked": 1, "not_found": []}
    assert "marked 1 of 1 as profile facts" in err
    assert listed(capsys, "--profile") == ["Is vegetarian", "Likes tea"]
    code, out, err = run(capsys, "unprofile", "--user", "ann", "nope", veg["id"], "--json")
    assert code == 1 and orjson.loads(out) == {"unmarked": 1, "not_found": ["nope"]}
    assert listed(capsys, "--profile") == ["Likes tea"]

    code, out, _ = run(capsys, "edit", "--user", "ann", tea, "--observed-at",
                       "2023-12-31T23:00:00Z", "--json")  # fmt: skip
    edited = orjson.loads(out)
    assert code == 0 and (edited["observed_at"], edited["content"]) == (
        "2023-12-31T23:00:00Z", "Likes tea",
    )  # fmt: skip
    code, out, _ = run(capsys, "history", "--user", "ann", tea, "--json")
    details = [orjson.loads(line)["detail"] for line in out.splitlines()]
    assert details[1] == "profile" and details[2].startswith("observed ")
    assert details[2].endswith(" -> 2023-12-31 23:00Z")
    code, out, _ = run(capsys, "stats", "--user", "ann")
    assert "profile:  1\n" in out


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["add", "--user", "ann", "x", "--observed-at", "2024-05-01T09:30"], "observed_at"),
        (["add", "--user", "ann", "x", "--observed-at", "2999-01-01T00:00Z"], "a day from now"),
        (["add", "--user", "ann", "x", "--observed-at", "last May"], "observed_at"),
        (["edit", "--user", "ann", "ID", "--observed-at", "2024-05-01"], "observed_at"),
    ],
    ids=["naive", "future", "words", "edit naive"],
)
def test_a_bad_date_is_exit_2_and_writes_nothing(
    capsys: pytest.CaptureFixture[str], argv: list[str], says: str
) -> None:
    kept = run(capsys, "add", "--user", "ann", "Likes tea", "--json")[1]
    argv = [orjson.loads(kept)["id"] if a == "ID" else a for a in argv]
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == "" and says in err
    assert listed(capsys) == ["Likes tea"]
    assert run(capsys, "get", "--user", "ann", orjson.loads(kept)["id"], "--json")[1] == kept
