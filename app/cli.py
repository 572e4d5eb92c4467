"""The ``memproxy`` command.

``memproxy serve [--host H] [--port P]``   run the proxy (settings from the environment and .env)
``memproxy db upgrade``                    bring the database schema to the newest migration
``memproxy model prepare``                 export the embedding model to ONNX (fp32 and int8)
                                           under MEMPROXY_EMBEDDING_CACHE_DIR, once; the Docker
                                           build runs it so the image starts ready
``memproxy ready [--url U]``               exit 0 when the server's /readyz says ready, else 1
                                           (the container's health check)
``memproxy memories list|add|search|delete|export|import --user U``   see app/cli_memory.py
``memproxy index rebuild [--user U]``      re-embed and check the search indexes
``memproxy jobs list|retry [--user U]``    the Manager's queue: counts, failures; re-queue them
``memproxy fake-upstream [--port P]``      run a fake OpenAI-compatible model server, for trying
                                           memproxy (and its README examples) without a real LLM

Each command imports what it needs when it runs (uvicorn, the memory stack, httpx): `memproxy
ready` is the container's health check, run every 30 s, and starts in ~0.5 s instead of ~2 s.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from app.config import Settings
from app.memory.models import MemoryType

if TYPE_CHECKING:
    from app.memory.embedder import TextEmbedder


def main(argv: Sequence[str] | None = None, *, embedder: TextEmbedder | None = None) -> int:
    """Run a command; `embedder` stands in for the model in the memory commands (tests)."""
    parser = argparse.ArgumentParser(prog="memproxy", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the proxy")
    serve.add_argument("--host", help="listen address (default MEMPROXY_HOST, 127.0.0.1)")
    serve.add_argument("--port", type=int, help="listen port (default MEMPROXY_PORT, 8000)")

    db = commands.add_parser("db", help="database schema")
    db.add_argument("action", choices=["upgrade"], help="upgrade: apply all pending migrations")

    model = commands.add_parser("model", help="the embedding model")
    model.add_argument("action", choices=["prepare"], help="prepare: export it to ONNX once")

    ready = commands.add_parser("ready", help="check a running server's /readyz")
    ready.add_argument("--url", help="default: http://127.0.0.1:MEMPROXY_PORT/readyz")

    _memory_parsers(commands)

    fake = commands.add_parser("fake-upstream", help="run a fake OpenAI-compatible upstream")
    fake.add_argument("--host", default="127.0.0.1")
    fake.add_argument("--port", type=int, default=9000)

    args = parser.parse_args(argv)
    if args.command == "serve":
        # The app reads its settings from the environment: put the flags there, so what it
        # reports at start is where it really listens.
        if args.host:
            os.environ["MEMPROXY_HOST"] = args.host
        if args.port:
            os.environ["MEMPROXY_PORT"] = str(args.port)
        settings = Settings()
        import uvicorn

        uvicorn.run(
            "app.main:create_served_app",
            factory=True,
            host=settings.host,
            port=settings.port,
            access_log=False,  # memproxy logs one line per request itself, with its request id
            server_header=False,
            log_level=settings.log_level.lower(),
        )
    elif args.command == "db":
        url = Settings().database_url
        asyncio.run(_upgrade(url))
        from app.startup import redact

        print(f"database at the newest schema: {redact(url)}")
    elif args.command == "model":
        return _prepare_model(Settings())
    elif args.command == "ready":
        return _ready(args.url or f"http://127.0.0.1:{Settings().port}/readyz")
    elif args.command in ("memories", "index", "jobs"):
        from app import cli_memory

        return cli_memory.run(args, embedder)
    elif args.command == "fake-upstream":
        import uvicorn

        from app.devtools.fake_upstream import FakeUpstream

        uvicorn.run(
            FakeUpstream(), host=args.host, port=args.port, access_log=False, log_level="warning"
        )
    return 0


def _prepare_model(settings: Settings) -> int:
    from app.memory.embedder import bundled_model_path, prepare

    model = settings.embedding_model or bundled_model_path()
    for quantize in (False, True):
        files = prepare(model, settings.embedding_cache_dir, quantize=quantize)
        print(f"{files.name}: {files.onnx}")
    return 0


def _ready(url: str) -> int:
    import httpx

    try:
        response = httpx.get(url, timeout=5.0, trust_env=False)
    except httpx.HTTPError as exc:
        print(f"not ready: {url}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(response.text)
    return 0 if response.status_code == 200 else 1


def _memory_parsers(commands: Any) -> None:
    """`memories`, `jobs` and `index` (run by app/cli_memory.py)."""
    memories = commands.add_parser("memories", help="list, add, search, delete, export, import")
    actions = memories.add_subparsers(dest="action", required=True)
    user = argparse.ArgumentParser(add_help=False)
    user.add_argument("--user", required=True, help="the user whose memories to act on")

    listing = actions.add_parser("list", parents=[user])
    listing.add_argument("--type", action="append", choices=[t.value for t in MemoryType])
    listing.add_argument("--contains")
    listing.add_argument("--limit", type=int, default=100)
    listing.add_argument("--json", action="store_true", help="JSON Lines instead of a table")

    add = actions.add_parser("add", parents=[user])
    add.add_argument("content")
    add.add_argument("--type", default="fact", choices=[t.value for t in MemoryType])
    add.add_argument("--pinned", action="store_true")
    add.add_argument("--metadata", default="{}", help="a JSON object")

    search = actions.add_parser("search", parents=[user])
    search.add_argument("query")
    search.add_argument("--limit", type=int, default=10)
    search.add_argument("--min-score", type=float, help="default MEMPROXY_RELEVANCE_THRESHOLD")
    search.add_argument("--json", action="store_true")

    delete = actions.add_parser("delete", parents=[user])
    delete.add_argument("ids", nargs="*")
    delete.add_argument("--all", action="store_true", help="every memory of the user")
    delete.add_argument("--yes", action="store_true", help="confirm --all")

    export = actions.add_parser("export", parents=[user])
    export.add_argument("--output", help="file to write (default: standard output)")

    imports = actions.add_parser("import", parents=[user])
    imports.add_argument("file", nargs="?", help="JSON Lines file (default: standard input)")

    jobs = commands.add_parser("jobs", help="the Manager's job queue")
    jobs.add_argument(
        "action",
        choices=["list", "retry"],
        help="list: counts, failures; retry: queue failures again",
    )
    jobs.add_argument("--user", help="only this user's jobs")

    index = commands.add_parser("index", help="search indexes")
    index.add_argument("action", choices=["rebuild"])
    index.add_argument("--user", help="only this user (default: every user)")


async def _upgrade(url: str) -> None:
    from app.memory.db import create_engine, upgrade

    engine = create_engine(url)
    try:
        await upgrade(engine)
    finally:
        await engine.dispose()


if __name__ == "__main__":
    sys.exit(main())
