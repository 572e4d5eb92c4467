"""Index images in the database (:class:`~app.memory.store.tables.IndexImage`): the one writer of
that table, a part of the memory store (:class:`~app.memory.store.memories.MemoryStore`).

Promises:

- an image is written whole or not at all (its parts in one transaction, replacing the user's
  older image), and only when newer than the one stored: replicas that each keep a user's index
  current may all offer theirs, the newest stays;
- :meth:`IndexImages.image` reads back a whole image or nothing (parts of different writes, or
  missing parts, read as no image);
- erasing or moving a user erases their image (:func:`drop_images`, in that unit of work): an
  image holds the words of the user's memories.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.memory.store.db import writing
from app.memory.store.records import now
from app.memory.store.tables import IndexImage

PART_BYTES = 16 * 1024 * 1024
"""The most one row holds: a large image is read and written in parts (PostgreSQL's bytea and
the drivers handle a few MB at a time far better than hundreds)."""


class StoredImage(NamedTuple):
    version: int
    data: bytes


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
        if not rows:
            return None
        parts, version = rows[0].parts, rows[0].version
        whole = [r.part for r in rows] == list(range(parts))
        if not whole or any(r.version != version or r.parts != parts for r in rows):
            return None
        return StoredImage(int(version), b"".join(r.data for r in rows))

    async def image_version(self, user_id: str) -> int | None:
        """The version of the user's stored image (None: none)."""
        async with self.sessions() as session:
            found = await session.scalar(
                select(IndexImage.version).where(
                    IndexImage.user_id == user_id, IndexImage.part == 0
                )
            )
        return None if found is None else int(found)

    async def keep_image(self, user_id: str, version: int, data: bytes) -> bool:
        """Store the image of the user's index at `version` in place of an older one; False
        when the stored one is as new (or another process stored one meanwhile)."""
        chunks = [data[i : i + PART_BYTES] for i in range(0, len(data), PART_BYTES)] or [b""]
        try:
            async with writing(self.sessions) as session:
                stored = await session.scalar(
                    select(IndexImage.version).where(
                        IndexImage.user_id == user_id, IndexImage.part == 0
                    )
                )
                if stored is not None and stored >= version:
                    return False
                await drop_images(session, [user_id])
                stamp = now()
                for part, chunk in enumerate(chunks):
                    session.add(
                        IndexImage(
                            user_id=user_id, part=part, parts=len(chunks), version=version,
                            data=chunk, written_at=stamp,
                        )
                    )  # fmt: skip
        except IntegrityError:  # another replica wrote its image between our read and insert
            return False
        return True

    async def drop_image(self, user_id: str) -> None:
        async with writing(self.sessions) as session:
            await drop_images(session, [user_id])


async def drop_images(session: AsyncSession, user_ids: Sequence[str]) -> None:
    """Erase these users' images, in the caller's transaction."""
    await session.execute(delete(IndexImage).where(IndexImage.user_id.in_(list(user_ids))))
