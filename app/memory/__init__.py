"""Long-term memory per user, in four layers, each importing only those below it (checked by
``make lint``):

- :mod:`app.memory.store`: the source of truth (SQLite or PostgreSQL through SQLAlchemy): the
  tables, the engine and migrations, the memory rows and their history, the Manager's queue rows;
- :mod:`app.memory.search`: recall: the embedder, FAISS and BM25 indexes kept per user (a
  rebuildable cache of the store), and the ranking that fuses them;
- :mod:`app.memory.service`: what the API, the CLI and chat share (add, change, search...);
- :mod:`app.memory.learning`: the Manager: which turns it is given, the durable job queue, the
  agent, and the applier of its decisions;
- :mod:`app.memory.chat`: the glue to the proxy's hooks (:mod:`app.proxy.hooks`): recall into a
  chat's system message, a Manager job from its turns.

:mod:`app.memory.block` (the memory block shown to the model) and :mod:`app.memory.foreign`
(other memory systems' blocks) are leaves any layer may use. The names below are what the rest
of the application uses; they are imported on first use, so that loading a table definition
(the migrations do) does not load the embedder or the agent.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from app.memory.chat.glue import ChatMemory
    from app.memory.chat.judge import RecallJudge
    from app.memory.learning.jobs import JobQueue
    from app.memory.learning.manager import Manager, build_http_client
    from app.memory.learning.worker import Worker
    from app.memory.search.dense import configure_threads
    from app.memory.search.embedder import TextEmbedder, load_embedder
    from app.memory.service import MemoryService
    from app.memory.store.db import engine_for, upgrade
    from app.memory.store.memories import MemoryStore

_WHERE = {
    "ChatMemory": "app.memory.chat.glue",
    "RecallJudge": "app.memory.chat.judge",
    "JobQueue": "app.memory.learning.jobs",
    "Manager": "app.memory.learning.manager",
    "build_http_client": "app.memory.learning.manager",
    "Worker": "app.memory.learning.worker",
    "configure_threads": "app.memory.search.dense",
    "TextEmbedder": "app.memory.search.embedder",
    "load_embedder": "app.memory.search.embedder",
    "MemoryService": "app.memory.service",
    "engine_for": "app.memory.store.db",
    "upgrade": "app.memory.store.db",
    "MemoryStore": "app.memory.store.memories",
}
__all__ = [
    "ChatMemory",
    "JobQueue",
    "Manager",
    "MemoryService",
    "MemoryStore",
    "RecallJudge",
    "TextEmbedder",
    "Worker",
    "build_http_client",
    "configure_threads",
    "engine_for",
    "load_embedder",
    "upgrade",
]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_WHERE[name]), name)
