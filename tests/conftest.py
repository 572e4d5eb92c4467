"""Shared fixtures. The upstream is faked at the HTTP edge: respx behind an injected transport for
unit tests, or the real fake server on loopback (tests/servers.py) for end-to-end ones."""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
import respx
from pydantic_ai.models import Model
from sqlalchemy.ext.asyncio import AsyncEngine

from app.config import Settings
from app.main import create_app
from app.memory.store.db import create_engine, upgrade
from app.proxy.hooks import MemoryHooks
from tests import databases
from tests.fakes import FakeEmbedder
from tests.helpers import UPSTREAM, running


@pytest.fixture(scope="session")
def _template() -> Iterator[str | None]:
    if not databases.on_postgresql():
        yield None
        return
    with databases.template() as name:
        yield name


@pytest.fixture
def database_url(tmp_path: Path, _template: str | None) -> Iterator[str]:
    """The test's own database (tests/databases.py: SQLite, or PostgreSQL when
    ``MEMPROXY_TEST_DATABASE_URL`` is set)."""
    if _template is None:
        yield f"sqlite+aiosqlite:///{tmp_path}/memproxy.db"
        return
    with databases.database(_template) as url:
        yield url


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if databases.on_postgresql():
        skip = pytest.mark.skip(reason="about SQLite itself: not run on PostgreSQL")
        for item in items:
            if "sqlite_only" in item.keywords:
                item.add_marker(skip)


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch, database_url: str) -> None:
    """A developer's MEMPROXY_* variables or .env must not change what the tests see, and every
    test gets a database of its own."""
    for name in list(os.environ):
        if name.startswith("MEMPROXY_"):
            monkeypatch.delenv(name)
    monkeypatch.setitem(Settings.model_config, "env_file", None)
    monkeypatch.setenv("MEMPROXY_DATABASE_URL", database_url)


_LOGGERS = ("memproxy", "py.warnings", "", "uvicorn", "uvicorn.error", "uvicorn.access")


@pytest.fixture(autouse=True, scope="module")
def _logging_as_it_was_in_the_module() -> Iterator[None]:
    """The same for an app a module-scoped fixture starts (tests/proxy/test_relay_paths.py): it
    configures logging before the first test's restore point, and would leave the `memproxy`
    logger printing to stderr and passing each record to `caplog` twice in later modules."""
    yield from _restored()


@pytest.fixture(autouse=True)
def _logging_as_it_was() -> Iterator[None]:
    """A test that starts memproxy in-process (`configure_logging`) leaves the loggers as they
    were: else later tests' `caplog` would see nothing of `memproxy`, whose records no longer
    propagate, and whether one does would depend on which tests ran first in its process."""
    yield from _restored()


def _restored() -> Iterator[None]:
    saved = [(logger, logger.handlers[:], logger.propagate, logger.level)
             for logger in map(logging.getLogger, _LOGGERS)]  # fmt: skip
    yield
    for logger, handlers, propagate, level in saved:
        logger.handlers[:] = handlers
        logger.propagate, logger.level = propagate, level


class _Forward(logging.Handler):
    """Hands `memproxy`'s records to pytest's capture while the `memproxy` logger keeps them to
    itself (else they reach the capture on the root logger anyway)."""

    def __init__(self, capture: logging.Handler) -> None:
        super().__init__()
        self.capture = capture

    def emit(self, record: logging.LogRecord) -> None:
        stopped = not logging.getLogger("memproxy").propagate
        if stopped and record.levelno >= self.capture.level:
            self.capture.handle(record)


@pytest.fixture
def caplog(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """pytest's `caplog`, seeing `memproxy`'s records too once an app started in the test has
    configured its logging (`configure_logging`: they no longer propagate to the root logger,
    where pytest listens)."""
    own = logging.getLogger("memproxy")
    forward = _Forward(caplog.handler)
    own.addHandler(forward)
    yield caplog
    own.removeHandler(forward)


def make_settings(**overrides: Any) -> Settings:
    # No test talks to a real Manager: those that exercise it pass a FunctionModel and enable it.
    overrides.setdefault("manager_enabled", False)
    overrides.setdefault("upstream_check_at_start", False)  # respx would see an extra /models
    return Settings(upstream_base_url=UPSTREAM, **overrides)


@pytest.fixture
def upstream() -> respx.Router:
    return respx.Router(base_url=UPSTREAM, assert_all_called=False)


AppClientFactory = Callable[..., Any]


@pytest.fixture
async def make_client(upstream: respx.Router) -> AsyncIterator[AppClientFactory]:
    """`await make_client(hooks=..., **settings)`: an httpx client talking to a fresh app."""
    async with AsyncExitStack() as stack:

        async def factory(
            hooks: MemoryHooks | None = None,
            embedder: FakeEmbedder | None = None,
            manager_model: Model | None = None,
            **overrides: Any,
        ) -> httpx.AsyncClient:
            app = create_app(
                make_settings(**overrides),
                upstream_transport=httpx.MockTransport(upstream.async_handler),
                hooks=hooks,
                embedder=embedder or FakeEmbedder(),
                manager_model=manager_model,
            )
            return await stack.enter_async_context(running(app))

        yield factory


@pytest.fixture
async def client(make_client: AppClientFactory) -> httpx.AsyncClient:
    result: httpx.AsyncClient = await make_client()
    return result


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the real model's ONNX exports go: made once per test run, shared by its tests."""
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def bundled_embedder(model_cache: Path) -> Iterator[Any]:
    """The real bundled embedder (fp32, as memories are embedded), for the tests whose figures
    are the model's (measured thresholds)."""
    from app.memory.search.embedder import Embedder, bundled_model_path
    from app.memory.search.onnx_model import prepare

    embedder = Embedder(prepare(bundled_model_path(), str(model_cache), quantize=False))
    yield embedder
    embedder.close()


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[AsyncEngine]:
    """A migrated database of the test's own (on SQLite in a folder the engine must create)."""
    url = os.environ["MEMPROXY_DATABASE_URL"]
    if not databases.on_postgresql():
        url = f"sqlite+aiosqlite:///{tmp_path}/sub/memproxy.db"
    engine = create_engine(url)
    await upgrade(engine)
    yield engine
    await engine.dispose()
