"""Forgetting over a capacity, on request: ``POST /v1/memories/forget`` (``dry_run``: what
would leave, and why), ``GET /v1/memories/forgotten`` (the memories forgotten, which can still
be put back) and ``POST /v1/memories/forgotten/{id}/restore``. The same keys and user as the
rest of the memory API (app.deps); registered before the memory router, whose last route
answers every other path under ``/v1/memories``. Idle jobs forget the same way on their own
(:mod:`app.memory.learning.idle`)."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Query

from app.deps import MemoryCaller, MemoryCallerDep
from app.errors import Conflict, NotFound
from app.memory.aging.forgetting import Forgetting
from app.memory.store.claims import IdTaken
from app.memory.store.tables import MemorySource
from app.schemas.forgetting import (
    ForgetRequest,
    ForgetResult,
    ForgottenList,
    ForgottenPublic,
    LeavingPublic,
)
from app.schemas.memories import MemoryPublic
from app.schemas.openai import ErrorResponse

router = APIRouter(prefix="/v1/memories", tags=["memories"])
_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse} for code in (400, 401, 403, 404, 409, 413, 422)
}


def forgetting_for(caller: MemoryCaller) -> Forgetting:
    return Forgetting.configured(caller.memory, caller.settings)


@router.post("/forget", responses=_ERRORS)
async def forget(caller: MemoryCallerDep, body: ForgetRequest | None = None) -> ForgetResult:
    """Forget what is over the user's capacities now (as an idle job would), or with
    ``dry_run`` only say what would leave and why. What leaves goes to the forgotten memories,
    from where it can be put back."""
    dry_run = body is not None and body.dry_run
    forgetting = forgetting_for(caller)
    if dry_run:
        leaving = await forgetting.plan(caller.user_id)
    else:
        leaving = (await forgetting.forget(caller.user_id, actor=MemorySource.API)).leaving
    return ForgetResult(
        user_id=caller.user_id, dry_run=dry_run, max_facts=caller.settings.max_facts,
        max_episodes=caller.settings.max_episodes,
        forgotten=[LeavingPublic.of(m) for m in leaving],
    )  # fmt: skip


@router.get("/forgotten", responses=_ERRORS)
async def list_forgotten(
    caller: MemoryCallerDep,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    offset: Annotated[int, Query(ge=0, le=2**62)] = 0,
) -> ForgottenList:
    """The user's forgotten memories, most recently forgotten first, each with its reason and
    when it is erased for good unless put back."""
    found, total = await forgetting_for(caller).forgotten(
        caller.user_id, limit=limit, offset=offset
    )
    keep = timedelta(days=caller.settings.forgotten_keep_days)
    return ForgottenList(
        data=[ForgottenPublic.of(m, m.forgotten_at + keep) for m in found], total=total,
        limit=limit, offset=offset, has_more=offset + len(found) < total,
    )  # fmt: skip


@router.post("/forgotten/{memory_id}/restore", responses=_ERRORS)
async def restore_forgotten(memory_id: str, caller: MemoryCallerDep) -> MemoryPublic:
    """Put a forgotten memory back: same id, its links to what still exists, counted as used
    now. 404 when no forgotten memory of the user has this id."""
    try:
        record = await forgetting_for(caller).restore(caller.user_id, memory_id)
    except IdTaken as exc:
        raise Conflict(str(exc), param="memory_id") from exc
    if record is None:
        raise NotFound(f"no forgotten memory with id {memory_id[:64]!r}", param="memory_id")
    linked = await caller.memory.store.linked(caller.user_id, [record.id])
    return MemoryPublic.of(record, linked.get(record.id, ()))
