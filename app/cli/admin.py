"""``memproxy users list``, ``jobs list|retry`` and ``index rebuild`` (see app/cli/memory.py): the
commands about every user (or the one named), rather than one user's memories."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from rich.text import Text

from app.cli.show import Command, new_table, plural, progress, show_table, stamp, write_lines
from app.memory.learning.job_book import JobSummary
from app.memory.learning.jobs import JobQueue
from app.schemas.users import UserPublic


async def _users(c: Command) -> int:
    """A page of the users, latest activity first: with --json, JSON Lines in the schema of
    ``GET /v1/users`` (UserPublic: `id`, times in UTC ending in ``Z``)."""
    args = c.args
    if not 1 <= args.limit <= 1000:
        raise ValueError("--limit must be between 1 and 1000")
    if args.offset < 0:
        raise ValueError("--offset must not be negative")
    found, total = await c.memory.users(limit=args.limit, offset=args.offset)
    if c.json:
        rows = (UserPublic(id=u.user_id, memories=u.memories, last_activity=u.last_activity)
                for u in found)  # fmt: skip
        write_lines(row.model_dump(mode="json") for row in rows)
        return 0
    page = f" ({args.offset + 1}-{args.offset + len(found)} shown)" if len(found) < total else ""
    table = new_table(plural(total, "user") + page, "user", "memories", "last activity")
    for summary in found:
        table.add_row(Text(summary.user_id), str(summary.memories), stamp(summary.last_activity))
    show_table(table)
    return 0


async def _jobs(c: Command) -> int:
    args = c.args
    queue = JobQueue(c.memory.store.sessions)
    if args.action == "retry":
        retried = await queue.retry_failed(args.user, args.job)
        note = f"queued again: {plural(retried, 'failed job')}"
        if args.job and not retried:  # an unknown id, or a job that has not failed
            note += f"; no failed job {args.job}"
        return c.finish({"retried": retried}, note, ok=bool(retried) or args.job is None)
    if args.job:
        raise ValueError("--job names the failed job to retry: use it with `jobs retry`")
    counts = await queue.counts(args.user)
    failed = await queue.failed(args.user)
    jobs = await queue.jobs(args.user) if args.user else []
    if c.json:
        found = {"counts": counts, "failures": [f._asdict() for f in failed]}
        write_lines([found | ({"jobs": [j._asdict() for j in jobs]} if args.user else {})])
        return 0
    print(" ".join(f"{status} {n}" for status, n in counts.items()))
    for parked in failed:
        print(f"failed {parked.job_id} user={parked.user_id}: {parked.reason}")
        if parked.answer is not None:  # what the Manager said instead of usable decisions
            print(f"  answer: {' '.join(parked.answer.split())[:500]}")
    if jobs:
        table = new_table(f"{plural(len(jobs), 'job')} of {args.user}", "job", "state", "error")
        for job in jobs:
            table.add_row(job.job_id, _state(job), Text(job.error or "-"))
        show_table(table)
    return 0


def _state(job: JobSummary) -> Text:
    """Status, attempts and new messages; when it was queued, and is due."""
    explicit = ", asked for by the user" if job.explicit else ""
    return Text("\n".join([
        job.status, plural(job.attempts, "attempt"),
        f"{plural(job.messages, 'new message')}{explicit}",
        f"queued {stamp(job.created_at)}", f"due {stamp(job.next_attempt_at)}",
    ]))  # fmt: skip


async def _rebuild(c: Command) -> int:
    """Re-embed what has no vector of the configured model, and check each user's index holds
    all their memories."""
    memory = c.memory
    users = await memory.store.users()
    if c.args.user:
        users = [(u, n) for u, n in users if u == c.args.user]
    total = sum(n for _, n in users)
    with progress(c, "indexing", total) as advance:
        for user_id, count in users:
            entry = await memory.cache.rebuild(user_id)  # embeds what has no vector of this model
            advance(count)
            memory.cache.forget(user_id)
            if len(entry) != count:
                c.note(f"{user_id}: {len(entry)} indexed of {count}")
    model = memory.embedder.model_name
    result = {"indexed": total, "users": len(users), "embedding_model": model}
    note = f"indexed {plural(total, 'memory', 'memories')} of {plural(len(users), 'user')} with "
    return c.finish(result, note + model)


HANDLERS: dict[str, Callable[[Command], Awaitable[int]]] = {
    "users": _users,
    "jobs": _jobs,
    "index": _rebuild,
}
