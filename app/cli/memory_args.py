"""The arguments of ``memproxy memories|users|jobs|index|learn`` (app/cli/commands.py adds them;
app/cli/memory.py runs them). Every command's parser sets ``handler``: the name app/cli/memory.py
runs it by.

Every command takes ``--database`` and ``--json`` (machine output alone on stdout).
"""

from __future__ import annotations

import argparse
from typing import Any

from app.memory.store.tables import MemoryType

TYPES = [t.value for t in MemoryType]
PROFILE = "a standing fact about the person, shown in every chat"
OBSERVED = "when it was said: ISO 8601 with a time zone, e.g. 2024-05-01T09:30:00+02:00"


def add_parsers(commands: Any, database: argparse.ArgumentParser) -> None:
    """Add `memories`, `users`, `jobs` and `index` to memproxy's subcommands."""
    machine = argparse.ArgumentParser(add_help=False, parents=[database])
    machine.add_argument(
        "--json",
        action="store_true",
        help="machine output on stdout: JSON Lines for lists, one JSON object for a result",
    )
    user = argparse.ArgumentParser(add_help=False, parents=[machine])
    user.add_argument("--user", required=True, help="the user whose memories to act on")
    memories = commands.add_parser(
        "memories",
        help="list, get, stats, history, add, edit, pin, unpin, profile, unprofile, search, "
        "delete, forget, forgotten, restore, move, export, import",
    )
    actions = memories.add_subparsers(dest="action", required=True)
    _reading(actions, user)
    _writing(actions, user, machine)
    _admin(commands, machine)
    _learn(commands, user)


def _command(actions: Any, name: str, parent: argparse.ArgumentParser, about: str) -> Any:
    """A subcommand run by the handler of the same name."""
    parser = actions.add_parser(name, parents=[parent], help=about, description=about)
    parser.set_defaults(handler=name)
    return parser


def _reading(actions: Any, user: argparse.ArgumentParser) -> None:
    listing = _command(actions, "list", user, "the user's memories, newest first")
    listing.add_argument("--type", action="append", choices=TYPES)
    listing.add_argument("--contains")
    shown = listing.add_mutually_exclusive_group()
    shown.add_argument("--profile", action="store_const", const=True, help="only profile facts")
    shown.add_argument(
        "--no-profile", dest="profile", action="store_const", const=False, help="no profile facts"
    )
    listing.add_argument("--limit", type=int, default=100)
    get = _command(actions, "get", user, "one memory, every field and its full content")
    get.add_argument("id")
    _command(actions, "stats", user, "counts by type, pinned, recalls, oldest and newest")
    history = _command(actions, "history", user, "every write to one memory, oldest first")
    history.add_argument("id")
    search = _command(actions, "search", user, "ranked as chat recall ranks")
    search.add_argument("query")
    search.add_argument("--limit", type=int, default=10)
    search.add_argument("--min-score", type=float, help="default MEMPROXY_RELEVANCE_THRESHOLD")
    export = _command(actions, "export", user, "JSON Lines, one memory each (--json: the same)")
    export.add_argument("--output", help="file to write (default: standard output)")


