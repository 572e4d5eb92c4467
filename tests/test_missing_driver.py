"""A database URL whose driver is not installed (the image once lacked asyncpg): one line naming
the package to install and exit 2, for every command that opens the database, never a traceback.

The missing module is simulated the way Python reports it: a folder first on PYTHONPATH holds an
``asyncpg`` package whose import raises ModuleNotFoundError, as an absent one would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

URL = "postgresql+asyncpg://memproxy:secret@127.0.0.1:1/memproxy"
LINE = (
    "memproxy: the database at postgresql+asyncpg://memproxy:***@127.0.0.1:1/memproxy "
    "(MEMPROXY_DATABASE_URL) needs the driver asyncpg, which is not installed: "
    "pip install 'memproxy[postgres]'"
)


def without_asyncpg(tmp_path: Path, argv: list[str]) -> subprocess.CompletedProcess[str]:
    shadow = tmp_path / "shadow" / "asyncpg"
    shadow.mkdir(parents=True, exist_ok=True)
    (shadow / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'asyncpg'\", name='asyncpg')\n"
    )
    environ = {k: v for k, v in os.environ.items() if not k.upper().startswith("MEMPROXY_")}
    root = Path(__file__).parent.parent
    environ |= {"PYTHONPATH": f"{shadow.parent}{os.pathsep}{root}", "MEMPROXY_DATABASE_URL": URL}
    return subprocess.run(
        [sys.executable, *argv], cwd=tmp_path, env=environ, capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip


@pytest.mark.parametrize(
    "argv",
    [["serve"], ["db", "upgrade"], ["users", "list"], ["memories", "list", "--user", "a"]],
    ids=["serve", "db-upgrade", "users-list", "memories-list"],
)
def test_a_missing_driver_is_one_line_naming_the_extra(tmp_path: Path, argv: list[str]) -> None:
    done = without_asyncpg(tmp_path, ["-m", "app.cli", *argv])
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [LINE]
    assert "secret" not in done.stderr


def test_the_served_factory_says_the_same(tmp_path: Path) -> None:
    """`uvicorn app.main:create_served_app --factory`, without the CLI in front of it."""
    argv = ["-m", "uvicorn", "app.main:create_served_app", "--factory", "--port", "1"]
    done = without_asyncpg(tmp_path, argv)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [LINE]
