"""Index images in the database (:class:`~app.memory.store.tables.IndexImage`): the one writer of
that table, a part of the memory store (:class:`~app.memory.store.memories.MemoryStore`).

Promises:

- an image is written whole or not at all (its parts in one transaction, replacing the user's
  older image), and only when newer than the one stored: replicas that each keep a user's index
  current may all offer theirs, the newest stays;
- :meth:`IndexImages.image` reads back a whole image or nothing (parts of different writes, or
  missing parts, read as no image);
- erasing or moving a user erases their image, in that unit of work, and leaves a tombstone at
  the unit's version (:func:`erase_images`): an image holds the words of the user's memories,
  and one being made while they were erased (of an older version) is refused, never stored.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from sqlalchemy import bindparam, delete, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.memory.store.db import writing
from app.memory.store.records import now
from app.memory.store.tables import IndexImage

PART_BYTES = 16 * 1024 * 1024
"""The most one row holds: a large image is read and written in parts (PostgreSQL's bytea and
the drivers handle a few MB at a time far better than hundreds)."""


_STORED_VERSION = select(IndexImage.version).where(
    IndexImage.user_id == bindparam("user_id"), IndexImage.part == 0
)
"""The version of a user's stored image (or tombstone): its first part's."""


def kept_over(stored: int | None, version: int, *, replace_same: bool = False) -> bool:
    """Whether the stored image (or tombstone) at `stored` stays rather than one at `version`
    (with `replace_same`, one as old is replaced: the same memories, searched otherwise)."""
    return stored is not None and (stored > version or (stored == version and not replace_same))


class StoredImage(NamedTuple):
    version: int
    parts: list[bytes]
    """The image's bytes, in parts (joined by whoever reads it, off the event loop)."""


class IndexImages:
    sessions: async_sessionmaker[AsyncSession]

    async def image(self, user_id: str) -> StoredImage | None:
        """The user's image, whole, or None."""
        async with self.sessions() as session:
            rows = (
                await session.execute(
                    select(IndexImage.part, IndexImage.parts, IndexImage.version, IndexImage.data)
                    .where(IndexImage.user_id == user_id)
                    .order_by(IndexImage.part)
                )
            ).all()
        if not rows or not rows[0].parts:  # none, or a tombstone
            return None
        parts, version = rows[0].parts, rows[0].version
        whole = [r.part for r in rows] == list(range(parts))
        if not whole or any(r.version != version or r.parts != parts for r in rows):
            return None
        return StoredImage(int(version), [r.data for r in rows])

    async def image_version(self, user_id: str) -> int | None:
        """The version of the user's stored image (None: none)."""
        async with self.sessions() as session:
            found = await session.scalar(_STORED_VERSION, {"user_id": user_id})
        return None if found is None else int(found)

    async def keep_image(
        self, user_id: str, version: int, data: bytes, *, replace_same: bool = False
    ) -> bool:
        """Store the image of the user's index at `version` in place of an older one (or, with
        `replace_same`, of one as old: the same memories, searched otherwise); False when the
        stored one (or the user's erasure) is newer, or as new."""
        chunks = [data[i : i + PART_BYTES] for i in range(0, len(data), PART_BYTES)] or [b""]
        for _ in range(2):  # two replicas inserting at once: one loses the race, then looks again
            try:
                async with writing(self.sessions) as session:
                    stored = await session.scalar(_STORED_VERSION, {"user_id": user_id})
                    if kept_over(stored, version, replace_same=replace_same):
                        return False
                    await _delete(session, user_id)
                    stamp = now()
                    for part, chunk in enumerate(chunks):
                        session.add(
                            IndexImage(
                                user_id=user_id, part=part, parts=len(chunks), version=version,
                                data=chunk, written_at=stamp,
                            )
                        )  # fmt: skip
                return True
            except IntegrityError:
                continue
        return False

    async def drop_image(self, user_id: str) -> None:
        """Erase the user's image (one that cannot be used: it would keep a new one out)."""
        async with writing(self.sessions) as session:
            await session.execute(
                delete(IndexImage).where(IndexImage.user_id == user_id, IndexImage.parts > 0)
            )


async def erase_images(session: AsyncSession, versions: Mapping[str, int]) -> None:
    """Erase these users' images and leave each a tombstone at its version (user -> the unit's
    version), in the caller's transaction: no older image can be stored after it."""
    for user_id, version in versions.items():
        await _delete(session, user_id)
        session.add(
            IndexImage(user_id=user_id, part=0, parts=0, version=version, data=b"",
                       written_at=now())
        )  # fmt: skip


async def _delete(session: AsyncSession, user_id: str) -> None:
    await session.execute(delete(IndexImage).where(IndexImage.user_id == user_id))
