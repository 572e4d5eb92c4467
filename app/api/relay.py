"""Every other `/v1/*` path (embeddings, audio, files, moderations...), relayed unchanged so one
connection URL serves everything a client does. Registered last: specific routes win."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from app.deps import CallerDep

router = APIRouter(tags=["relay"])


@router.api_route(
    "/v1/{path:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"], include_in_schema=False
)
async def relay(path: str, request: Request, caller: CallerDep) -> Response:
    return await caller.services.proxy.relay(request, path, caller.request_id)
