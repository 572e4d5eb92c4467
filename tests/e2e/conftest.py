"""The real-model suite (marker ``real_model``, ``make e2e``): llama.cpp's llama-server serving
Qwen2.5-Coder (bench/llm_server.py), and memproxy on loopback in front of it, with the real
embedder and the Manager asking the same server.

Without the runtime or the model it is skipped, saying how to get them (``make e2e`` installs
both); in CI (``CI`` set) it fails instead: CI installs them first, so missing means broken.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest

from app.config import Settings
from app.main import create_app
from app.memory.search.embedder import TextEmbedder, load_embedder
from bench.llm_server import LlamaServer, start_server, unavailable_reason
from tests.servers import serve

CHAT_MODEL = "qwen0.5b"
"""The upstream of the chat tests: ~24 tok/s here, enough to compare answers quickly."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.path).startswith(here):
            item.add_marker(pytest.mark.real_model)


def _server(model: str) -> Iterator[LlamaServer]:
    if (reason := unavailable_reason(model)) is not None:
        message = f"{reason} (`make e2e` installs the runtime and the model)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    # One slot: the answers of two requests at once would depend on batching; seeds must hold.
    with start_server(model, parallel=1, ctx_size=8192, extra_args=["--seed", "1"]) as server:
        yield server


@pytest.fixture(scope="session")
def llm() -> Iterator[LlamaServer]:
    yield from _server(CHAT_MODEL)


@pytest.fixture(scope="session")
def embedder() -> TextEmbedder:
    return load_embedder(Settings())


def proxy_settings(llm: LlamaServer, data: str, **settings: Any) -> Settings:
    return Settings(
        upstream_base_url=llm.base_url,
        database_url=f"sqlite+aiosqlite:///{data}/memproxy.db",
        upstream_check_at_start=False,
        **settings,
    )


@pytest.fixture(scope="session")
def proxy(llm: LlamaServer, embedder: TextEmbedder) -> Iterator[str]:
    """memproxy's /v1 URL, forwarding to the real server; memory on, the Manager off (the
    chat tests compare answers; the Manager's own tests make their memproxy)."""
    with tempfile.TemporaryDirectory() as data:
        app = create_app(proxy_settings(llm, data, manager_enabled=False), embedder=embedder)
        with serve(app) as url:
            yield f"{url}/v1"
