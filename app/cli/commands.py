"""memproxy: run the memory proxy, and manage its database, embedding model and memories.

``memproxy serve [--host H] [--port P]``   run the proxy (settings from the environment and .env)
``memproxy db upgrade``                    bring the database schema to the newest migration
``memproxy model prepare``                 export the embedding model to ONNX (fp32 and int8)
                                           under MEMPROXY_EMBEDDING_CACHE_DIR, once; the Docker
                                           build runs it so the image starts ready
``memproxy ready [--url U]``               exit 0 when the server's /readyz says ready, else 1
                                           (the container's health check)
``memproxy memories ACTION --user U``      the memories, for operators: list, get, stats,
                                           history, add, edit, pin, unpin, search, delete,
                                           export, import (app/cli/memory.py)
``memproxy memories move --from A --to B`` give every memory of user A to user B
``memproxy users list [--limit N]``        the users, latest activity first (and --offset N)
``memproxy index rebuild [--user U]``      re-embed and check the search indexes
``memproxy jobs list|retry [--user U]``    the Manager's queue: counts, failures, the user's
                                           jobs; re-queue failures (all, or ``--job ID``)
``memproxy learn FILE --user U``           learn from past conversations: an Open WebUI chat
                                           export or ChatGPT's conversations.json, queued for
                                           the Manager (app/cli/learn.py)
``memproxy fake-upstream [--port P]``      run a fake OpenAI-compatible model server, for trying
                                           memproxy (and its README examples) without a real LLM

Every command that opens the database takes ``--database`` (a SQLAlchemy URL or a file path; the
default is MEMPROXY_DATABASE_URL) and says on its first line of stderr which one it opened. Only
``serve``, ``db upgrade``, ``memories add|import`` create a missing SQLite database: the others
exit 2 naming the path they looked at, rather than report an empty new one.

The memory, users, jobs, index and learn commands take ``--json``: machine output alone on stdout.

A bad setting, or a database that cannot be opened, is one line each on stderr and exit status 2,
for every command (caught in :func:`main`, nowhere else); so is an embedding-model export in the
cache that is damaged and cannot be made again (it is made again when it can), for `serve` where
its app loads the model (:func:`app.main.create_served_app`).

Each command imports what it needs when it runs (uvicorn, the memory stack, httpx): `memproxy
ready` is the container's health check, run every 30 s, and starts in ~0.5 s instead of ~2 s.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy.exc import DBAPIError

from app.config import Settings
from app.memory.search.onnx_cache import ModelUnavailable
from app.settings_errors import ConfigError, load_settings, unknown_settings

if TYPE_CHECKING:
    from app.memory.search.embedder import TextEmbedder

CREATES_DATABASE = {("db", "upgrade"), ("memories", "add"), ("memories", "import")}
"""The commands that may create a missing SQLite database (besides `serve`); the rest only read
one, or act on what is in it, so a missing database is a wrong path, not an empty store."""


def main(argv: Sequence[str] | None = None, *, embedder: TextEmbedder | None = None) -> int:
    """Run a command; `embedder` stands in for the model in the memory commands (tests)."""
    args = _parser().parse_args(argv)
    try:
        return _dispatch(args, embedder)
    except ConfigError as exc:
        for line in exc.lines:
            print(f"memproxy: {line}", file=sys.stderr)
        _warn_unknown()  # a misspelt name may be the very cause
        return 2
    except ModelUnavailable as exc:  # `model prepare`, or a memory command loading the model
        print(f"memproxy: {exc}", file=sys.stderr)
        return 2


def _dispatch(args: argparse.Namespace, embedder: TextEmbedder | None) -> int:
    if args.command == "fake-upstream":  # reads no settings
        from app.devtools.serve_fake import serve

        serve(args.host, args.port)  # prints where it listens once it does
        return 0
    # The app reads its settings from the environment: put the flags there, so what it reports
    # at start is where it really listens, and which database it really opened.
    if getattr(args, "database", None):
        os.environ["MEMPROXY_DATABASE_URL"] = database_url(args.database)
    if args.command == "serve":
        if args.host:
            os.environ["MEMPROXY_HOST"] = args.host
        if args.port:
            os.environ["MEMPROXY_PORT"] = str(args.port)
    settings = load_settings()
    if args.command == "serve":
        _check_database(args, settings, create=True)  # its start-up lines name the database
        return _serve(settings)  # which logs the unknown-variable warnings, in its log format
    if args.command not in ("db", "memories", "users", "index", "jobs", "learn"):
        _warn_unknown()
        return _prepare_model(settings) if args.command == "model" else _ready(args, settings)
    action = (args.command, getattr(args, "action", ""))
    where = _check_database(args, settings, create=action in CREATES_DATABASE)
    print(f"database: {where}", file=sys.stderr)
    _warn_unknown()
    try:
        return _database_command(args, settings, embedder)
    except DBAPIError as exc:  # opened, but unusable: not a SQLite file, a server refusing...
        reason = f"cannot use the database at {where} ({_source(args)}): {exc.orig}"
        print(f"memproxy: {reason}", file=sys.stderr)
        return 2


def _warn_unknown() -> None:
    for warning in unknown_settings():
        print(f"memproxy: warning: {warning}", file=sys.stderr)


def _database_command(
    args: argparse.Namespace, settings: Settings, embedder: TextEmbedder | None
) -> int:
    if args.command == "db":
        asyncio.run(_upgrade(settings))
        from app.log import mask_url

        print(f"database at the newest schema: {mask_url(settings.database_url)}")
        return 0
    from app.cli import memory

    return memory.run(args, settings, embedder)


def database_url(value: str) -> str:
    """`--database`: a SQLAlchemy URL as it is, a file path as a SQLite URL to its absolute path."""
    if "://" in value:
        return value
    return f"sqlite+aiosqlite:///{Path(value).expanduser().absolute()}"


def _source(args: argparse.Namespace) -> str:
    return "--database" if getattr(args, "database", None) else "MEMPROXY_DATABASE_URL"


def _check_database(args: argparse.Namespace, settings: Settings, *, create: bool) -> str:
    """Fail with one line when the database cannot be opened (or, unless `create`, is missing);
    else what to call it: the SQLite file, or the URL with its password and query values masked."""
    from app.log import mask_url
    from app.memory.store.db import DatabaseUnavailable, check_database
    from app.memory.store.driver import missing_driver_line

    source = _source(args)
    missing = missing_driver_line(settings.database_url, source)
    if missing is not None:  # else a traceback from deep in SQLAlchemy, at the first connection
        raise ConfigError([missing])
    try:
        path = check_database(settings.database_url, create=create)
    except DatabaseUnavailable as exc:
        if exc.missing:
            raise ConfigError([
                f"no memproxy database at {exc.path} ({source}); run from the folder memproxy "
                "serves from or pass --database"
            ]) from None  # fmt: skip
        raise ConfigError(
            [f"cannot open the database at {exc.path} ({source}): {exc.reason}"]
        ) from None
    return str(path or mask_url(settings.database_url))


def _serve(settings: Settings) -> int:
    import uvicorn

    from app.server import uvicorn_options  # header and connection limits, slow clients

    # The factory loads the embedder before uvicorn prints a line: an export that is damaged
    # and cannot be made again ends the start there, in one line with status 2.
    uvicorn.run(
        "app.main:create_served_app",
        factory=True,
        host=settings.host,
        port=settings.port,
        **uvicorn_options(settings),
    )
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="memproxy", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    database = argparse.ArgumentParser(add_help=False)
    database.add_argument(
        "--database",
        metavar="URL_OR_PATH",
        help="the database: a SQLAlchemy URL or a SQLite file (default MEMPROXY_DATABASE_URL)",
    )

    serve = commands.add_parser("serve", help="run the proxy", parents=[database])
    serve.add_argument("--host", help="listen address (default MEMPROXY_HOST, 127.0.0.1)")
    serve.add_argument("--port", type=int, help="listen port (default MEMPROXY_PORT, 8000)")

    db = commands.add_parser("db", help="database schema", parents=[database])
    db.add_argument("action", choices=["upgrade"], help="upgrade: apply all pending migrations")

    model = commands.add_parser("model", help="the embedding model")
    model.add_argument("action", choices=["prepare"], help="prepare: export it to ONNX once")

    ready = commands.add_parser("ready", help="check a running server's /readyz")
    ready.add_argument("--url", help="default: http://127.0.0.1:MEMPROXY_PORT/readyz")

    _memory_parsers(commands, database)

    fake = commands.add_parser("fake-upstream", help="run a fake OpenAI-compatible upstream")
    fake.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    fake.add_argument("--port", type=int, default=9000, help="listen port (default 9000)")
    return parser


def _prepare_model(settings: Settings) -> int:
    from app.memory.search.embedder import bundled_model_path
    from app.memory.search.onnx_model import prepare

    model = settings.embedding_model or bundled_model_path()
    for quantize in (False, True):
        files = prepare(model, settings.embedding_cache_dir, quantize=quantize)
        print(f"{files.name}: {files.onnx}")
    return 0


def _ready(args: argparse.Namespace, settings: Settings) -> int:
    import httpx

    url = args.url or f"http://127.0.0.1:{settings.port}/readyz"
    try:
        response = httpx.get(url, timeout=5.0, trust_env=False)
    except httpx.HTTPError as exc:
        print(f"not ready: {url}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(response.text)
    return 0 if response.status_code == 200 else 1


def _memory_parsers(commands: Any, database: argparse.ArgumentParser) -> None:
    """`memories`, `users`, `jobs` and `index`: their arguments are in app/cli/memory_args.py, and
    app/cli/memory.py runs them."""
    from app.cli.memory_args import add_parsers

    add_parsers(commands, database)


async def _upgrade(settings: Settings) -> None:
    from app.memory.store.db import engine_for, upgrade

    engine = engine_for(settings)
    try:
        await upgrade(engine)
    finally:
        await engine.dispose()
