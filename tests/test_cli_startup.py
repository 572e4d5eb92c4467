"""What `memproxy` says when it cannot start: a bad or misspelt setting, a database it cannot
open, or none where a reading command looks. Run as the operator runs it (a subprocess, from a
folder of its own) where the exit status and the whole of stderr matter."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
import uvicorn

from app import cli
from tests.fakes import FakeEmbedder
from tests.helpers import free_port


def memproxy(cwd: Path, *argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`memproxy ARGV` in `cwd` with `env` as its only MEMPROXY_ variables."""
    environ = {k: v for k, v in os.environ.items() if not k.upper().startswith("MEMPROXY_")}
    return subprocess.run(
        [sys.executable, "-m", "app.cli", *argv],
        cwd=cwd,
        env=environ | env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        ("MEMPROXY_RECALL_LIMIT", "abc", "expected an integer between 0 and 100"),
        ("MEMPROXY_RECALL_LIMIT", "-1", "expected an integer between 0 and 100"),
        ("MEMPROXY_LOG_FORMAT", "yaml", "expected one of text, json"),
        ("MEMPROXY_RELEVANCE_THRESHOLD", "2", "expected a number between 0 and 1"),
        ("MEMPROXY_LOG_LEVEL", "LOUD", "expected one of DEBUG, INFO, WARNING, ERROR, CRITICAL"),
    ],
)
def test_a_bad_setting_is_one_line_naming_the_variable(
    tmp_path: Path, variable: str, value: str, expected: str
) -> None:
    done = memproxy(tmp_path, "ready", **{variable: value})
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == [f"memproxy: {variable} is '{value}': {expected}"]


@pytest.mark.parametrize(
    ("variable", "value", "shown"),
    [
        (
            "MEMPROXY_UPSTREAM_BASE_URL",
            "admin:hunter2@ollama:11434/v1",
            "admin:***@ollama:11434/v1",
        ),
        ("MEMPROXY_MANAGER_BASE_URL", "ftp://u:hunter2@h/v1", "ftp://u:***@h/v1"),
    ],
)
def test_a_bad_url_setting_never_shows_its_password(
    tmp_path: Path, variable: str, value: str, shown: str
) -> None:
    done = memproxy(tmp_path, "ready", **{variable: value})
    assert done.returncode == 2 and "hunter2" not in done.stderr
    assert done.stderr.startswith(f"memproxy: {variable} is '{shown}': ")


@pytest.mark.parametrize(
    "argv",
    [
        ["serve"],
        ["ready"],
        ["db", "upgrade"],
        ["model", "prepare"],
        ["memories", "list", "--user", "alice"],
        ["jobs", "list"],
    ],
)
def test_every_command_reports_bad_settings_the_same_way(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    def never(*_: Any, **__: Any) -> None:
        raise AssertionError("serve started with bad settings")

    monkeypatch.setattr(uvicorn, "run", never)
    monkeypatch.setenv("MEMPROXY_PORT", "eighty")
    monkeypatch.setenv("MEMPROXY_RECALL_LIMIT", "101")
    assert cli.main(argv, embedder=FakeEmbedder()) == 2
    assert capsys.readouterr().err.splitlines() == [
        "memproxy: MEMPROXY_PORT is 'eighty': expected an integer between 1 and 65535",
        "memproxy: MEMPROXY_RECALL_LIMIT is '101': expected an integer between 0 and 100",
    ]


def test_a_misspelt_variable_is_named_with_the_closest_setting(tmp_path: Path) -> None:
    (tmp_path / ".env").write_text("MEMPROXY_LOG_FORMT=json\nSTACK_OLLAMA_TAG=latest\n")
    url = f"http://127.0.0.1:{free_port()}/readyz"  # nothing listens: `ready` says so, exits 1
    done = memproxy(tmp_path, "ready", "--url", url, MEMPROXY_RECAL_LIMIT="3", STACK_X="1")
    assert done.returncode == 1
    warnings = [line for line in done.stderr.splitlines() if "warning" in line]
    assert warnings == [
        "memproxy: warning: MEMPROXY_LOG_FORMT (in .env) is not a memproxy setting and is "
        "ignored; did you mean MEMPROXY_LOG_FORMAT?",
        "memproxy: warning: MEMPROXY_RECAL_LIMIT (in the environment) is not a memproxy setting "
        "and is ignored; did you mean MEMPROXY_RECALL_LIMIT?",
    ]


@pytest.mark.parametrize("argv", [["db", "upgrade"], ["serve", "--port", "1"]])
def test_a_database_that_cannot_be_opened_is_one_line(tmp_path: Path, argv: list[str]) -> None:
    (tmp_path / "afile").write_text("")  # a folder that is a file fails for root too
    database = tmp_path / "afile" / "data" / "memproxy.db"
    done = memproxy(tmp_path, *argv, MEMPROXY_DATABASE_URL=f"sqlite+aiosqlite:///{database}")
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"memproxy: cannot open the database at {database} (MEMPROXY_DATABASE_URL): "
        f"{tmp_path / 'afile'} is a file, not a folder"
    ]


