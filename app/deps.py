"""Dependencies for the routers, as `Annotated` aliases (routers declare what they need, no more).

The app's long-lived objects live in one :class:`Services` on ``app.state``, created by the
lifespan in :mod:`app.main`.
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


def get_services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


def get_request_id(request: Request) -> str:
    request_id: str = request.scope.get("state", {}).get("request_id", "-")
    return request_id


def authenticate(request: Request) -> ApiKey | None:
    """401 unless the bearer key is valid (when keys are configured); the matched key."""
    return get_services(request).authenticator.authenticate(request.headers.get("authorization"))


ServicesDep = Annotated[Services, Depends(get_services)]
RequestId = Annotated[str, Depends(get_request_id)]
CallerKey = Annotated[ApiKey | None, Depends(authenticate)]
