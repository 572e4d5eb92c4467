"""The memory commands that write: ``memories add|edit|pin|unpin|profile|unprofile|delete|move|
import`` (see app/cli/memory.py), with the memory API's validation and limits
(app/schemas/memories.py).

``add --file`` and ``import`` write in batches of :data:`BATCH` memories, one transaction and one
step of the progress bar each: a failure part way (an id another user has) leaves the batches
before it written, and says how many.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import orjson
from pydantic import ValidationError

from app.cli.show import Command, describe, plural, progress, show_memory, write_memories
from app.memory.store.records import Changes, MemoryRecord, NewMemory
from app.memory.store.tables import MemorySource
from app.schemas.memories import MemoryCreate, MemoryUpdate, check_length
from app.schemas.memory_lines import read_import

CLI = MemorySource.CLI
"""Who the memories and their history say wrote: the CLI, not the API."""

BATCH = 256
"""Memories per :meth:`MemoryService.add` call in ``add --file`` and ``import``."""


async def _add(c: Command) -> int:
    items = _new_memories(c)
    records, _ = await _write_batches(c, items, "adding")
    if c.json:
        write_memories(records)
    else:
        print("\n".join(r.id for r in records))
    c.note(f"added {plural(len(records), 'memory', 'memories')} of {c.args.user}")
    return 0


def _new_memories(c: Command) -> list[NewMemory]:
    """The memory given, or one per non-blank line of --file, each checked as the API checks
    one (a line's problem names the line)."""
    args = c.args
    metadata = _metadata(args.metadata)
    if args.file is None:
        lines = [(0, args.content)]
    else:
        lines = [(n, text) for n, text in _lines(args.file) if text.strip()]
        if not lines:
            raise ValueError(f"nothing to add: {args.file} has no line of text")
    items = []
    for number, text in lines:
        where = f"line {number}: " if number else ""
        try:
            body = MemoryCreate(content=text, type=args.type, pinned=args.pinned,
                                profile=args.profile, observed_at=args.observed_at,
                                metadata=metadata)  # fmt: skip
        except ValidationError as exc:
            raise ValueError(where + describe(exc)) from None
        param = f"line {number}.content" if number else "content"
        check_length(body.content, c.settings.memory_max_chars, param)
        items.append(NewMemory(body.content, body.type, body.metadata, body.pinned, CLI,
                               profile=body.profile, observed_at=body.observed_at))  # fmt: skip
    return items


def _metadata(text: str) -> Any:
    """--metadata, parsed (whether it is an object is checked with the rest of the memory)."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"--metadata is not JSON: {exc}") from None


def _lines(path: str) -> list[tuple[int, str]]:
    """A UTF-8 text file's lines, numbered from 1 (split at line feeds only)."""
    try:
        text = _read(path).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path} is not UTF-8 text: {exc}") from None
    return list(enumerate(text.split("\n"), start=1))


def _read(path: str | None) -> bytes:
    """The file's bytes; standard input's when no path is given."""
    if path is None:
        return sys.stdin.buffer.read()
    with open(path, "rb") as source:
        return source.read()


async def _write_batches(
    c: Command, items: Sequence[NewMemory], doing: str
) -> tuple[list[MemoryRecord], int]:
    """Add the memories to the user's, :data:`BATCH` at a time, with a progress bar: the
    records (one per item) and how many were created (not there already)."""
    records: list[MemoryRecord] = []
    created = 0
    with progress(c, doing, len(items)) as advance:
        for start in range(0, len(items), BATCH):
            batch = items[start : start + BATCH]
            try:
                written = await c.memory.add(c.args.user, batch)
            except Exception:
                if start:  # the batches before it are written
                    c.note(f"stopped after {plural(created, 'memory', 'memories')} were written")
                raise
            records += written.records
            created += sum(written.created)
            advance(len(batch))
    return records, created


async def _import(c: Command) -> int:
    # No cap on lines here (the HTTP route has one): the batches and the bar are for big files.
    items = read_import(
        _read(c.args.file), c.settings.memory_max_chars, new_ids=c.args.ids == "new", max_lines=None
    )
    _, created = await _write_batches(c, items, "importing")
    skipped = len(items) - created
    note = f"imported {created}, skipped {skipped} (ids already there)"
    return c.finish({"imported": created, "skipped": skipped}, note)


