"""`POST /v1/chat/completions` (and `/chat/completions`: Open WebUI appends paths to whatever
base URL the user typed, with or without `/v1`)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from app.deps import CallerDep
from app.schemas.openai import ErrorResponse

router = APIRouter(tags=["chat"])

_ERRORS: dict[int | str, dict[str, object]] = {
    code: {"model": ErrorResponse} for code in (400, 401, 403, 413, 422, 502, 504)
}


@router.post("/v1/chat/completions", responses=_ERRORS)
@router.post("/chat/completions", include_in_schema=False)
async def chat_completions(request: Request, caller: CallerDep) -> Response:
    """Forward a chat completion upstream (streaming or not), with the user's memories."""
    return await caller.services.proxy.chat(request, caller.key, caller.request_id)
