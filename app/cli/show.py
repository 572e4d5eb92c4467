"""What the memory commands (app/cli/memory.py) show, and where.

- stdout carries the result alone: tables and ``key: value`` lines for people; with ``--json``,
  machine output (JSON Lines for lists, one JSON object for a result) and nothing else;
- stderr carries everything else: notes, errors and progress bars; a bar is drawn only on a
  terminal, never with ``--json``;
- ids are shown whole: their table columns never wrap, and fold rather than cut an id when a
  terminal is too narrow even for them (at 50 columns and more, an id stays on one line);
- user content is shown as it is, never read as rich markup.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson
from pydantic import ValidationError
from rich import box
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table
from rich.text import Text

from app.config import Settings
from app.errors import MemproxyError
from app.memory.service import MemoryService
from app.memory.store.claims import IdTaken
from app.memory.store.records import MemoryRecord
from app.schemas.memory_lines import export_line

ID_HEADERS = frozenset({"id", "job", "user", "event"})
"""Table columns that show ids (an event shows its job's): never wrapped."""


@dataclass(frozen=True, slots=True)
class Command:
    """One run of a command: the memory service, the settings, the flags, and stderr."""

    memory: MemoryService
    settings: Settings
    args: argparse.Namespace
    err: Console

    @property
    def json(self) -> bool:
        """``--json``: machine output alone on stdout, no progress bar."""
        return bool(getattr(self.args, "json", False))

    def note(self, text: str) -> None:
        """One line on stderr, as it is (no markup, never wrapped)."""
        self.err.print(text, markup=False, highlight=False, soft_wrap=True)

    def finish(self, result: Mapping[str, Any], note: str, *, ok: bool = True) -> int:
        """End with a result: one JSON object on stdout with --json, and the note on stderr;
        the exit status, 0 when `ok`, else 1."""
        if self.json:
            write_lines([result])
        self.note(note)
        return 0 if ok else 1

    def not_found(self, memory_id: str) -> int:
        """Say the user has no memory with this id; the exit status for it (1)."""
        self.note(f"no memory {memory_id} of {self.args.user}")
        return 1


def write_lines(rows: Iterable[Any]) -> None:
    """JSON Lines on stdout, one row (anything orjson writes) per line."""
    sys.stdout.flush()
    sys.stdout.buffer.write(b"".join(orjson.dumps(row) + b"\n" for row in rows))


def write_memories(records: Iterable[MemoryRecord]) -> None:
    """Memories as JSON Lines on stdout, as `memories export` writes them."""
    sys.stdout.flush()
    sys.stdout.buffer.write(b"".join(export_line(record) for record in records))


def plural(count: int, word: str, words: str | None = None) -> str:
    """`1 memory`, `2 memories`, `0 users`."""
    return f"{count} {word if count == 1 else (words or word + 's')}"


def stamp(value: datetime | None) -> str:
    """A time as people read it: UTC, to the second; ``-`` for none."""
    return "-" if value is None else value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def show_fields(pairs: Sequence[tuple[str, str]]) -> None:
    """``key: value`` lines on stdout, values whole (a value's later lines indented under it)."""
    width = max(len(key) for key, _ in pairs) + 2
    for key, value in pairs:
        first, *rest = value.split("\n")
        print(f"{key + ':':<{width}}{first}")
        for line in rest:
            print(" " * width + line)


def show_memory(record: MemoryRecord, *, as_json: bool) -> None:
    """A memory on stdout: its JSON line, or every field (its content in full) for people."""
    if as_json:
        write_memories([record])
        return
    recalled = "never" if record.last_recalled_at is None else stamp(record.last_recalled_at)
    show_fields([
        ("id", record.id), ("user", record.user_id), ("type", record.type),
        ("pinned", "yes" if record.pinned else "no"),
        ("profile", "yes" if record.profile else "no"), ("source", record.source),
        ("observed", stamp(record.observed_at)),
        ("created", stamp(record.created_at)), ("updated", stamp(record.updated_at)),
        ("recalled", f"{plural(record.recall_count, 'time')}, last {recalled}"),
        ("metadata", orjson.dumps(record.metadata).decode()), ("content", record.content),
    ])  # fmt: skip


def new_table(title: str, *headers: str) -> Table:
    """A table for stdout, at least as wide as its title (so an id in it is not broken):
    columns of :data:`ID_HEADERS` keep their lines whole, the others wrap to what the
    terminal leaves them."""
    table = Table(
        title=Text(title), title_justify="left", box=box.SIMPLE_HEAD, min_width=len(title)
    )
    for header in headers:
        table.add_column(header, no_wrap=header in ID_HEADERS, overflow="fold")
    return table


def memory_cell(record: MemoryRecord) -> Text:
    """A memory in a table: its type, the day it was said, pin and profile marks, dimmed, over
    its content."""
    about = " · ".join([record.type, record.observed_at.date().isoformat()] + (
        ["pinned"] if record.pinned else []) + (["profile"] if record.profile else [])
    )  # fmt: skip
    return Text.assemble((about, "dim"), "\n", record.content)


def show_table(table: Table) -> None:
    """The table on stdout, as wide as the terminal allows (80 columns when not a terminal)."""
    Console(highlight=False).print(table)


def describe(exc: Exception) -> str:
    """An error as one line for stderr."""
    if isinstance(exc, MemproxyError):
        return f"{exc.message}" + (f" ({exc.param})" if exc.param else "")
    if isinstance(exc, IdTaken):
        return f"memory id {exc} is already in use"
    if isinstance(exc, ValidationError):
        first = exc.errors()[0]
        return f"{'.'.join(str(p) for p in first['loc'])}: {first['msg']}"
    return str(exc)


class RateColumn(ProgressColumn):
    """Items per second, e.g. ``1,234/s``: rich's recent rate, or the mean so far while rich has
    too few steps for one (``?/s`` until the first item is done)."""

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        if speed is None and task.completed and task.elapsed is not None:
            # At least a millisecond: a batch done within the clock's resolution is still a rate.
            speed = task.completed / max(task.elapsed, 0.001)
        return Text("?/s" if speed is None else f"{speed:,.0f}/s", style="progress.data.speed")


@contextmanager
def progress(c: Command, description: str, total: int) -> Iterator[Callable[[int], None]]:
    """A bar on stderr with the count done, the rate and the time taken, advanced by the
    function given; drawn only on a terminal and never with ``--json`` (the function then does
    nothing)."""
    if c.json or not c.err.is_terminal:
        yield lambda _: None
        return
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), RateColumn(),
               TimeElapsedColumn())  # fmt: skip
    with Progress(*columns, console=c.err) as bar:
        task = bar.add_task(description, total=total)
        yield lambda done: bar.advance(task, done)
