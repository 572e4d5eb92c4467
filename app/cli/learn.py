"""``memproxy learn FILE --user U``: past conversations (an Open WebUI chat export, ChatGPT's
``conversations.json``) queued for the Manager straight in the database, as ``POST
/v1/memories/learn`` queues them (app/memory/learning/history/), with no limit on the file's size.

- The file is read and checked whole first: a problem is one line naming the place (the
  conversation by number and title, the message, the field) and exit status 2, nothing queued.
- Conversations are queued one at a time, each whole or not at all (a progress bar on a
  terminal): run again after an interruption, it queues what was left; a file learned before
  queues nothing.
- Then it waits, with a progress bar, while the Manager of a running ``memproxy serve`` on the same
  database learns them (after the chats' jobs), and prints a summary; ``--no-wait`` returns once
  they are queued. Ctrl-C stops the waiting, not the learning.

Exit status: 0 done (queued, with ``--no-wait``), 1 some jobs failed (``memproxy jobs list --user
U`` says why, ``jobs retry`` queues them again), 2 bad input: the file, no model for the Manager,
the Manager off.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

from app.cli.show import Command, plural, progress
from app.memory.learning.history.queue import HistoryQueue, Learned, manager_model, run_id
from app.memory.learning.history.read import read_export
from app.schemas.learning import LearnResult

POLL_SECONDS = 1.0
"""How often the run's jobs are counted while waiting (the worker looks at its queue as often)."""
FORMATS = {"openwebui": "an Open WebUI export", "chatgpt": "a ChatGPT export"}


async def _learn(c: Command) -> int:
    args = c.args
    if not c.settings.manager_enabled:
        raise ValueError(
            "the Manager is off (MEMPROXY_MANAGER_ENABLED=false): nothing would learn from "
            "these conversations"
        )
    raw = await asyncio.to_thread(Path(args.file).read_bytes)
    export = await asyncio.to_thread(read_export, raw, args.format)
    model = manager_model(export, args.model, c.settings.manager_model)
    history = HistoryQueue(c.memory.store.sessions)
    run = run_id(args.user, raw)
    with progress(c, "queueing", len(export.conversations)) as advance:
        learned = await history.learn(args.user, export, run=run, model=model, done=advance)
    c.note(_summary(learned, args.user))
    counts = await history.progress(args.user, run)
    if counts["pending"] and not args.no_wait:
        counts = await _waited(c, lambda: history.progress(args.user, run), counts)
    result = LearnResult.of(learned, args.user, counts)
    return c.finish(result.model_dump(), _outcome(result), ok=not result.failed)


def _summary(learned: Learned, user: str) -> str:
    return (
        f"{FORMATS[learned.format]} for {user} (run {learned.run}): "
        f"{plural(learned.conversations, 'conversation')} of "
        f"{plural(learned.messages, 'message')}; {learned.queued} queued as "
        f"{plural(learned.jobs, 'job')}, {learned.already} already learned, "
        f"{learned.skipped} skipped (no word of the user's)"
    )


async def _waited(
    c: Command, count: Callable[[], Awaitable[dict[str, int]]], counts: dict[str, int]
) -> dict[str, int]:
    """Wait while the Manager learns the run's pending jobs: the counts once none is left, or
    when the wait was stopped (Ctrl-C)."""
    left = counts["pending"]
    c.note(
        f"waiting while memproxy serve's Manager learns {plural(left, 'job')} (after the chats' "
        "jobs); Ctrl-C stops waiting, the jobs stay queued"
    )
    try:
        with progress(c, "learning", left) as advance:
            while counts["pending"]:
                await asyncio.sleep(POLL_SECONDS)
                counts = await count()
                if counts["pending"] < left:
                    advance(left - counts["pending"])
                    left = counts["pending"]
    except asyncio.CancelledError:  # Ctrl-C: asyncio.run cancels the command
        c.note("stopped waiting")
    return counts


def _outcome(result: LearnResult) -> str:
    if result.pending:
        return (
            f"{plural(result.pending, 'job')} still to learn: memproxy serve's Manager learns "
            f"them (memproxy jobs list --user {result.user_id})"
        )
    if result.failed:
        return (
            f"{plural(result.failed, 'job')} failed: memproxy jobs list --user "
            f"{result.user_id} says why, memproxy jobs retry queues them again"
        )
    if not result.jobs and not result.queued_conversations:
        return "nothing new to learn"
    return "learned: every job of this run is applied"


HANDLERS: dict[str, Callable[[Command], Awaitable[int]]] = {"learn": _learn}
