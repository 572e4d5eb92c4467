"""`/v1/users`: the users memproxy knows (admin keys; anyone on an open server), and who the
caller is (`/v1/users/me`, what the memory page asks first)."""

from __future__ import annotations

from contextlib import suppress
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request

from app.deps import AdminCallerDep, Services, chat_user, memory_role
from app.errors import UserRequired
from app.schemas.checks import INT64_MAX
from app.schemas.openai import ErrorResponse
from app.schemas.users import Identity, UserList, UserPublic

router = APIRouter(prefix="/v1/users", tags=["users"])
_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse} for code in (400, 401, 403, 422)
}


@router.get("", responses=_ERRORS)
async def list_users(
    caller: AdminCallerDep,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0, le=INT64_MAX)] = 0,
) -> UserList:
    """Every user with memories, history or Manager jobs: latest activity first."""
    found, total = await caller.memory.users(limit=limit, offset=offset)
    data = [UserPublic(id=u.user_id, memories=u.memories, last_activity=u.last_activity)
            for u in found]  # fmt: skip
    return UserList(
        data=data, total=total, limit=limit, offset=offset, has_more=offset + len(data) < total
    )


@router.get("/me", responses=_ERRORS)
async def who_am_i(request: Request) -> Identity:
    """The caller's role, and the user its requests act for (as chat resolves it; None when
    nothing names one and ``MEMPROXY_REQUIRE_USER`` is set: the page then asks for the user)."""
    services: Services = request.app.state.services
    role, key = memory_role(services, request.headers.get("authorization"))
    user_id = None
    if role != "admin":
        with suppress(UserRequired):
            user_id = chat_user(services, request, key)
    return Identity(role=role, user_id=user_id)
