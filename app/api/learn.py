"""``/v1/memories/learn``: the Manager learns from past conversations, a chat export sent whole
(:mod:`app.memory.learning.history`). Same keys and user resolution as the rest of the memory
API (app.deps): a user's key learns for its user, an admin key names the user with ``?user=``.
Registered before the memory router, whose last route answers every other path under
``/v1/memories``."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request

from app.deps import MemoryCallerDep, Services
from app.errors import Conflict, InvalidJSON, InvalidRequest, NotFound, ValidationFailed
from app.memory.learning.history.export import BadExport
from app.memory.learning.history.queue import HistoryQueue, is_run_id, manager_model, run_id
from app.memory.learning.history.read import read_export
from app.proxy.body import read_body
from app.proxy.offload import off_loop
from app.schemas.learning import LearnFormat, LearnProgress, LearnResult
from app.schemas.openai import ErrorResponse

router = APIRouter(prefix="/v1/memories/learn", tags=["memories"])
_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse} for code in (400, 401, 403, 404, 409, 413, 422)
}


@router.post("", responses=_ERRORS)
async def learn(
    request: Request,
    caller: MemoryCallerDep,
    format: Annotated[
        LearnFormat, Query(description="The export's format; auto: told by its first chat.")
    ] = "auto",
    model: Annotated[
        str | None,
        Query(
            min_length=1,
            max_length=256,
            description="The model the Manager learns with; by default MEMPROXY_MANAGER_MODEL, "
            "else each Open WebUI chat's own.",
        ),
    ] = None,
) -> LearnResult:
    """The body is an export: Open WebUI's (Export chat, Export All Chats) or ChatGPT's
    ``conversations.json``, at most ``MEMPROXY_MEMORY_MAX_BODY_BYTES`` (bigger: ``memproxy
    learn``). Each conversation's new turns are queued as Manager jobs dated when they were
    said, after chats' jobs; a file with a problem is refused whole (422 naming the place),
    and one sent again queues nothing. Answers what was queued and the run's progress."""
    services: Services = request.app.state.services
    if not caller.settings.manager_enabled:
        raise Conflict(
            "the Manager is off (MEMPROXY_MANAGER_ENABLED=false): nothing would learn from "
            "these conversations",
            code="manager_disabled",
        )
    limit = caller.settings.memory_max_body_bytes
    raw = await read_body(request, limit, "MEMPROXY_MEMORY_MAX_BODY_BYTES")
    try:
        export = await off_loop(len(raw), read_export, raw, format)
        chosen = manager_model(export, model, caller.settings.manager_model)
    except BadExport as exc:
        raise _refusal(exc) from None
    history = HistoryQueue(caller.memory.store.sessions)
    run = run_id(caller.user_id, raw)
    learned = await history.learn(caller.user_id, export, run=run, model=chosen)
    if services.worker is not None and learned.jobs:
        services.worker.wake()
    return LearnResult.of(learned, caller.user_id, await history.progress(caller.user_id, run))


@router.get("/{run}", responses=_ERRORS)
async def learn_progress(run: str, caller: MemoryCallerDep) -> LearnProgress:
    """A learn run's jobs not yet applied (its `id` as ``POST /v1/memories/learn`` answered):
    ``pending`` 0 once the Manager has learned from all of it (`failed`: see
    ``/v1/memories/jobs``)."""
    if not is_run_id(run):
        raise NotFound(f"no learn run {run[:64]!r}: its id is 12 hex digits", param="run")
    counts = await HistoryQueue(caller.memory.store.sessions).progress(caller.user_id, run)
    return LearnProgress(id=run, user_id=caller.user_id, **counts)


def _refusal(exc: BadExport) -> InvalidRequest:
    """The export's problem as the API's error: 400 for a body that is not JSON or holds no
    conversation, 422 naming the place otherwise."""
    if exc.code == "invalid_json":
        return InvalidJSON(f"request body is {exc}")
    if exc.code == "empty":
        return InvalidRequest(str(exc), code="empty")
    return ValidationFailed(str(exc), param=exc.param or None, code=exc.code)
