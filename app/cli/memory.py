"""``memproxy memories ...``, ``users list``, ``jobs``, ``index rebuild`` and ``learn``: the
memory API for operators, straight on the database (same service, same validation, same limits as
the HTTP API).

    memproxy memories list    --user U [--type T] [--contains TEXT] [--profile|--no-profile]
                              [--limit N]
    memproxy memories get     --user U ID                 (every field, the content in full)
    memproxy memories stats   --user U                    (counts by type, pinned, recalls...)
    memproxy memories history --user U ID                 (every write to it, oldest first)
    memproxy memories add     --user U "content" | --file FILE [--type T] [--pinned] [--profile]
                              [--observed-at ISO] [--metadata JSON]
                                                          (FILE: one memory per non-blank line)
    memproxy memories edit    --user U ID [--content TEXT] [--type T] [--metadata JSON]
                              [--observed-at ISO]
    memproxy memories pin     --user U ID [ID ...]        (and unpin)
    memproxy memories profile --user U ID [ID ...]        (and unprofile: a standing fact)
    memproxy memories search  --user U "query" [--limit N] [--min-score S]
    memproxy memories delete  --user U ID [ID ...] | --all --yes
    memproxy memories forget  --user U [--dry-run]        (over the capacities, least used first)
    memproxy memories forgotten --user U [--limit N]      (and restore --user U ID: put back)
    memproxy memories move    --from A --to B             (every memory, with its history)
    memproxy memories export  --user U [--output FILE]    (JSON Lines; stdout by default)
    memproxy memories import  --user U [FILE] [--ids keep|new]   (JSON Lines; stdin by default)
    memproxy users list [--limit N] [--offset N]          (latest activity first)
    memproxy index rebuild [--user U]   re-embed what the configured model has no vectors for,
                                        and check every user's index builds
    memproxy jobs list|retry [--user U] [--job ID]   the Manager's queue: counts, failures and
                                        the user's jobs; queue failed jobs again
    memproxy learn FILE --user U [--format auto|openwebui|chatgpt] [--model M] [--no-wait]
                                        past conversations queued for the Manager (learn.py)

Every one takes ``--database``, and ``--json``: machine output alone on stdout (JSON Lines for
lists, one JSON object for a result; export writes JSON Lines either way), notes on stderr
(app/cli/show.py). ``add --file``, ``import`` and ``index rebuild`` show a progress bar on a
terminal. Only the commands that embed (add, search, import, index, and edit of the content)
load the model: the others read the database alone, and start at once.

Exit status: 0 done, 1 nothing found (an id that is not the user's, a history that is empty, a
move from a user with nothing), 2 bad input.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Awaitable, Callable, Sequence

import numpy as np
from pydantic import ValidationError
from rich.console import Console
from rich.text import Text

from app.cli import admin, forgetting, learn, memory_read, memory_write
from app.cli.show import Command, describe
from app.config import Settings
from app.errors import InvalidRequest, MemproxyError
from app.memory.search.embedder import TextEmbedder, load_embedder
from app.memory.service import MemoryService
from app.memory.store.claims import IdTaken
from app.memory.store.db import engine_for, upgrade
from app.memory.store.memories import MemoryStore
from app.proxy.identity import clean_user_id

NEEDS_MODEL = {"add", "search", "import", "index", "restore"}
"""The commands that embed (and `edit --content`, and `delete` of ids: what says the same as a
fact deleted goes with it, found by meaning)."""

_HANDLERS: dict[str, Callable[[Command], Awaitable[int]]] = (
    memory_read.HANDLERS
    | memory_write.HANDLERS
    | admin.HANDLERS
    | learn.HANDLERS
    | forgetting.HANDLERS
)


def run(args: argparse.Namespace, settings: Settings, embedder: TextEmbedder | None = None) -> int:
    """Run a `memories`, `users`, `index`, `jobs` or `learn` command; `embedder` replaces the model
    (tests). Bad input is one line on stderr and exit status 2."""
    console = Console(stderr=True, highlight=False)
    try:
        _check_users(args)
        return asyncio.run(_run(args, settings, embedder, console))
    except (MemproxyError, IdTaken, ValidationError, ValueError, OSError) as exc:
        console.print(Text.assemble(("error:", "red"), " ", describe(exc)), soft_wrap=True)
        return 2


def _check_users(args: argparse.Namespace) -> None:
    """`--user` and `--to` normalised as the API's user ids are (app/proxy/user_ids.py), `--from`
    only trimmed (a user stored before can be moved to a normal id); a bad one is 400 naming
    the option (exit 2)."""
    for name, option in (("user", "--user"), ("to_user", "--to"), ("from_user", "--from")):
        value = getattr(args, name, None)
        if value is None:
            continue
        user = clean_user_id(value, option, as_stored=name == "from_user")
        if user is None:
            raise InvalidRequest(f"{option} must name a user", param=option)
        setattr(args, name, user)


def needs_model(args: argparse.Namespace) -> bool:
    """Whether the command embeds: only then is the model loaded."""
    return (
        args.handler in NEEDS_MODEL
        or (args.handler == "edit" and args.content is not None)
        or (args.handler == "delete" and not args.all)
    )


async def _run(
    args: argparse.Namespace, settings: Settings, embedder: TextEmbedder | None, console: Console
) -> int:
    engine = engine_for(settings)
    model: TextEmbedder = _NoModel()
    try:
        await upgrade(engine)
        if embedder is not None:
            model = embedder
        elif needs_model(args):
            model = await asyncio.to_thread(load_embedder, settings)
        memory = MemoryService(MemoryStore(engine), model, dense_weight=settings.dense_weight)
        return await _HANDLERS[args.handler](Command(memory, settings, args, console))
    finally:
        await engine.dispose()
        if embedder is None:
            model.close()


class _NoModel:
    """The embedder of commands that only read: they never embed, so the model is not loaded
    (which may mean exporting it, in a folder with no export yet)."""

    model_name = "-"
    dim = 0

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        raise AssertionError("this command does not embed")

    async def embed_query(self, text: str) -> np.ndarray:
        raise AssertionError("this command does not embed")

    def close(self) -> None:
        pass
