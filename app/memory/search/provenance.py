"""What an import's lines say of provenance (issue 25): each line's ``linked`` ids, made into the
links the store puts back, and the index key each episode gets from the facts linked to it, the
key the learning path gives an episode (:func:`~app.memory.search.parts.index_key`), so that the
episode is found, and embedded, as it was before its export or deletion.

An episode the user holds already (one an earlier batch of the CLI wrote, or a line whose id is
there) gets the key of all its facts, those linked before and the import's: the store gives it
that key in the import's unit of work (:meth:`app.memory.store.memories.MemoryStore.add`,
`rekeyed`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from app.memory.search.parts import index_key
from app.memory.store.memories import MemoryStore
from app.memory.store.records import NewMemory
from app.memory.store.tables import MemoryType

EPISODE = MemoryType.EPISODE.value


@dataclass(frozen=True, slots=True)
class Provenance:
    items: list[NewMemory]
    """The import's items, each new episode with the index key its facts give it."""
    links: list[tuple[str, str]]
    """Pairs of ids for the store to link (:func:`app.memory.store.links.restore`)."""
    rekeyed: dict[str, str]
    """The new index keys of episodes the user holds already, by id."""


async def provenance(store: MemoryStore, user_id: str, items: Sequence[NewMemory]) -> Provenance:
    """An import's links (each item's ``linked``), its items with their episodes' index keys,
    and the keys of the user's stored episodes the import links facts to (module docstring):
    the facts of the import, and the user's stored ones."""
    named: dict[str, NewMemory] = {}
    for item in items:  # a line named twice: the last, as the store maps the id to its copy
        named[item.id or ""] = item
    named.pop("", None)
    pairs = {
        frozenset((ref, other)): (ref, other)
        for item in items
        if (ref := item.id) and named.get(ref) is item
        for other in item.linked
        if other != ref
    }
    if not pairs:
        return Provenance(list(items), [], {})
    ends = {i for pair in pairs.values() for i in pair}
    found = await store.kinds(user_id, list(ends))  # named ones too: a line whose id is there
    stored = {i: (kind, content) for i, (kind, content, _) in found.items()}
    kinds = {ref: (item.type.value, item.content) for ref, item in named.items()} | stored
    facts: dict[str, dict[str, str]] = {}  # episode -> its facts' contents, by id
    for a, b in pairs.values():
        if a not in kinds or b not in kinds:
            continue  # dropped: not the user's (the store drops them too)
        if kinds[b][0] == EPISODE:
            a, b = b, a
        if kinds[a][0] == EPISODE and kinds[b][0] != EPISODE:
            facts.setdefault(a, {})[b] = kinds[b][1]
    keyed = [
        replace(item, index_text=index_key(item.content, list(facts[ref].values())))
        if (ref := item.id) in facts and named.get(ref or "") is item and ref not in stored
        else item
        for item in items
    ]
    return Provenance(keyed, list(pairs.values()), await _rekeyed(store, user_id, stored, facts))


async def _rekeyed(
    store: MemoryStore,
    user_id: str,
    stored: dict[str, tuple[str, str]],
    facts: dict[str, dict[str, str]],
) -> dict[str, str]:
    """The index key of each stored episode the import links facts to: its words, the facts
    linked to it before (oldest first), then the import's."""
    episodes = [ref for ref in facts if ref in stored and stored[ref][0] == EPISODE]
    earlier = await linked_facts(store, user_id, episodes)
    return {
        episode: index_key(stored[episode][1], list((earlier[episode] | facts[episode]).values()))
        for episode in episodes
    }


async def linked_facts(
    store: MemoryStore, user_id: str, episode_ids: Sequence[str]
) -> dict[str, dict[str, str]]:
    """For each of these episodes of the user, the facts linked to it: id -> content, oldest
    link first (what its index key holds after its words)."""
    if not episode_ids:
        return {}
    before = await store.linked(user_id, episode_ids)
    known = await store.kinds(user_id, [f for e in episode_ids for f in before.get(e, ())])
    return {
        episode: {f: known[f][1] for f in before.get(episode, ()) if f in known}
        for episode in episode_ids
    }
