"""The memory commands that read: ``memories list|get|stats|history|search|export`` (see
app/cli/memory.py). None of them changes anything; only search embeds (the query)."""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import BinaryIO

from rich.text import Text

from app.cli.show import (
    Command,
    memory_cell,
    new_table,
    plural,
    show_fields,
    show_memory,
    show_table,
    stamp,
    write_lines,
    write_memories,
)
from app.memory.store.events import Event
from app.memory.store.tables import MemoryType
from app.schemas.memories import MemoryEventPublic, MemoryPublic
from app.schemas.memory_lines import export_line


async def _list(c: Command) -> int:
    args = c.args
    types = [MemoryType(t) for t in args.type or ()]
    records, total = await c.memory.page(
        args.user, types=types, contains=args.contains, profile=args.profile, limit=args.limit
    )
    if c.json:
        write_memories(records)
        return 0
    table = new_table(f"{plural(total, 'memory', 'memories')} of {args.user}", "id", "memory")
    for r in records:
        table.add_row(r.id, memory_cell(r))
    show_table(table)
    return 0


async def _get(c: Command) -> int:
    record = await c.memory.get(c.args.user, c.args.id)
    if record is None:
        return c.not_found(c.args.id)
    show_memory(record, as_json=c.json)
    return 0


async def _stats(c: Command) -> int:
    stats = await c.memory.store.stats(c.args.user)  # the server's index cache is not this one
    if c.json:
        write_lines([stats])
        return 0
    by_type = ", ".join(f"{t} {n}" for t, n in sorted(stats["by_type"].items()))
    show_fields([
        ("user", c.args.user), ("memories", str(stats["total"])), ("by type", by_type or "-"),
        ("pinned", str(stats["pinned"])), ("profile", str(stats["profile"])),
        ("recalled", plural(stats["recall_count"], "time")),
        ("oldest", stamp(stats["oldest"])), ("newest", stamp(stats["newest"])),
        ("version", str(stats["version"])),
    ])  # fmt: skip
    return 0


async def _history(c: Command) -> int:
    found = await c.memory.history(c.args.user, c.args.id)
    if not found:
        c.note(f"no history of memory {c.args.id} of {c.args.user}")
        return 1
    if c.json:
        write_lines(
            MemoryEventPublic.model_validate(e, from_attributes=True).model_dump(mode="json")
            for e in found
        )
        return 0
    table = new_table(f"history of memory {c.args.id}", "event", "change")
    for event in found:
        table.add_row(_event_cell(event), _change_cell(event))
    show_table(table)
    return 0


def _event_cell(event: Event) -> Text:
    """When, what and who; the Manager job, in full, when there was one."""
    lines = [stamp(event.created_at), f"{event.action} by {event.actor}"]
    return Text("\n".join(lines + ([f"job {event.job_id}"] if event.job_id else [])))


def _change_cell(event: Event) -> Text:
    """``before → after`` (one text when it did not change), the event's detail under it."""
    texts = [t for t in (event.before, event.after) if t is not None]
    change = texts[0] if len(set(texts)) == 1 else " → ".join(texts)
    if event.detail:
        return Text.assemble(change, "\n", (event.detail, "dim"))
    return Text(change)


async def _search(c: Command) -> int:
    args = c.args
    if not 1 <= args.limit <= 100:
        raise ValueError("--limit must be between 1 and 100")
    min_score = c.settings.relevance_threshold if args.min_score is None else args.min_score
    found = await c.memory.search(args.user, args.query, limit=args.limit, min_score=min_score)
    if c.json:
        write_lines(
            MemoryPublic.of(f.memory).model_dump(mode="json") | {"score": round(f.hit.score, 6)}
            for f in found
        )
        return 0
    table = new_table(f"{len(found)} found", "score", "id", "memory")
    for f in found:
        table.add_row(f"{f.hit.score:.3f}", f.memory.id, memory_cell(f.memory))
    show_table(table)
    return 0


async def _export(c: Command) -> int:
    """JSON Lines to --output or stdout (``--json`` changes nothing: it is JSON already)."""
    count = 0
    with _output(c.args.output) as out:
        async for record, linked in c.memory.export_linked(c.args.user):
            out.write(export_line(record, linked))
            count += 1
    c.note(f"exported {plural(count, 'memory', 'memories')} of {c.args.user}")
    return 0


@contextmanager
def _output(path: str | None) -> Iterator[BinaryIO]:
    """The file at `path`, written from the start; else stdout (left open)."""
    if path is None:
        yield sys.stdout.buffer
        return
    with open(path, "wb") as out:
        yield out


HANDLERS: dict[str, Callable[[Command], Awaitable[int]]] = {
    "list": _list,
    "get": _get,
    "stats": _stats,
    "history": _history,
    "search": _search,
    "export": _export,
}
