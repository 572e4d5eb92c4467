"""Shared fixtures. The upstream is faked at the HTTP edge: respx behind an injected transport for
unit tests, or the real fake server on loopback (tests/servers.py) for end-to-end ones."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
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
from tests.fakes import FakeEmbedder
from tests.helpers import UPSTREAM, running


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A developer's MEMPROXY_* variables or .env must not change what the tests see, and every
    test gets a database of its own."""
    for name in list(os.environ):
        if name.startswith("MEMPROXY_"):
            monkeypatch.delenv(name)
    monkeypatch.setitem(Settings.model_config, "env_file", None)
    monkeypatch.setenv("MEMPROXY_DATABASE_URL", f"sqlite+aiosqlite:///{tmp_path}/memproxy.db")


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


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[AsyncEngine]:
    """A migrated database of the test's own, in a folder the engine must create."""
    engine = create_engine(f"sqlite+aiosqlite:///{tmp_path}/sub/memproxy.db")
    await upgrade(engine)
    yield engine
    await engine.dispose()
