"""The application factory. ``uvicorn --factory app.main:create_app`` or ``memproxy serve``.

The lifespan owns every long-lived object (the database engine, migrated to the newest schema at
start; the embedder and the memory service with its search indexes; the upstream connection pool;
the background runner; the MCP server's session manager) and closes them in order; nothing is
created at import time. `memproxy serve` loads the embedder a moment earlier, in the factory
(:func:`create_served_app`), so that a model it cannot load ends the start in one line.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
from fastapi import FastAPI
from pydantic_ai.models import Model

from app import __version__, startup
from app.api import chat, docs, forgetting, health, learn, memories, models, relay, ui, users
from app.api.mcp import McpEndpoint
from app.background import BackgroundRunner
from app.body_guard import BodyGuard
from app.config import ApiKey, Settings
from app.deps import Services
from app.error_handlers import install_error_handlers
from app.log import configure_logging
from app.memory import (
    ChatMemory,
    JobQueue,
    Manager,
    MemoryService,
    MemoryStore,
    RecallJudge,
    TextEmbedder,
    Worker,
    build_http_client,
    configure_threads,
    engine_for,
    load_embedder,
    upgrade,
)
from app.memory.learning.turns import dump
from app.memory.search.onnx_cache import ModelUnavailable
from app.memory.store.driver import missing_driver_line
from app.metrics import Metrics
from app.middleware import RequestIdMiddleware
from app.origin_guard import OriginGuard
from app.proxy.chat_proxy import ChatProxy
from app.proxy.hooks import MemoryHooks
from app.proxy.identity import Authenticator
from app.proxy.models_cache import ModelsCache
from app.proxy.upstream import Upstream, build_client, build_transport
from app.settings_errors import exit_start, settings_or_exit, unknown_settings

BACKGROUND_DRAIN_SECONDS = 10.0
"""How long shutdown waits for after-response work before cancelling it."""


logger = logging.getLogger("memproxy")


def create_app(
    settings: Settings | None = None,
    *,
    upstream_transport: httpx.AsyncBaseTransport | None = None,
    hooks: MemoryHooks | None = None,
    embedder: TextEmbedder | None = None,
    manager_model: Model | None = None,
    embedder_now: bool = False,
) -> FastAPI:
    """Build the app. Tests inject `upstream_transport` (respx), `hooks` (recording fakes, in
    place of memory recall), `embedder` (a deterministic fake, in place of the model) and
    `manager_model` (a PydanticAI FunctionModel, in place of the Manager's LLM).

    `embedder_now` (`memproxy serve`): the embedder is loaded here rather than in the lifespan,
    before uvicorn prints a line: an export that is damaged and cannot be made again is then one
    line and exit 2, as a bad setting is, never a traceback."""
    from_environment = settings is None
    settings = settings if settings is not None else settings_or_exit()
    configure_logging(settings.log_level, settings.log_format)
    if from_environment:  # a misspelt MEMPROXY_ variable is otherwise silently ignored
        for warning in unknown_settings():
            startup.logger.warning("%s", warning)
    authenticator = Authenticator(settings.parsed_api_keys)
    metrics = Metrics()  # here, not in the lifespan: the middleware counts requests into it
    mcp = McpEndpoint(settings)  # its session manager runs in the lifespan
    if embedder_now:  # served: a missing database driver ends the start in one line
        _driver_or_exit(settings)
    loaded = _embedder_or_exit(settings) if embedder_now and embedder is None else None

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine = engine_for(settings)
        await upgrade(engine)
        configure_threads(1)
        text_embedder = embedder if embedder is not None else loaded
        if text_embedder is None:
            text_embedder = await asyncio.to_thread(load_embedder, settings)
        transport = upstream_transport or build_transport(settings)
        client = build_client(settings, transport)
        upstream = Upstream(
            client, transport, settings, proxy_keys_enabled=authenticator.enabled, metrics=metrics
        )
        runner = BackgroundRunner()
        store = MemoryStore(engine)
        memory = MemoryService(
            store,
            text_embedder,
            dense_weight=settings.dense_weight,
            cache_max_memories=settings.index_cache_max_memories,
            image_min_memories=settings.index_image_min_memories,
            ivf_min_vectors=settings.index_ivf_min_vectors,
            idle_seconds=settings.index_idle_seconds,
        )
        queue = JobQueue(
            store.sessions,
            limit=settings.manager_queue_limit,
            lease_seconds=settings.manager_lease_seconds,
        )
        manager_http = build_http_client(settings)
        worker = None
        manager = Manager(settings, http_client=manager_http, model=manager_model)
        if settings.manager_enabled or settings.recall_judge:
            await asyncio.to_thread(_warm, manager)
        if settings.manager_enabled:
            worker = Worker(queue, memory, manager, settings, metrics)
            await worker.start()
        metrics.count_embedding_cache(lambda: int(getattr(text_embedder, "cache_hits", 0)))
        chat_hooks = hooks or ChatMemory(
            memory, settings, runner, metrics,
            queue=queue if settings.manager_enabled else None, worker=worker,
            judge=RecallJudge(manager, settings, metrics) if settings.recall_judge else None,
        )  # fmt: skip
        app.state.services = Services(
            settings=settings,
            client=client,
            upstream=upstream,
            authenticator=authenticator,
            proxy=ChatProxy(settings, upstream, chat_hooks, runner),
            models=ModelsCache(upstream, settings.models_cache_seconds),
            runner=runner,
            engine=engine,
            store=store,
            memory=memory,
            metrics=metrics,
            admins=Authenticator([ApiKey(k, None) for k in settings.admin_keys]),
            jobs=queue,
            worker=worker,
        )
        startup.report(
            settings, embedding_model=text_embedder.model_name, keys=len(settings.api_keys)
        )
        if settings.upstream_check_at_start:
            runner.spawn(startup.check_upstream(upstream), name="upstream-check")
        try:
            async with mcp.running():
                yield
        except asyncio.CancelledError:
            # Served, only a forced exit cancels the lifespan (a second Ctrl-C: uvicorn skips
            # the shutdown, then the closing loop cancels every task); the cleanup below runs.
            startup.logger.warning("shutdown forced: requests under way were cut")
            raise
        finally:
            await runner.drain(BACKGROUND_DRAIN_SECONDS)
            if worker is not None:
                await worker.stop()
            await memory.cache.close()
            await manager_http.aclose()
            await client.aclose()
            await engine.dispose()
            if embedder is None:
                text_embedder.close()

    # No built-in docs routes: app/api/docs.py serves them, behind a key when keys are set.
    app = FastAPI(
        title="memproxy",
        version=__version__,
        lifespan=lifespan,
        openapi_url=None,
        docs_url=None,
        redoc_url=None,
    )
    install_error_handlers(app)
    app.include_router(health.router)
    if settings.docs_enabled:
        app.include_router(docs.router)
    app.include_router(chat.router)
    app.include_router(models.router)
    app.include_router(learn.router)  # before memories: its last route takes the rest
    app.include_router(forgetting.router)  # the same
    app.include_router(memories.router)
    app.include_router(users.router)
    app.include_router(ui.router)
    app.router.routes.append(mcp.route)
    app.include_router(relay.router)  # last: its /v1/{path} catches what the others do not
    app.add_middleware(BodyGuard, settings=settings)  # inside the request id: refusals logged
    app.add_middleware(OriginGuard, settings=settings)  # runs before BodyGuard (added after it)
    app.add_middleware(RequestIdMiddleware, metrics=metrics)
    return app


def _driver_or_exit(settings: Settings) -> None:
    missing = missing_driver_line(settings.database_url, "MEMPROXY_DATABASE_URL")
    if missing is not None:
        exit_start([missing])


def _embedder_or_exit(settings: Settings) -> TextEmbedder:
    try:
        return load_embedder(settings)
    except ModelUnavailable as exc:
        exit_start([str(exc)])


def _warm(manager: Manager) -> None:
    """Blocking, for a worker thread at start-up: what a process's first job would otherwise do
    on the event loop, stalling every chat meanwhile (measured 0.2-0.3 s): the model's first
    construction (pydantic-ai loads genai-prices' data then) and the schema of the messages a
    job stores, which pydantic builds on first use. Only a speed-up: a failure is logged."""
    try:
        manager.model_for("warm-up")
        dump([])
    except Exception:  # the first job meets it again, and says so the usual way
        logger.warning("warming the Manager up failed", exc_info=True)


def create_served_app() -> FastAPI:
    """What `memproxy serve` runs: :func:`create_app` from the environment, its embedder loaded
    first, then a GC freeze.

    ``gc.freeze()`` moves everything alive after start-up (modules, schemas, routes) out of the
    cyclic collector's sight; its periodic full scans of those objects cost ~5 % of the CPU under
    load. Process-wide, so not done in `create_app` (tests build many apps in one process).
    """
    app = create_app(embedder_now=True)
    gc.collect()
    gc.freeze()
    return app
