"""Whose an id or a text is, looked up inside a write (:meth:`MemoryStore.add`), so that what is
checked is what the write commits on.

- Ids are global (one table, one unique column), so an imported id may already be another
  user's. It is refused (:class:`IdTaken`: the operator's CLI says so), or, for the memory API,
  given an id of the importing user's own that is derived from it (:func:`own_ids`): the same
  on every import, so a re-import skips it as it skips any id it has, and the import's answer
  is the one an unknown id gets. Only that answer is alike: reading the id afterwards finds no
  memory of the caller's (404), where an unknown id imported is there.
- The same statement again (:func:`same_text`: its words, case and spacing aside; for words
  that are not ASCII, in their usual cases: :func:`probe`) is found among the user's
  memories; the caller holds the user's write lock (:meth:`~app.memory.store.unit.Writer.lock`)
  from before the look until the commit, so two concurrent writes of one text, in any process,
  create one memory.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import replace

from sqlalchemy import ColumnElement, func, or_, select

from app.memory.store.records import NewMemory
from app.memory.store.tables import Memory
from app.memory.store.unit import Writer

OWN_IDS = uuid.UUID("6d656d70-726f-5879-8000-696d706f7274")
"""The namespace of :func:`own_id`'s UUIDs (fixed: the same line maps to the same id forever)."""
PAGE = 500


class IdTaken(Exception):
    """An imported memory's id already belongs to another user."""


def own_id(user_id: str, memory_id: str) -> str:
    """The id `user_id` gets for an imported `memory_id` that another user holds."""
    return str(uuid.uuid5(OWN_IDS, f"{user_id}\n{memory_id}"))


async def owners(w: Writer, ids: Iterable[str]) -> dict[str, str]:
    """Who holds each of these ids (any user's), by id; ids nobody holds are left out."""
    wanted = list(dict.fromkeys(ids))
    if not wanted:
        return {}
    found = await w.execute(select(Memory.id, Memory.user_id).where(Memory.id.in_(wanted)))
    return {row.id: row.user_id for row in found}


async def own_ids(w: Writer, items: Sequence[NewMemory]) -> list[NewMemory]:
    """`items`, each id another user holds replaced by :func:`own_id` (by no id, a new UUID,
    in the unlikely case that this one is someone else's too)."""
    held = await owners(w, (item.id for item in items if item.id))
    renamed = {i: own_id(w.user_id, i) for i, owner in held.items() if owner != w.user_id}
    if not renamed:
        return list(items)
    held = await owners(w, renamed.values())
    for memory_id, derived in renamed.items():
        if held.get(derived, w.user_id) != w.user_id:
            renamed[memory_id] = ""
    return [
        # A renewed id is a copy: it keeps neither the source nor the recalls of the original.
        replace(item, id=renamed[item.id] or None, kept_source=None, recall_count=0,
                last_recalled_at=None) if item.id in renamed else item
        for item in items
    ]  # fmt: skip


async def found(w: Writer, ids: Sequence[str], *, expected: bool = False) -> dict[str, Memory]:
    """The memories with these ids, by id; :class:`IdTaken` when one is another user's (or,
    `expected`: is not there, because another user's write took the id and it is gone again)."""
    if not ids:
        return {}
    rows = {r.id: r for r in (await w.execute(select(Memory).where(Memory.id.in_(ids)))).scalars()}
    for memory_id in ids:
        row = rows.get(memory_id)
        if (row is not None and row.user_id != w.user_id) or (row is None and expected):
            raise IdTaken(memory_id)
    return rows


def words(text: str) -> str:
    """What two statements must share to be the same: their words, case and spacing aside."""
    return " ".join(text.split()).casefold()


async def same_text(w: Writer, text: str, pending: Iterable[Memory] = ()) -> Memory | None:
    """The user's memory (or one of `pending`, written in this unit) with the words of `text`.
    The database finds the candidates (:func:`probe`), a page at a time; the words are compared
    here."""
    wanted = words(text)
    for row in pending:
        if words(row.content) == wanted:
            return row
    query = (
        select(Memory.key, Memory.id, Memory.content)
        .where(Memory.user_id == w.user_id, probe(text))
        .order_by(Memory.key)
        .limit(PAGE)
    )
    after = 0
    while True:
        page = list(await w.execute(query.where(Memory.key > after)))
        for match in page:
            if words(match.content) == wanted:
                return (await w.rows([match.id]))[match.id]
        if len(page) < PAGE:
            return None
        after = page[-1].key


def probe(text: str) -> ColumnElement[bool]:
    """What a memory with the words of `text` contains, as the database can tell: its longest
    ASCII word in any case, or else its longest word as written, in lower or upper case or
    capitalised. Never lowered in the database when not ASCII: SQLite's lower() lowercases
    ASCII letters only (``lower('Люблю')`` is ``'Люблю'``), and PostgreSQL's only what the
    database's locale knows; a text sent twice, in any case, must find itself. (Other mixes of
    case in a word that is not ASCII are not found: such a text makes a memory of its own.)"""
    parts = text.split() or [text]
    plain = [part for part in parts if part.isascii() and any(c.isalnum() for c in part)]
    if plain:
        word = max(plain, key=len).lower()
        return func.lower(Memory.content).contains(word, autoescape=True)
    word = max(parts, key=len)
    forms = dict.fromkeys((word, word.lower(), word.upper(), word.capitalize()))
    return or_(*(Memory.content.contains(form, autoescape=True) for form in forms))
