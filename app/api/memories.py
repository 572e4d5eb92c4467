"""The memory API: `/v1/memories...`. Every route acts for exactly one user (app.deps)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from starlette.responses import Response, StreamingResponse

from app.deps import AdminCallerDep, MemoryCaller, MemoryCallerDep
from app.errors import InvalidRequest, NotFound, ServerBusy, ValidationFailed
from app.memory.store.claims import IdTaken
from app.memory.store.records import MemoryRecord, NewMemory
from app.memory.store.tables import MemoryType
from app.proxy.body import read_body
from app.proxy.identity import clean_user_id
from app.schemas.checks import INT64_MAX
from app.schemas.memories import (
    Deleted,
    ImportResult,
    MemoryBatchCreate,
    MemoryCreate,
    MemoryEventPublic,
    MemoryHistory,
    MemoryHit,
    MemoryList,
    MemoryPublic,
    MemorySearch,
    MemoryUpdate,
    SearchResults,
    check_length,
)
from app.schemas.memory_lines import export_line, read_import
from app.schemas.openai import ErrorResponse
from app.schemas.users import (
    JobList,
    JobPublic,
    JobRetry,
    JobsRequeued,
    MemoryMove,
    MemoryMoved,
)

router = APIRouter(prefix="/v1/memories", tags=["memories"])
_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse} for code in (400, 401, 403, 404, 409, 413, 422)
}


@router.post("", status_code=201, responses=_ERRORS)
async def create_memory(body: MemoryCreate, caller: MemoryCallerDep) -> MemoryPublic:
    _check_length(caller, body.content, "content")
    (record,) = (await caller.memory.add(caller.user_id, [_new(body)])).records
    return MemoryPublic.of(record)


@router.post("/batch", status_code=201, responses=_ERRORS)
async def create_memories(body: MemoryBatchCreate, caller: MemoryCallerDep) -> MemoryList:
    for i, item in enumerate(body.memories):
        _check_length(caller, item.content, f"memories.{i}.content")
    records = (await caller.memory.add(caller.user_id, [_new(i) for i in body.memories])).records
    data = [MemoryPublic.of(r) for r in records]  # new: linked to nothing yet
    return MemoryList(data=data, total=len(data), limit=len(data), offset=0, has_more=False)


@router.get("", responses=_ERRORS)
async def list_memories(
    caller: MemoryCallerDep,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    # At most SQLite's (and PostgreSQL's) largest integer: beyond it the query itself fails.
    offset: Annotated[int, Query(ge=0, le=INT64_MAX)] = 0,
    type: Annotated[list[MemoryType] | None, Query(description="Only these types.")] = None,
    q: Annotated[str | None, Query(max_length=1000, description="Content contains.")] = None,
    profile: Annotated[
        bool | None, Query(description="true: only profile facts; false: only the others.")
    ] = None,
) -> MemoryList:
    records, total = await caller.memory.page(
        caller.user_id, types=type or (), contains=q, profile=profile, limit=limit, offset=offset
    )
    data = await _shown(caller, records)
    return MemoryList(
        data=data, total=total, limit=limit, offset=offset, has_more=offset + len(data) < total
    )


@router.delete("", responses=_ERRORS)
async def delete_all_memories(
    caller: MemoryCallerDep,
    confirm: Annotated[bool, Query(description="Must be true: deletes every memory.")] = False,
) -> Deleted:
    if not confirm:
        raise InvalidRequest(
            "deleting every memory of a user needs ?confirm=true",
            param="confirm",
            code="confirmation_required",
        )
    return Deleted(deleted=await caller.memory.delete_all(caller.user_id))


@router.post("/search", responses=_ERRORS)
async def search_memories(body: MemorySearch, caller: MemoryCallerDep) -> SearchResults:
    """Ranked by the pipeline chat recall uses."""
    min_score = body.min_score
    if min_score is None:
        min_score = caller.settings.relevance_threshold
    found = await caller.memory.search(
        caller.user_id,
        body.query,
        limit=body.limit,
        min_score=min_score,
        types=[t.value for t in body.types or ()],
        links=True,
    )
    hits = [
        MemoryHit(**MemoryPublic.of(f.memory, f.linked).model_dump(), score=round(f.hit.score, 6))
        for f in found
    ]
    return SearchResults(data=hits)


@router.get("/stats", responses=_ERRORS)
async def memory_stats(caller: MemoryCallerDep) -> dict[str, Any]:
    """Counts of the user's memories, and of their Manager jobs: awaiting (the chat's answer
    still on its way), queued, running, `pending` (all three: not yet learned from), failed
    (with the reasons, and the Manager's answer when it was unusable)."""
    stats = await caller.memory.stats(caller.user_id)
    # Counts first: a job failing between the two reads is then listed, not counted and missing
    # (a failed job stays failed until it is queued again by hand).
    counts = await caller.jobs.progress(caller.user_id)
    failed = await caller.jobs.failed(caller.user_id)
    stats["jobs"] = counts | {
        "failures": [{"job_id": p.job_id, "reason": p.reason, "answer": p.answer} for p in failed],
    }
    return {"object": "memory.stats", "user_id": caller.user_id} | stats


@router.get("/jobs", responses=_ERRORS)
async def list_jobs(
    caller: MemoryCallerDep, limit: Annotated[int, Query(ge=1, le=1000)] = 100
) -> JobList:
    """The user's Manager jobs not yet applied, oldest first (the order they run in): awaiting,
    queued, running, failed with the reason."""
    found = await caller.jobs.jobs(caller.user_id, limit=limit)
    return JobList(data=[JobPublic(id=j.job_id, **j._asdict()) for j in found])


@router.post("/jobs/retry", responses=_ERRORS)
async def retry_jobs(caller: MemoryCallerDep, body: JobRetry | None = None) -> JobsRequeued:
    """Queue the user's failed jobs again (or the one named), from their first attempt."""
    job_id = body.job_id if body is not None else None
    requeued = await caller.jobs.retry_failed(caller.user_id, job_id)
    if job_id is not None and not requeued:
        raise NotFound(f"no failed job with id {job_id[:64]!r}", param="job_id")
    return JobsRequeued(requeued=requeued)


@router.post("/move", responses=_ERRORS)
async def move_memories(body: MemoryMove, caller: AdminCallerDep) -> MemoryMoved:
    """Give every memory of one user to another (admin): same ids, history kept, with the
    Manager jobs not yet running. For the README's case: chats that were all `anonymous` before
    Open WebUI forwarded its user headers. `from_user` is taken as stored (a user named before
    ids were normalised can be given to a normal id); `to_user` is normalised as any id."""
    from_user = clean_user_id(body.from_user, "from_user", as_stored=True)
    to_user = clean_user_id(body.to_user, "to_user")
    if from_user is None or to_user is None:
        raise ValidationFailed(
            "name both users", param="from_user" if from_user is None else "to_user"
        )
    if from_user == to_user:
        raise InvalidRequest("from_user and to_user are the same user", param="to_user")
    moved = await caller.memory.move(from_user, to_user)
    if not moved.keys and not moved.jobs:
        raise NotFound(f"user {from_user[:64]!r} has no memories to move", param="from_user")
    return MemoryMoved(from_user=from_user, to_user=to_user, moved=len(moved.keys), jobs=moved.jobs)


@router.get("/export", responses=_ERRORS, response_class=StreamingResponse)
async def export_memories(caller: MemoryCallerDep) -> Response:
    """Every memory of the user as JSON Lines (what `/import` reads back)."""

    async def lines() -> AsyncIterator[bytes]:
        async for record, linked in caller.memory.export_linked(caller.user_id):
            yield export_line(record, linked)

    return StreamingResponse(
        lines(),
        media_type="application/x-ndjson",
        headers={"Content-Disposition": 'attachment; filename="memories.jsonl"'},
    )


@router.post("/import", responses=_ERRORS)
async def import_memories(
    request: Request,
    caller: MemoryCallerDep,
    ids: Annotated[
        Literal["keep", "new"],
        Query(description="keep: idempotent on id; new: every line a new memory (a copy)."),
    ] = "keep",
) -> ImportResult:
    """JSON Lines, one memory each (an export's lines); idempotent on id, a line without one is
    a new memory. ``?ids=new`` imports copies with new ids (another user's export, say). An id
    another user holds is imported as an unknown one is (under an id of the caller's derived
    from it, the same each time): the answer never tells whether an id exists."""
    limit = caller.settings.memory_max_body_bytes
    raw = await read_body(request, limit, "MEMPROXY_MEMORY_MAX_BODY_BYTES")
    items = read_import(raw, caller.settings.memory_max_chars, new_ids=ids == "new")
    try:
        written = await caller.memory.add(caller.user_id, items, rename_taken=True)
    except IdTaken:  # other users' imports took the same ids at the same moment, thrice
        raise ServerBusy("the import met concurrent writes: send it again") from None
    created = sum(written.created)
    return ImportResult(imported=created, skipped=len(items) - created)


@router.get("/{memory_id}", responses=_ERRORS)
async def get_memory(memory_id: str, caller: MemoryCallerDep) -> MemoryPublic:
    record = await caller.memory.get(caller.user_id, memory_id)
    if record is None:
        raise _not_found(memory_id)
    return (await _shown(caller, [record]))[0]


@router.get("/{memory_id}/history", responses=_ERRORS)
async def memory_history(memory_id: str, caller: MemoryCallerDep) -> MemoryHistory:
    """Why the memory exists (or not): every write to it, oldest first, also after deletion."""
    found = await caller.memory.history(caller.user_id, memory_id)
    if not found:
        raise _not_found(memory_id)
    return MemoryHistory(
        data=[MemoryEventPublic.model_validate(e, from_attributes=True) for e in found]
    )


@router.patch("/{memory_id}", responses=_ERRORS)
async def update_memory(
    memory_id: str, body: MemoryUpdate, caller: MemoryCallerDep
) -> MemoryPublic:
    changes = body.model_dump(exclude_unset=True)
    if any(changes.get(name) is None for name in changes):
        raise ValidationFailed("fields may be left out but not null", param=next(
            name for name in changes if changes[name] is None
        ))  # fmt: skip
    if not changes:
        raise InvalidRequest("nothing to change", code="empty")
    if "content" in changes:
        _check_length(caller, changes["content"], "content")
    record = await caller.memory.update(caller.user_id, memory_id, **changes)
    if record is None:
        raise _not_found(memory_id)
    return (await _shown(caller, [record]))[0]


@router.delete("/{memory_id}", responses=_ERRORS)
async def delete_memory(memory_id: str, caller: MemoryCallerDep) -> Deleted:
    """A fact goes with the episodes it was written from and the memories that say the same
    (``also_deleted``); an episode goes alone."""
    removed = await caller.memory.delete(caller.user_id, [memory_id])
    if not removed.ids:
        raise _not_found(memory_id)
    also = [MemoryPublic.of(r, removed.linked.get(r.id, ())) for r in removed.also]
    return Deleted(id=memory_id, deleted=1 + len(also), also_deleted=also)


@router.api_route(
    "/{rest:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"], include_in_schema=False
)
async def no_such_memory_route(rest: str) -> None:
    """Last: what matches no route above is answered here, never relayed to the upstream."""
    raise _not_found(rest)


def _new(body: MemoryCreate) -> NewMemory:
    return NewMemory(
        content=body.content, type=body.type, metadata=body.metadata, pinned=body.pinned,
        profile=body.profile, observed_at=body.observed_at,
    )  # fmt: skip


async def _shown(caller: MemoryCaller, records: Sequence[MemoryRecord]) -> list[MemoryPublic]:
    """The records as the API shows them, each with the ids linked to it (one query)."""
    linked = await caller.memory.store.linked(caller.user_id, [r.id for r in records])
    return [MemoryPublic.of(r, linked.get(r.id, ())) for r in records]


def _check_length(caller: MemoryCaller, content: str, param: str) -> None:
    check_length(content, caller.settings.memory_max_chars, param)


def _not_found(memory_id: str) -> NotFound:
    return NotFound(f"no memory with id {memory_id[:64]!r}", param="memory_id")
