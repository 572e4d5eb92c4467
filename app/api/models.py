"""`GET /v1/models` (and `/models`): the upstream's list, briefly cached."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from app.deps import CallerDep
from app.proxy.upstream import RELAYED_HEADERS

router = APIRouter(tags=["models"])


@router.get("/v1/models")
@router.get("/models", include_in_schema=False)
async def list_models(request: Request, caller: CallerDep) -> Response:
    services = caller.services
    headers = services.upstream.headers(request.headers.items(), caller.request_id)
    entry, hit = await services.models.get(headers)
    shown = {name.decode(): value.decode() for name, value in RELAYED_HEADERS}
    shown["x-memproxy-cache"] = "hit" if hit else "miss"
    # The upstream's bytes and content type, served on memproxy's origin: RELAYED_HEADERS.
    return Response(entry.body, media_type=entry.content_type, headers=shown)
