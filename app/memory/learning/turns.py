"""A conversation's turns as the Manager sees them, and their fingerprints.

A leaf of the learning package. A turn's fingerprint is its identity across the client's resends
of the whole conversation: a hash of it and the turn before it, whitespace-normalised (never the
text itself), recorded when a job takes the turn.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from app.proxy.offload import text_pieces


@dataclass(frozen=True, slots=True)
class Turn:
    role: Literal["user", "assistant"]
    text: str


def fingerprint(previous: str, text: str) -> str:
    """A turn's identity: it and the turn before it, whitespace-normalised, hashed."""
    digest = hashlib.sha256()
    _add_words(digest, previous)
    digest.update(b"\x00")
    _add_words(digest, text)
    return digest.hexdigest()


def _add_words(digest: Any, text: str) -> None:
    """Hash ``" ".join(text.split())`` a piece at a time (:func:`text_pieces`): splitting 50 MB
    at once held the GIL for a second."""
    first = True
    for piece in text_pieces(text):
        words = piece.split()
        if words:
            digest.update((" ".join(words) if first else " " + " ".join(words)).encode())
            first = False


def fingerprints_of(turns: Sequence[Turn]) -> list[tuple[int, str]]:
    """(index, fingerprint) of each user turn."""
    return [
        (i, fingerprint(turns[i - 1].text if i else "", turn.text))
        for i, turn in enumerate(turns)
        if turn.role == "user"
    ]
