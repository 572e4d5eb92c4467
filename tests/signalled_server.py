"""memproxy run as `memproxy serve` runs it (``uvicorn.run`` in the main thread, so uvicorn's
signal handling, with `memproxy serve`'s options), but with the fake embedder: for tests that
stop it with signals (tests/test_shutdown.py).

``python -m tests.signalled_server PORT UPSTREAM_URL DATABASE_URL GRACE_SECONDS``, run from a
folder with no ``.env`` and no ``MEMPROXY_`` variables set.
"""

from __future__ import annotations

import sys

import uvicorn

from app.config import Settings
from app.main import create_app
from app.server import uvicorn_options
from tests.fakes import FakeEmbedder


def main(port: str, upstream: str, database: str, grace: str) -> None:
    settings = Settings(
        upstream_base_url=upstream,
        database_url=database,
        shutdown_grace_seconds=float(grace),
        manager_enabled=False,
        upstream_check_at_start=False,
    )
    app = create_app(settings, embedder=FakeEmbedder())
    uvicorn.run(app, host="127.0.0.1", port=int(port), **uvicorn_options(settings))


if __name__ == "__main__":
    main(*sys.argv[1:])
