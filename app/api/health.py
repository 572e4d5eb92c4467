"""Liveness (`/healthz`: the process serves HTTP, nothing else checked), readiness (`/readyz`:
database reachable, schema current, embedder loaded; 503 with the reasons otherwise) and
Prometheus metrics (`/metrics`: with keys set, a bearer key unless
``MEMPROXY_METRICS_REQUIRE_KEY=false``; the probes stay open for orchestrators)."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text
from starlette.responses import JSONResponse, Response

from app.deps import Services, check_any_key
from app.memory.store.db import schema_is_current

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


def _not_ready(checks: dict[str, Any]) -> JSONResponse:
    failing = {k: v for k, v in checks.items() if not str(v).startswith("ok")}
    reason = "; ".join(f"{k}: {v}" for k, v in failing.items())
    return JSONResponse({"status": "not ready", "reason": reason, "checks": checks}, 503)