def _writing(actions: Any, user: argparse.ArgumentParser, machine: argparse.ArgumentParser) -> None:
    add = _command(actions, "add", user, "new memories: one, or one per line of a text file")
    given = add.add_mutually_exclusive_group(required=True)
    given.add_argument("content", nargs="?")
    given.add_argument("--file", help="a UTF-8 text file: each non-blank line is one memory")
    add.add_argument("--type", default="fact", choices=TYPES)
    add.add_argument("--pinned", action="store_true")
    add.add_argument("--profile", action="store_true", help=PROFILE)
    add.add_argument("--observed-at", help=OBSERVED + " (default: now)")
    add.add_argument("--metadata", default="{}", help="a JSON object")
    edit = _command(actions, "edit", user, "change a memory (new content is embedded again)")
    edit.add_argument("id")
    edit.add_argument("--content")
    edit.add_argument("--type", choices=TYPES)
    edit.add_argument("--metadata", help="a JSON object (replaces the old one)")
    edit.add_argument("--observed-at", help=OBSERVED)
    pins = [("pin", "pin memories: shown in every chat, never forgotten automatically"),
            ("unpin", "unpin memories"),
            ("profile", "mark memories as profile facts: " + PROFILE),
            ("unprofile", "take the profile mark off memories")]  # fmt: skip
    for name, about in pins:
        _command(actions, name, user, about).add_argument("ids", nargs="+", metavar="id")
    delete = _command(actions, "delete", user, "delete memories (their history stays)")
    delete.add_argument("ids", nargs="*", metavar="id")
    delete.add_argument("--all", action="store_true", help="every memory of the user")
    delete.add_argument("--yes", action="store_true", help="confirm --all")
    forget = _command(
        actions,
        "forget",
        user,
        "forget what is over the user's capacities "
        "(MEMPROXY_MAX_FACTS, MEMPROXY_MAX_EPISODES) now, least used first",
    )
    forget.add_argument("--dry-run", action="store_true", help="only say what would leave, why")
    forgotten = _command(actions, "forgotten", user, "forgotten memories, which can be put back")
    forgotten.add_argument("--limit", type=int, default=100)
    restore = _command(actions, "restore", user, "put a forgotten memory back (same id)")
    restore.add_argument("id")
    move = _command(actions, "move", machine, "give all of a user's memories to another user")
    move.add_argument("--from", dest="from_user", required=True, metavar="USER")
    move.add_argument("--to", dest="to_user", required=True, metavar="USER")
    imports = _command(actions, "import", user, "JSON Lines, as export writes them")
    imports.add_argument("file", nargs="?", help="JSON Lines file (default: standard input)")
    imports.add_argument(
        "--ids",
        choices=["keep", "new"],
        default="keep",
        help="keep: the lines' ids (a second import skips them); new: a new id for every line "
        "(to copy another user's export)",
    )


def _admin(commands: Any, machine: argparse.ArgumentParser) -> None:
    users = commands.add_parser("users", help="the users memproxy knows of")
    listing = _command(
        users.add_subparsers(dest="action", required=True),
        "list",
        machine,
        "users with memories, history or Manager jobs, latest activity first",
    )
    listing.set_defaults(handler="users")
    listing.add_argument("--limit", type=int, default=100)
    listing.add_argument("--offset", type=int, default=0)

    jobs = commands.add_parser("jobs", help="the Manager's job queue", parents=[machine])
    jobs.set_defaults(handler="jobs")
    jobs.add_argument(
        "action",
        choices=["list", "retry"],
        help="list: counts, failures (and with --user, the user's jobs); retry: queue failures "
        "again",
    )
    jobs.add_argument("--user", help="only this user's jobs")
    jobs.add_argument("--job", help="retry: only this job")

    index = commands.add_parser("index", help="search indexes", parents=[machine])
    index.set_defaults(handler="index")
    index.add_argument("action", choices=["rebuild"])
    index.add_argument("--user", help="only this user (default: every user)")


def _learn(commands: Any, user: argparse.ArgumentParser) -> None:
    about = (
        "learn from past conversations: an Open WebUI chat export or ChatGPT's "
        "conversations.json, queued for the Manager of a running memproxy serve"
    )
    learn = commands.add_parser("learn", parents=[user], help=about, description=about)
    learn.set_defaults(handler="learn")
    learn.add_argument("file", help="the export (JSON)")
    learn.add_argument(
        "--format", choices=["auto", "openwebui", "chatgpt"], default="auto",
        help="the export's format (default: told by its first conversation)",
    )  # fmt: skip
    learn.add_argument(
        "--model",
        help="the model the Manager learns with (default MEMPROXY_MANAGER_MODEL, else each "
        "Open WebUI chat's own)",
    )
    learn.add_argument(
        "--no-wait", action="store_true",
        help="return once the jobs are queued, without waiting for the Manager to learn them",
    )  # fmt: skip
