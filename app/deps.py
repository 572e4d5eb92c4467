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
from fastapi import Depends, Request
from sqlalchemy.ext.asyncio import AsyncEngine

from app.config import ApiKey, Settings
from app.memory.store import MemoryStore
from app.proxy.hooks import BackgroundRunner
from app.proxy.identity import Authenticator
from app.proxy.models_cache import ModelsCache
from app.proxy.service import ChatProxy
from app.proxy.upstream import Upstream


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
    key = services.authenticator.authenticate(request.headers.get("authorization"))
    return Caller(services, key, request.scope.get("state", {}).get("request_id", "-"))


CallerDep = Annotated[Caller, Depends(get_caller)]
