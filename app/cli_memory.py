"""``memproxy memories ...`` and ``memproxy index rebuild``: the memory API for operators, straight
on the database (same service, same validation, same limits as the HTTP API).

    memproxy memories list   --user U [--type T] [--contains TEXT] [--limit N] [--json]
    memproxy memories get    --user U ID                      (one JSON line)
    memproxy memories stats  --user U                         (counts, as JSON)
    memproxy memories add    --user U "content" [--type T] [--pinned] [--metadata JSON]
    memproxy memories search --user U "query" [--limit N] [--min-score S] [--json]
    memproxy memories delete --user U ID [ID ...] | --all --yes
    memproxy memories export --user U [--output FILE]        (JSON Lines; stdout by default)
    memproxy memories import --user U [FILE]                 (JSON Lines; stdin by default)
    memproxy index rebuild [--user U]   re-embed what the configured model has no vectors for,
                                        and check every user's index builds (with progress)
    memproxy jobs list|retry [--user U] the Manager's queue: counts and failures; re-queue them

Every one takes ``--database``. Only the commands that embed (add, search, import, index) load
the model: the others read the database alone, and start at once.

Exit status: 0 done, 1 nothing found (get/delete of unknown ids), 2 bad input.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import numpy as np
import orjson
from pydantic import ValidationError
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from app.config import Settings
from app.errors import MemproxyError
from app.memory.learning.jobs import JobQueue
from app.memory.search.embedder import TextEmbedder, load_embedder
from app.memory.service import MemoryService
from app.memory.store.db import create_engine, upgrade
from app.memory.store.memories import IdTaken, MemoryStore
from app.memory.store.records import NewMemory
from app.memory.store.tables import MemoryType
from app.schemas.memories import MemoryCreate, check_length, export_line, read_import

NEEDS_MODEL = {"add", "search", "import", "index"}


def run(args: argparse.Namespace, settings: Settings, embedder: TextEmbedder | None = None) -> int:
    """Run a `memories`, `index` or `jobs` command; `embedder` replaces the model (tests)."""
    console = Console(stderr=True)
    try:
        return asyncio.run(_run(args, settings, embedder, console))
    except (MemproxyError, IdTaken, ValidationError, ValueError, OSError) as exc:
        console.print(f"[red]error:[/red] {_message(exc)}")
        return 2


async def _run(
    args: argparse.Namespace, settings: Settings, embedder: TextEmbedder | None, console: Console
) -> int:
    engine = create_engine(
        settings.database_url, busy_timeout_seconds=settings.sqlite_busy_timeout_seconds
    )
    name = args.action if args.command == "memories" else args.command
    model: TextEmbedder = _NoModel()
    try:
        await upgrade(engine)
        if embedder is not None:
            model = embedder
        elif name in NEEDS_MODEL:
            model = await asyncio.to_thread(load_embedder, settings)
        memory = MemoryService(MemoryStore(engine), model, dense_weight=settings.dense_weight)
        return await _HANDLERS[name](memory, settings, args, console)
    finally:
        await engine.dispose()
        if embedder is None:
            model.close()


class _NoModel:
    """The embedder of commands that only read: they never embed, so the model is not loaded
    (which may mean exporting it, in a folder with no export yet)."""

    model_name = "-"
    dim = 0

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        raise AssertionError("this command does not embed")

    async def embed_query(self, text: str) -> np.ndarray:
        raise AssertionError("this command does not embed")

    def close(self) -> None:
        pass


def plural(count: int, word: str, words: str | None = None) -> str:
    """`1 memory`, `2 memories`, `0 users`."""
    return f"{count} {word if count == 1 else (words or word + 's')}"


async def _list(memory: MemoryService, settings: Settings, args: Any, console: Console) -> int:
    types = [MemoryType(t) for t in args.type or ()]
    records, total = await memory.page(
        args.user, types=types, contains=args.contains, limit=args.limit
    )
    if args.json:
        sys.stdout.buffer.write(b"".join(export_line(r) for r in records))
        return 0
    table = Table(
        "id",
        "type",
        "created",
        "content",
        title=f"{plural(total, 'memory', 'memories')} of {args.user}",
    )
    for r in records:
        table.add_row(r.id, r.type, r.created_at.date().isoformat(), r.content)
    Console().print(table)
    return 0


async def _get(memory: MemoryService, settings: Settings, args: Any, console: Console) -> int:
    record = await memory.get(args.user, args.id)
    if record is None:
        console.print(f"no memory {args.id} of {args.user}")
        return 1
    sys.stdout.buffer.write(export_line(record))
    return 0


async def _stats(memory: MemoryService, settings: Settings, args: Any, console: Console) -> int:
    stats = await memory.store.stats(args.user)  # the server's index cache is not this process's
    print(orjson.dumps(stats, option=orjson.OPT_INDENT_2).decode())
    return 0


async def _add(memory: MemoryService, settings: Settings, args: Any, console: Console) -> int:
    body = MemoryCreate(
        content=args.content,
        type=args.type,
        pinned=args.pinned,
        metadata=orjson.loads(args.metadata),
    )
    check_length(body.content, settings.memory_max_chars, "content")
    item = NewMemory(body.content, body.type, body.metadata, body.pinned)
    (record,) = (await memory.add(args.user, [item])).records
    print(record.id)
    return 0


async def _search(memory: MemoryService, settings: Settings, args: Any, console: Console) -> int:
    if not 1 <= args.limit <= 100:
        raise ValueError("--limit must be between 1 and 100")
    min_score = settings.relevance_threshold if args.min_score is None else args.min_score
    found = await memory.search(args.user, args.query, limit=args.limit, min_score=min_score)
    if args.json:
        for f in found:
            line = orjson.loads(export_line(f.memory)) | {"score": round(f.hit.score, 6)}
            sys.stdout.buffer.write(orjson.dumps(line) + b"\n")
        return 0
    table = Table("score", "id", "created", "content", title=f"{len(found)} found")
    for f in found:
        table.add_row(f"{f.hit.score:.3f}", f.memory.id, f.memory.created_at.date().isoformat(),
                      f.memory.content)  # fmt: skip
    Console().print(table)
    return 0


async def _delete(memory: MemoryService, settings: Settings, args: Any, console: Console) -> int:
    if args.all:
        if not args.yes or args.ids:
            raise ValueError("--all deletes every memory of the user: add --yes (and no ids)")
        deleted = await memory.delete_all(args.user)
        console.print(f"deleted {plural(deleted, 'memory', 'memories')} of {args.user}")
        return 0
    if not args.ids:
        raise ValueError("name the ids to delete, or --all --yes")
    deleted = await memory.delete(args.user, args.ids)
    console.print(f"deleted {deleted} of {len(args.ids)}")
    return 0 if deleted == len(args.ids) else 1


async def _export(memory: MemoryService, settings: Settings, args: Any, console: Console) -> int:
    out = open(args.output, "wb") if args.output else sys.stdout.buffer  # noqa: SIM115 (or stdout)
    count = 0
    try:
        async for record in memory.export(args.user):
            out.write(export_line(record))
            count += 1
    finally:
        if args.output:
            out.close()
    console.print(f"exported {plural(count, 'memory', 'memories')} of {args.user}")
    return 0


async def _import(memory: MemoryService, settings: Settings, args: Any, console: Console) -> int:
    if args.file:
        with open(args.file, "rb") as source:
            raw = source.read()
    else:
        raw = sys.stdin.buffer.read()
    items = read_import(raw, settings.memory_max_chars)
    created = sum((await memory.add(args.user, items)).created)
    console.print(f"imported {created}, skipped {len(items) - created} (ids already there)")
    return 0


async def _rebuild(memory: MemoryService, settings: Settings, args: Any, console: Console) -> int:
    users = await memory.store.users()
    if args.user:
        users = [(u, n) for u, n in users if u == args.user]
    with Progress(console=console) as progress:
        task = progress.add_task("indexing", total=sum(n for _, n in users))
        for user_id, count in users:
            memory.cache.forget(user_id)
            entry = await memory.cache.get(user_id)  # re-embeds what has no vector of this model
            progress.advance(task, count)
            memory.cache.forget(user_id)
            if len(entry) != count:
                console.print(f"[yellow]{user_id}: {len(entry)} indexed of {count}[/yellow]")
    indexed = plural(sum(n for _, n in users), "memory", "memories")
    console.print(f"indexed {indexed} of {plural(len(users), 'user')} with "
                  f"{memory.embedder.model_name}")  # fmt: skip
    return 0


async def _jobs(memory: MemoryService, settings: Settings, args: Any, console: Console) -> int:
    queue = JobQueue(memory.store.sessions)
    if args.action == "retry":
        console.print(f"queued again: {plural(await queue.retry_failed(args.user), 'failed job')}")
        return 0
    counts = await queue.counts(args.user)
    print(" ".join(f"{status} {n}" for status, n in counts.items()))
    for parked in await queue.failed(args.user):
        print(f"failed {parked.job_id} user={parked.user_id}: {parked.reason}")
        if parked.answer is not None:  # what the Manager said instead of usable decisions
            print(f"  answer: {' '.join(parked.answer.split())[:500]}")
    return 0


_HANDLERS: dict[str, Callable[[MemoryService, Settings, Any, Console], Awaitable[int]]] = {
    "list": _list,
    "get": _get,
    "stats": _stats,
    "add": _add,
    "search": _search,
    "delete": _delete,
    "export": _export,
    "import": _import,
    "index": _rebuild,
    "jobs": _jobs,
}


def _message(exc: Exception) -> str:
    if isinstance(exc, MemproxyError):
        return f"{exc.message}" + (f" ({exc.param})" if exc.param else "")
    if isinstance(exc, IdTaken):
        return f"memory id {exc} is already in use"
    if isinstance(exc, ValidationError):
        first = exc.errors()[0]
        return f"{'.'.join(str(p) for p in first['loc'])}: {first['msg']}"
    return str(exc)