async def _edit(c: Command) -> int:
    args = c.args
    given: dict[str, Any] = {"content": args.content, "type": args.type,
                             "observed_at": args.observed_at}  # fmt: skip
    if args.metadata is not None:
        given["metadata"] = _metadata(args.metadata)
    changes = MemoryUpdate(**given).model_dump(exclude_none=True)
    if not changes:
        raise ValueError("nothing to change: give --content, --type, --metadata or --observed-at")
    if "content" in changes:
        check_length(changes["content"], c.settings.memory_max_chars, "content")
    record = await c.memory.update(args.user, args.id, actor=CLI, **changes)
    if record is None:
        return c.not_found(args.id)
    show_memory(record, as_json=c.json)
    return 0


_MARKS = {
    "pin": ("pinned", True, "pinned", ""),
    "unpin": ("pinned", False, "unpinned", ""),
    "profile": ("profile", True, "marked", " as profile facts"),
    "unprofile": ("profile", False, "unmarked", " as profile facts"),
}
"""What each marking command sets and to what, the key of its result, and what its note adds."""


async def _pin(c: Command) -> int:
    """``pin``, ``unpin``, ``profile`` or ``unprofile`` (by the handler's name): only memories
    not so already are written (no embedding: the content does not change). Exit 1 when an id
    is not the user's."""
    field, value, key, what = _MARKS[c.args.handler]
    change: Changes = {"pinned": value} if field == "pinned" else {"profile": value}
    missing = []
    for memory_id in c.args.ids:
        record = await c.memory.get(c.args.user, memory_id)
        if record is None:
            missing.append(memory_id)
        elif getattr(record, field) != value:
            await c.memory.update(c.args.user, memory_id, actor=CLI, **change)
    done = len(c.args.ids) - len(missing)
    unknown = f"; no memory {', '.join(missing)} of {c.args.user}" if missing else ""
    result = {key: done, "not_found": missing}
    note = f"{key} {done} of {len(c.args.ids)}{what}{unknown}"
    return c.finish(result, note, ok=not missing)


async def _delete(c: Command) -> int:
    """The ids given (exit 1 when some were not the user's), or with --all --yes every one."""
    args = c.args
    if args.all:
        if not args.yes or args.ids:
            raise ValueError("--all deletes every memory of the user: add --yes (and no ids)")
        deleted = await c.memory.delete_all(args.user, actor=CLI)
        note = f"deleted {plural(deleted, 'memory', 'memories')} of {args.user}"
        return c.finish({"deleted": deleted}, note)
    if not args.ids:
        raise ValueError("name the ids to delete, or --all --yes")
    removed = await c.memory.delete(args.user, args.ids, actor=CLI)
    deleted, also = len(removed.ids), [r.id for r in removed.also]
    result = {"deleted": deleted, "requested": len(args.ids), "also_deleted": also}
    note = f"deleted {deleted} of {len(args.ids)}"
    if also:  # the episodes they were written from, memories saying the same
        note += f", and {plural(len(also), 'memory', 'memories')} that went with them"
    return c.finish(result, note, ok=deleted == len(args.ids))


async def _move(c: Command) -> int:
    """Every memory (and job not running) of --from to --to; exit 1 when there was none."""
    args = c.args
    moved = await c.memory.move(args.from_user, args.to_user, actor=CLI)
    count = len(moved.keys)
    result = {"moved": count, "jobs": moved.jobs, "from_user": args.from_user,
              "to_user": args.to_user}  # fmt: skip
    if not (count or moved.jobs):
        note = f"nothing to move: {args.from_user} has no memories and no jobs"
        return c.finish(result, note, ok=False)
    note = (f"moved {plural(count, 'memory', 'memories')} and {plural(moved.jobs, 'job')} "
            f"from {args.from_user} to {args.to_user}")  # fmt: skip
    return c.finish(result, note)


HANDLERS: dict[str, Callable[[Command], Awaitable[int]]] = {
    "add": _add,
    "import": _import,
    "edit": _edit,
    "pin": _pin,
    "unpin": _pin,
    "profile": _pin,
    "unprofile": _pin,
    "delete": _delete,
    "move": _move,
}
