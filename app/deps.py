"""Dependencies for the routers, as `Annotated` aliases (routers declare what they need, no more).

The app's long-lived objects live in one :class:`Services` on ``app.state``, created by the
lifespan in :mod:`app.main`. Proxy routes take one dependency, :data:`CallerDep`: FastAPI's
dependency solving costs ~0.05 ms per dependency per request, a quarter of memproxy's whole CPU
per proxied request with three. Every dependency is ``async def`` (a plain ``def`` one would run
in a worker thread: a thread hop per request).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import httpx
from fastapi import Depends, Query, Request
from sqlalchemy.ext.asyncio import AsyncEngine

from app.background import BackgroundRunner
from app.config import ApiKey, Settings
from app.errors import AuthenticationFailed, InvalidRequest, PermissionDenied
from app.memory.learning.jobs import JobQueue
from app.memory.learning.worker import Worker
from app.memory.service import MemoryService
from app.memory.store.memories import MemoryStore
from app.metrics import Metrics
from app.proxy.chat_proxy import ChatProxy
from app.proxy.identity import (
    Authenticator,
    bearer_token,
    clean_user_id,
    resolve_user,
    token_secret,
)
from app.proxy.models_cache import ModelsCache
from app.proxy.upstream import Upstream
from app.schemas.users import Role


@dataclass(slots=True)
class Services:
    settings: Settings
    client: httpx.AsyncClient
    upstream: Upstream
    authenticator: Authenticator
    proxy: ChatProxy
    models: ModelsCache
    runner: BackgroundRunner
    engine: AsyncEngine
    store: MemoryStore
    memory: MemoryService
    metrics: Metrics
    admins: Authenticator
    """`MEMPROXY_ADMIN_KEYS`: accepted by the memory API, where they may name any user."""
    jobs: JobQueue
    worker: Worker | None = None
    """Runs the Manager's jobs; None when the Manager is off."""


@dataclass(frozen=True, slots=True)
class Caller:
    """An authenticated request: the app's services, the client's key, this request's id."""

    services: Services
    key: ApiKey | None
    """The matched `MEMPROXY_API_KEYS` entry; None when no keys are configured."""
    request_id: str


async def get_caller(request: Request) -> Caller:
    """401 unless the bearer key is valid (when keys are configured)."""
    services: Services = request.app.state.services
    key = client_key(services, request.headers.get("authorization"))
    return Caller(services, key, request.scope.get("state", {}).get("request_id", "-"))


CallerDep = Annotated[Caller, Depends(get_caller)]


def authenticate(
    services: Services, authorization: str | None, *, admin_allowed: bool
) -> tuple[bool, ApiKey | None]:
    """(an admin key?, the matched client key): 401 unless the bearer key is accepted. Admin keys
    count only where `admin_allowed` (the memory API). Also run by app.body_guard before a body
    is read, so an unauthenticated client never gets to send one."""
    if admin_allowed:
        token = bearer_token(authorization)
        if token is not None and services.admins.match(token) is not None:
            return True, None
    return False, client_key(services, authorization)


def client_key(services: Services, authorization: str | None) -> ApiKey | None:
    """The matched client key of a chat or MCP request (None with no client keys configured):
    401 unless the bearer key is accepted; an admin key is told it cannot chat (403
    ``admin_key``), since it belongs to no user, rather than called invalid."""
    try:
        return services.authenticator.authenticate(authorization)
    except AuthenticationFailed:
        token = bearer_token(authorization)
        if token is not None and services.admins.match(token) is not None:
            raise PermissionDenied(
                "admin keys cannot chat or use MCP: an admin key belongs to no user; use a "
                "client key bound to a user (key:user in MEMPROXY_API_KEYS)",
                code="admin_key",
            ) from None
        raise


def check_any_key(services: Services, authorization: str | None) -> None:
    """401 unless `authorization` carries a client or an admin key; with neither kind configured
    (an open server) there is nothing to check. For the operator's pages: metrics, the docs."""
    admin, key = authenticate(services, authorization, admin_allowed=True)
    if not admin and key is None:  # no client keys to match: an admin key it must be, if any
        services.admins.authenticate(authorization)


@dataclass(frozen=True, slots=True)
class MemoryCaller:
    """A memory API request: the service, and the one user whose memories it may touch."""

    memory: MemoryService
    settings: Settings
    user_id: str
    jobs: JobQueue
    """The Manager's queue (the user's jobs: listed, re-queued)."""


def memory_role(services: Services, authorization: str | None) -> tuple[Role, ApiKey | None]:
    """The role of a memory API request, and its client key (401 for a key not accepted)."""
    admin, key = authenticate(services, authorization, admin_allowed=True)
    if admin:
        return "admin", None
    open_server = (
        not services.authenticator.enabled
        and not services.admins.enabled
        and token_secret(services.settings) is None
    )
    return ("open" if open_server else "user"), key


def chat_user(services: Services, request: Request, key: ApiKey | None) -> str:
    """The user chat would act for, from this request's key and headers."""
    settings = services.settings
    return resolve_user(
        request.headers,
        settings.user_id_headers,
        None,
        key,
        require_user=settings.require_user,
        jwt_secret=token_secret(settings),
        jwt_max_lifetime=settings.openwebui_jwt_max_lifetime_seconds,
        unbound_names_users=settings.unbound_keys_name_users,
    )


async def get_memory_caller(
    request: Request,
    user: Annotated[
        str | None,
        Query(description="Act for this user (admin keys only; any key on an open server)."),
    ] = None,
) -> MemoryCaller:
    """Same authentication and user resolution as chat; admin keys must name the user.

    On a server with no keys at all, anyone may name any user (as the chat headers already
    allow there), unless ``MEMPROXY_OPENWEBUI_JWT_SECRET`` is set: then only the signed token
    names users, as on chat. With keys, ``?user=`` needs an admin key (403 otherwise), and an
    admin key, which belongs to no user, needs ``?user=`` (400 naming it: never an empty list
    of a user nobody meant).
    """
    services: Services = request.app.state.services
    role, key = memory_role(services, request.headers.get("authorization"))
    if user is not None:
        if role == "user":
            raise PermissionDenied("only admin keys may name the user with ?user=", param="user")
        named = clean_user_id(user, "user")
        if named is None:
            raise InvalidRequest("?user= must name a user", param="user", code="invalid_user")
        user_id = named
    elif role == "admin":
        raise InvalidRequest(
            "an admin key belongs to no user: name the user with ?user=",
            param="user",
            code="missing_user",
        )
    else:
        user_id = chat_user(services, request, key)
    request.state.user_id = user_id  # for the access log line
    return MemoryCaller(services.memory, services.settings, user_id, services.jobs)


MemoryCallerDep = Annotated[MemoryCaller, Depends(get_memory_caller)]


@dataclass(frozen=True, slots=True)
class AdminCaller:
    """A request allowed to act on any user: an admin key, or anyone on an open server."""

    memory: MemoryService
    settings: Settings


async def get_admin_caller(request: Request) -> AdminCaller:
    """401 for a key not accepted, 403 for a client key: these routes span users."""
    services: Services = request.app.state.services
    role, _ = memory_role(services, request.headers.get("authorization"))
    if role == "user":
        raise PermissionDenied("this route needs an admin key (MEMPROXY_ADMIN_KEYS)")
    return AdminCaller(services.memory, services.settings)


AdminCallerDep = Annotated[AdminCaller, Depends(get_admin_caller)]
