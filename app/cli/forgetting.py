"""``memproxy memories forget|forgotten|restore``: forgetting over the capacities
(MEMPROXY_MAX_FACTS, MEMPROXY_MAX_EPISODES) now, or with ``--dry-run`` only what would leave and
why; the forgotten memories; putting one back (:mod:`app.memory.aging.forgetting`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from app.cli.show import Command, plural, show_memory, write_lines
from app.memory.aging.forgetting import Forgetting
from app.memory.store.tables import MemorySource


def _forgetting(c: Command) -> Forgetting:
    return Forgetting.configured(c.memory, c.settings)


async def _forget(c: Command) -> int:
    """What leaves (or with --dry-run would), least worth first, with the reason of each."""
    forgetting = _forgetting(c)
    if c.args.dry_run:
        leaving = await forgetting.plan(c.args.user)
    else:
        leaving = (await forgetting.forget(c.args.user, actor=MemorySource.CLI)).leaving
    if c.json:
        write_lines({"id": m.id, "type": m.type, "value": round(m.value, 6),
                     "content": m.content, "reason": m.reason} for m in leaving)  # fmt: skip
    else:
        for m in leaving:
            print(f"{m.id}  {m.type:<10} {m.value:.3f}  {m.content}\n    {m.reason}")
    s = c.settings
    caps = f"capacities: facts {s.max_facts or 'none'}, episodes {s.max_episodes or 'none'}"
    verb = "would forget" if c.args.dry_run else "forgot"
    c.note(f"{verb} {plural(len(leaving), 'memory', 'memories')} of {c.args.user} ({caps})")
    return 0


async def _forgotten(c: Command) -> int:
    """The forgotten memories, most recently forgotten first."""
    found, total = await _forgetting(c).forgotten(c.args.user, limit=c.args.limit)
    if c.json:
        write_lines({"id": m.id, "type": m.type, "content": m.content, "reason": m.reason,
                     "cause": m.cause, "forgotten_at": m.forgotten_at.isoformat(),
                     "ended_at": m.ended_at.isoformat() if m.ended_at else None}
                    for m in found)  # fmt: skip
    else:
        for m in found:
            print(f"{m.id}  {m.forgotten_at:%Y-%m-%d}  {m.cause:<10} {m.type:<10} {m.content}"
                  f"\n    {m.reason}")  # fmt: skip
    c.note(f"{plural(total, 'forgotten memory', 'forgotten memories')} of {c.args.user}")
    return 0


async def _restore(c: Command) -> int:
    """Put a forgotten memory back (exit 1 when the user has no such forgotten memory)."""
    record = await _forgetting(c).restore(c.args.user, c.args.id, actor=MemorySource.CLI)
    if record is None:
        c.note(f"no forgotten memory {c.args.id} of {c.args.user}")
        return 1
    show_memory(record, as_json=c.json)
    c.note(f"put back {record.id}")
    return 0


HANDLERS: dict[str, Callable[[Command], Awaitable[int]]] = {
    "forget": _forget,
    "forgotten": _forgotten,
    "restore": _restore,
}
