"""The ``memproxy`` command.

``memproxy serve [--host H] [--port P]``   run the proxy (settings from the environment and .env)
``memproxy db upgrade``                    bring the database schema to the newest migration
``memproxy memories list|add|search|delete|export|import --user U``   see app/cli_memory.py
``memproxy index rebuild [--user U]``      re-embed and check the search indexes
``memproxy jobs list|retry [--user U]``    the Manager's queue: counts, failures; re-queue them
``memproxy fake-upstream [--port P]``      run a fake OpenAI-compatible model server, for trying
                                           memproxy (and its README examples) without a real LLM
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence

import uvicorn

from app import cli_memory
from app.config import Settings
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

    cli_memory.add_parsers(commands)

    fake = commands.add_parser("fake-upstream", help="run a fake OpenAI-compatible upstream")
    fake.add_argument("--host", default="127.0.0.1")
    fake.add_argument("--port", type=int, default=9000)

    args = parser.parse_args(argv)
    if args.command == "serve":
        settings = Settings()
        uvicorn.run(
            "app.main:create_served_app",
            factory=True,
            host=args.host or settings.host,
            port=args.port or settings.port,
            access_log=False,  # memproxy logs one line per request itself, with its request id
            server_header=False,
            log_level=settings.log_level.lower(),
        )
    elif args.command == "db":
        url = Settings().database_url
        asyncio.run(_upgrade(url))
        print(f"database at the newest schema: {url}")
    elif args.command in ("memories", "index", "jobs"):
        return cli_memory.run(args, embedder)
    elif args.command == "fake-upstream":
        from app.devtools.fake_upstream import FakeUpstream

        uvicorn.run(
            FakeUpstream(), host=args.host, port=args.port, access_log=False, log_level="warning"
        )
    return 0


async def _upgrade(url: str) -> None:
    from app.memory.db import create_engine, upgrade

    engine = create_engine(url)
    try:
        await upgrade(engine)
    finally:
        await engine.dispose()


if __name__ == "__main__":
    sys.exit(main())
