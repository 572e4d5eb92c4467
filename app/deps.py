"""Dependencies for the routers, as `Annotated` aliases (routers declare what they need, no more).

The app's long-lived objects live in one :class:`Services` on ``app.state``, created by the
lifespan in :mod:`app.main`. Every dependency is ``async def``: FastAPI runs a plain ``def`` one in
a worker thread, a thread hop per dependency per request on the hot path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import httpx
from fastapi import Depends, Request

from app.config import ApiKey, Settings
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


async def get_services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


async def get_request_id(request: Request) -> str:
    request_id: str = request.scope.get("state", {}).get("request_id", "-")
    return request_id


async def authenticate(request: Request) -> ApiKey | None:
    """401 unless the bearer key is valid (when keys are configured); the matched key."""
    services: Services = request.app.state.services
    return services.authenticator.authenticate(request.headers.get("authorization"))


ServicesDep = Annotated[Services, Depends(get_services)]
RequestId = Annotated[str, Depends(get_request_id)]
CallerKey = Annotated[ApiKey | None, Depends(authenticate)]
