"""Real servers on loopback for end-to-end tests: uvicorn in a thread, on a free port."""

from __future__ import annotations

import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import uvicorn

from app.config import Settings
from app.devtools.fake_upstream import FakeUpstream
from app.main import create_app
from app.memory.search.embedder import TextEmbedder
from app.proxy.hooks import MemoryHooks
from tests import databases
from tests.fakes import FakeEmbedder


@contextmanager
def serve(app: Any, **options: Any) -> Iterator[str]:
    """Run `app` with uvicorn on 127.0.0.1 (free port); yields its base URL. `options` go to
    `uvicorn.Config` (e.g. app.server.uvicorn_options: what `memproxy serve` runs with)."""
    options = {"log_level": "warning", "access_log": False} | options
    config = uvicorn.Config(app, host="127.0.0.1", port=0, **options)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("test server did not start")
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"{'https' if options.get('ssl_certfile') else 'http'}://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(15)


@dataclass(frozen=True)
class Stack:
    fake: FakeUpstream
    upstream_url: str
    """The fake upstream's base URL, with `/v1`."""
    proxy_url: str
    """memproxy's root URL, without `/v1`."""


@contextmanager
def serve_stack(
    hooks: MemoryHooks | None = None, embedder: TextEmbedder | None = None, **settings: Any
) -> Iterator[Stack]:
    """The fake upstream and a memproxy forwarding to it, each on its own loopback server."""
    fake = FakeUpstream()
    with tempfile.TemporaryDirectory() as data, serve(fake) as upstream:
        settings.setdefault("database_url", databases.url_in(data))
        settings.setdefault("manager_enabled", False)  # no test talks to a real Manager
        settings.setdefault("upstream_check_at_start", False)
        app = create_app(
            Settings(upstream_base_url=f"{upstream}/v1", **settings),
            hooks=hooks,
            embedder=embedder or FakeEmbedder(),
        )
        with serve(app) as proxy:
            yield Stack(fake, f"{upstream}/v1", proxy)
