"""Every other `/v1/*` path (embeddings, audio, files, moderations...), relayed unchanged so one
connection URL serves everything a client does. Registered last: specific routes win.

Only paths that stay under the upstream's `/v1` are relayed (`app.proxy.relay_path`); a path
another route serves with other methods (`DELETE /v1/chat/completions`) is a 405, never relayed.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.exceptions import HTTPException
from starlette.responses import Response

from app.api import chat, memories, models
from app.deps import CallerDep
from app.proxy.relay_path import relay_path, served_methods

router = APIRouter(tags=["relay"])
_SERVED = (*chat.router.routes, *models.router.routes, *memories.router.routes)
"""The routes that own their paths under `/v1`, whatever the method."""


@router.api_route(
    "/v1/{path:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"], include_in_schema=False
)
async def relay(request: Request, caller: CallerDep) -> Response:
    methods = served_methods(request.scope["path"], _SERVED)
    if methods:
        raise HTTPException(405, headers={"Allow": ", ".join(methods)})
    path = relay_path(request.scope)
    return await caller.services.proxy.relay(request, path, caller.request_id)
