"""Fixtures of the Manager's tests: none of them may reach a real model (the extraction tests'
helpers are in support.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
import respx
from pydantic_ai import models
from sqlalchemy.ext.asyncio import AsyncEngine

from app.memory.store.db import create_engine
from tests.helpers import completion_json


@pytest.fixture(autouse=True)
def _no_real_models(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(models, "ALLOW_MODEL_REQUESTS", False)  # restored after the test
    yield


@pytest.fixture
async def engines(engine: AsyncEngine) -> AsyncIterator[list[AsyncEngine]]:
    """Two replicas' engines on the test's one (migrated) database."""
    other = create_engine(str(engine.url.render_as_string(hide_password=False)))
    yield [engine, other]
    await other.dispose()


@pytest.fixture
def upstream_ok(upstream: respx.Router) -> respx.Route:
    return upstream.post("/chat/completions").respond(json=completion_json("Noted."))
