"""What an import's lines say of provenance (issue 25): each line's ``linked`` ids, made into the
links the store puts back, and the index key each imported episode gets from the facts linked
to it, the key the learning path gives an episode (:func:`~app.memory.search.parts.index_key`),
so that the episode is found, and embedded, as it was before its export or deletion."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from app.memory.search.parts import index_key
from app.memory.store.memories import MemoryStore
from app.memory.store.records import NewMemory
from app.memory.store.tables import MemoryType


async def provenance(
    store: MemoryStore, user_id: str, items: Sequence[NewMemory]
) -> tuple[list[NewMemory], list[tuple[str, str]]]:
    """An import's links (each item's ``linked``) as pairs of ids for the store to put back
    (:func:`app.memory.store.links.restore`), and its items, each episode with the index key
    the facts linked to it give it, as the learning path keys an episode (:func:`index_key`):
    the facts of the import, and the user's stored ones."""
    named: dict[str, NewMemory] = {}
    for item in items:  # a line named twice: the last, as the store maps the id to its copy
        named[item.id or item.copy_of or ""] = item
    named.pop("", None)
    pairs = {
        frozenset((ref, other)): (ref, other)
        for item in items
        if (ref := item.id or item.copy_of) and named.get(ref) is item
        for other in item.linked
        # a copy links to copies only: the id it names may be the user's original
        if other != ref and (other in named or item.copy_of is None)
    }
    if not pairs:
        return list(items), []
    unknown = {i for pair in pairs.values() for i in pair if i not in named}
    stored = await store.kinds(user_id, list(unknown))
    kinds = stored | {ref: (item.type.value, item.content) for ref, item in named.items()}
    facts: dict[str, list[str]] = {}
    for a, b in pairs.values():
        if a not in kinds or b not in kinds:
            continue  # dropped: not the user's (the store drops them too)
        if kinds[b][0] == MemoryType.EPISODE.value:
            a, b = b, a
        if kinds[a][0] == MemoryType.EPISODE.value and kinds[b][0] != MemoryType.EPISODE.value:
            facts.setdefault(a, []).append(kinds[b][1])
    keyed = [
        replace(item, index_text=index_key(item.content, facts[ref]))
        if (ref := item.id or item.copy_of) in facts and named.get(ref or "") is item
        else item
        for item in items
    ]
    return keyed, list(pairs.values())
