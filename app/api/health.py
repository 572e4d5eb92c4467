"""Liveness (`/healthz`: the process serves HTTP, nothing else checked), readiness (`/readyz`:
database reachable and taking writes, schema current, embedder loaded; 503 with the reasons
otherwise) and
Prometheus metrics (`/metrics`: with keys set, a bearer key unless
``MEMPROXY_METRICS_REQUIRE_KEY=false``; the probes stay open for orchestrators)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from fastapi import APIRouter, Request
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker
from starlette.responses import JSONResponse, Response

from app.deps import Services, check_any_key
from app.memory.store.db import schema_is_current, writing
from app.storage_faults import write_failure

router = APIRouter(tags=["health"])

CHECK_SECONDS = 3.0


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(request: Request) -> JSONResponse:
    services = getattr(request.app.state, "services", None)
    if services is None:
        return _not_ready({"startup": "still starting"})
    checks: dict[str, Any] = {}
    try:
        async with asyncio.timeout(CHECK_SECONDS):
            async with services.engine.connect() as connection:
                await connection.execute(text("SELECT 1"))
        checks["database"] = "ok"
        async with asyncio.timeout(CHECK_SECONDS):
            current = await schema_is_current(services.engine)
        checks["migrations"] = "ok" if current else "not current: run `memproxy db upgrade`"
    except Exception as exc:  # readiness reports; it never raises
        checks.setdefault("database", f"unreachable: {type(exc).__name__}: {exc}"[:300])
        checks.setdefault("migrations", "unknown")
    checks["writes"] = await _writes(services.engine)
    embedder = services.memory.embedder
    loaded = getattr(embedder, "dim", 0) > 0
    checks["embedder"] = f"ok ({embedder.model_name})" if loaded else "not loaded"
    if all(str(v).startswith("ok") for v in checks.values()):
        return JSONResponse({"status": "ready", "checks": checks})
    return _not_ready(checks)


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    services: Services = request.app.state.services
    if services.settings.metrics_require_key:
        check_any_key(services, request.headers.get("authorization"))
    return Response(generate_latest(services.metrics.registry), media_type=CONTENT_TYPE_LATEST)


async def _writes(engine: AsyncEngine) -> str:
    """`ok`, or how writes fail. Only while the last write failed (a cheap check otherwise),
    a write that changes nothing is tried: a process nobody writes through any more (its
    balancer took it out) still finds the database back."""
    if write_failure(engine) is None:
        return "ok"
    try:
        async with asyncio.timeout(CHECK_SECONDS), writing(async_sessionmaker(engine)) as session:
            await session.execute(text("UPDATE alembic_version SET version_num = version_num"))
    except Exception as exc:  # readiness reports; it never raises
        failure = write_failure(engine)
        if failure is None:  # the probe's own error, when it found nothing of the database's
            return f"failing: {type(exc).__name__}: {exc}"[:300]
        return f"failing for {time.monotonic() - failure.since:.0f} s: {failure.reason}"[:300]
    return "ok"


def _not_ready(checks: dict[str, Any]) -> JSONResponse:
    failing = {k: v for k, v in checks.items() if not str(v).startswith("ok")}
    reason = "; ".join(f"{k}: {v}" for k, v in failing.items())
    return JSONResponse({"status": "not ready", "reason": reason, "checks": checks}, 503)