@pytest.mark.skipif(not Path("/sys/kernel").is_dir(), reason="needs Linux's /sys")
def test_a_database_under_sys_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["db", "upgrade", "--database", "/sys/memproxy-test/memproxy.db"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(
        "memproxy: cannot open the database at /sys/memproxy-test/memproxy.db (--database): "
        "cannot create the folder /sys/memproxy-test: "
    )


def test_reading_in_an_empty_folder_creates_nothing(tmp_path: Path) -> None:
    done = memproxy(tmp_path, "memories", "list", "--user", "alice")
    assert done.returncode == 2 and list(tmp_path.iterdir()) == []
    assert done.stderr.splitlines() == [
        f"memproxy: no memproxy database at {tmp_path / 'data' / 'memproxy.db'} "
        "(MEMPROXY_DATABASE_URL); run from the folder memproxy serves from or pass --database"
    ]


@pytest.mark.parametrize(
    "argv",
    [
        ["memories", "list", "--user", "a"],
        ["memories", "search", "--user", "a", "q"],
        ["memories", "get", "--user", "a", "some-id"],
        ["memories", "stats", "--user", "a"],
        ["memories", "export", "--user", "a"],
        ["memories", "delete", "--user", "a", "some-id"],
        ["jobs", "list"],
        ["jobs", "retry"],
        ["index", "rebuild"],
    ],
)
def test_commands_that_read_never_create_a_database(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    argv: list[str],
) -> None:
    database = tmp_path / "data" / "memproxy.db"
    monkeypatch.setenv("MEMPROXY_DATABASE_URL", f"sqlite+aiosqlite:///{database}")
    assert cli.main(argv, embedder=FakeEmbedder()) == 2
    err = capsys.readouterr().err
    assert f"no memproxy database at {database} (MEMPROXY_DATABASE_URL)" in err
    assert not (tmp_path / "data").exists()


def test_database_flag_takes_a_path_or_a_url_and_is_named_first(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    elsewhere = tmp_path / "not-this.db"
    monkeypatch.setenv("MEMPROXY_DATABASE_URL", f"sqlite+aiosqlite:///{elsewhere}")
    served = tmp_path / "srv" / "memproxy.db"
    as_url = f"sqlite+aiosqlite:///{served}"
    runs = [
        (["db", "upgrade", "--database", "srv/memproxy.db"], 0),
        (["memories", "add", "--user", "ann", "Owns a kayak", "--database", "srv/memproxy.db"], 0),
        (["memories", "list", "--user", "ann", "--json", "--database", as_url], 0),
        (["jobs", "list", "--database", str(served)], 0),
        (["index", "rebuild", "--database", str(served)], 0),
    ]
    outputs = []
    for argv, status in runs:
        monkeypatch.setenv("MEMPROXY_DATABASE_URL", f"sqlite+aiosqlite:///{elsewhere}")
        assert cli.main(argv, embedder=FakeEmbedder()) == status, argv
        out, err = capsys.readouterr()
        assert err.splitlines()[0] == f"database: {served}", argv
        outputs.append(out)
    assert [orjson.loads(line)["content"] for line in outputs[2].splitlines()] == ["Owns a kayak"]
    assert not elsewhere.exists()


def test_serve_takes_the_database_flag(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: calls.append(kw))
    assert cli.main(["serve", "--database", str(tmp_path / "served.db")]) == 0
    # The app reads it from the environment, as it reads --host and --port.
    assert os.environ["MEMPROXY_DATABASE_URL"] == f"sqlite+aiosqlite:///{tmp_path / 'served.db'}"
    assert len(calls) == 1


def test_a_file_that_is_no_database_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("shopping list: " + "eggs, " * 40)
    assert cli.main(["memories", "list", "--user", "a", "--database", str(notes)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"database: {notes}",
        f"memproxy: cannot use the database at {notes} (--database): file is not a database",
    ]
