"""The proxy's request handling: what happens between a router and the upstream.

Per chat request, on the hot path: read and check the body, classify it, resolve the user, let
the memory hook prepare (only for `chat` requests with memory on; a failing hook is logged and the
chat goes on without memory), then hand a :class:`ProxyResponse` back to the router. After the
response: the completion is read from the captured bytes and given to the hook, in the background.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from typing import Any

import httpx
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import Response

from app.background import BackgroundRunner
from app.config import ApiKey, Settings
from app.proxy.body import dump_json_object, read_body, read_chat
from app.proxy.hooks import Completion, MemoryHooks, Outcome, Preparation, RequestContext
from app.proxy.identity import resolve_user, token_secret
from app.proxy.json_pieces import Spans
from app.proxy.kinds import parse_memory_mode
from app.proxy.offload import CollectorPause, in_lane, off_loop, pause_collector
from app.proxy.relay import ProxyResponse
from app.proxy.transport import Piece
from app.proxy.upstream import Upstream
from app.proxy.user_name import user_name

logger = logging.getLogger("memproxy.proxy")


class ChatProxy:
    def __init__(
        self, settings: Settings, upstream: Upstream, hooks: MemoryHooks, runner: BackgroundRunner
    ) -> None:
        self.upstream = upstream
        self.hooks = hooks
        self.runner = runner
        self._max_body = settings.max_body_bytes
        self._user_headers = tuple(settings.user_id_headers)
        self._name_headers = tuple(settings.user_name_headers)
        self._task_header = settings.task_header
        self._require_user = settings.require_user
        self._jwt_secret = token_secret(settings)
        self._jwt_max_lifetime = settings.openwebui_jwt_max_lifetime_seconds
        self._unbound_names_users = settings.unbound_keys_name_users

    async def chat(self, request: Request, key: ApiKey | None, request_id: str) -> Response:
        raw = await read_body(request, self._max_body)
        # A large body's objects are many: no collector walks over them meanwhile (offload.py).
        pause = pause_collector(len(raw))
        try:
            response, ctx, reading = await self._chat(request, key, request_id, raw)
        except BaseException:
            if pause is not None:
                pause.release()
            raise
        if pause is not None:
            self.runner.spawn(self._end_pause(ctx, pause, reading), name=f"end-pause-{request_id}")
        return response

    async def _chat(
        self, request: Request, key: ApiKey | None, request_id: str, raw: bytes
    ) -> tuple[Response, RequestContext, Awaitable[object] | None]:
        headers = request.headers
        # Tens of megabytes take a second to parse and check: not on the loop (offload.py).
        data, checked, kind, spans = await off_loop(
            len(raw), read_chat, raw, headers.get(self._task_header)
        )
        mode = parse_memory_mode(headers.get("x-memory"))
        user_id = resolve_user(
            headers,
            self._user_headers,
            checked.user,
            key,
            require_user=self._require_user,
            jwt_secret=self._jwt_secret,
            jwt_max_lifetime=self._jwt_max_lifetime,
            unbound_names_users=self._unbound_names_users,
        )
        ctx = RequestContext(
            request_id=request_id,
            user_id=user_id,
            kind=kind.kind,
            task=kind.task,
            memory_mode=mode,
            body=data,
            request=checked,
            body_bytes=len(raw),
            user_name=user_name(headers, self._name_headers, signed=self._jwt_secret is not None),
        )
        request.state.user_id = user_id  # for the access log line
        request.state.kind = kind.kind.value

        preparation = None
        if ctx.recall_allowed:
            started = time.perf_counter()
            preparation = await self._prepare(ctx)
            request.state.memory_ms = round((time.perf_counter() - started) * 1000, 1)
            if preparation is not None and preparation.injected is not None:
                request.state.injected = preparation.injected
        try:
            upstream_request = await self._upstream_request(
                ctx, raw, data, spans, preparation, headers
            )
        except BaseException:
            # Never relayed: the hooks hear so (a job begun for this exchange is withdrawn).
            self.runner.spawn(
                self._after_response(ctx, Outcome.UPSTREAM_FAILED, 0, []),
                name=f"after-response-{request_id}",
            )
            raise
        extra = (
            [(k.encode(), v.encode()) for k, v in preparation.headers.items()]
            if preparation
            else []
        )

        def finished(outcome: Outcome, status: int, captured: list[bytes]) -> None:
            self.runner.spawn(
                self._after_response(ctx, outcome, status, captured),
                name=f"after-response-{request_id}",
            )

        response = ProxyResponse(
            self.upstream,
            upstream_request,
            extra_headers=extra,
            on_finish=finished,
            on_first_byte=preparation.on_first_byte if preparation else None,
            capture=True,
        )
        return response, ctx, preparation.reading_body if preparation else None

    @staticmethod
    async def _end_pause(
        ctx: RequestContext, pause: CollectorPause, reading: Awaitable[object] | None
    ) -> None:
        """Once the hooks are done with the parsed body (`reading`: a Manager job is written
        from it while the upstream thinks), drop it and let the collector run again."""
        try:
            if reading is not None:
                await asyncio.wait({asyncio.ensure_future(reading)})  # never cancels it
            await in_lane(ctx.drop_parsed)  # freeing ~600,000 objects: Python's work
        finally:
            pause.release()

    async def relay(self, request: Request, path: str, request_id: str) -> Response:
        """Any other `/v1/*` call (embeddings, audio, files...), passed through unchanged."""
        raw = await read_body(request, self._max_body)
        upstream_request = self.upstream.build(
            request.method,
            f"/{path}",
            headers=self.upstream.headers(request.headers.items(), request_id),
            content=raw,
            query=request.url.query,
        )
        return ProxyResponse(self.upstream, upstream_request)

    async def _upstream_request(
        self,
        ctx: RequestContext,
        raw: bytes,
        data: dict[str, Any],
        spans: Spans | None,
        preparation: Preparation | None,
        headers: Headers,
    ) -> httpx.Request:
        content: bytes | list[Piece] = raw
        if preparation is not None and preparation.body is not None:
            content = await off_loop(len(raw), dump_json_object, preparation.body, data, raw, spans)
        upstream_headers = self.upstream.headers(headers.items(), ctx.request_id)
        if "content-type" not in headers:
            upstream_headers.append(("content-type", "application/json"))
        return self.upstream.build(
            "POST", "/chat/completions", headers=upstream_headers, content=content
        )

    async def _prepare(self, ctx: RequestContext) -> Preparation | None:
        try:
            return await self.hooks.before_forward(ctx)
        except Exception:
            # Memory must never break a chat: forward the client's request as it came.
            logger.warning(
                "memory hook failed before forwarding; continuing without memory", exc_info=True
            )
            return None

    async def _after_response(
        self, ctx: RequestContext, outcome: Outcome, status: int, captured: list[bytes]
    ) -> None:
        completion = Completion(outcome, status, captured, sse=ctx.stream)
        await self.hooks.after_response(ctx, completion)
