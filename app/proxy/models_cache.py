"""`GET /v1/models`, relayed with a short cache.

Open WebUI asks for the model list on every chat request; the upstream's answer changes only when
someone pulls or removes a model, so it is reused for ``MEMPROXY_MODELS_CACHE_SECONDS``. The cache
is keyed by the credentials sent upstream (two clients passing their own keys through may see
different lists) and holds successful answers only. Concurrent misses share one upstream call.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from dataclasses import dataclass

import httpx

from app.errors import UpstreamUnreachable
from app.proxy.upstream import Upstream


@dataclass(frozen=True, slots=True)
class CachedModels:
    body: bytes
    content_type: str
    expires_at: float


class ModelsCache:
    def __init__(self, upstream: Upstream, ttl_seconds: float) -> None:
        self._upstream = upstream
        self._ttl = ttl_seconds
        self._entries: dict[str, CachedModels] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    async def get(self, headers: list[tuple[str, str]]) -> tuple[CachedModels, bool]:
        """The model list and whether it came from the cache; upstream errors raise."""
        key = _credential_key(headers)
        entry = self._entries.get(key)
        if entry is not None and entry.expires_at > time.monotonic():
            return entry, True
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            entry = self._entries.get(key)
            if entry is not None and entry.expires_at > time.monotonic():
                return entry, True
            request = self._upstream.build("GET", "/models", headers=headers, content=b"")
            response = await self._upstream.open(request)
            try:
                body = await response.aread()
            except httpx.HTTPError as exc:
                raise UpstreamUnreachable(
                    f"the upstream at {self._upstream.shown_url} broke off while sending the model "
                    f"list ({type(exc).__name__})"
                ) from None
            finally:
                await response.aclose()
            entry = CachedModels(
                body=body,
                content_type=response.headers.get("content-type", "application/json"),
                expires_at=time.monotonic() + self._ttl,
            )
            if self._ttl > 0:
                self._entries[key] = entry
            return entry, False


def _credential_key(headers: list[tuple[str, str]]) -> str:
    auth = next((v for n, v in headers if n == "authorization"), "")
    return hashlib.sha256(auth.encode()).hexdigest()
