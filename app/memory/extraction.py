"""When an exchange becomes a Manager job, and which of its turns are new.

- Only `chat` requests with memory writes allowed (not `task`, not `tool_continuation`, not
  ``X-Memory: off`` or ``read-only``), and only exchanges the client received in full.
- Clients resend the whole conversation every time. Each user turn has a fingerprint (a hash of
  it and the turn before it; never the text) recorded when a job takes it, so a turn is given to
  the Manager once, however often it is resent; the turns before the new ones go along as
  context only.
- Routine exchanges wait until the conversation has ``MEMPROXY_CONVERSATION_THRESHOLD`` user
  messages (until then nothing is fingerprinted, so the first job takes them all). An explicit
  request to remember or forget (:func:`is_explicit`) always makes a job.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass

from app.memory.manager import Turn

EXPLICIT = re.compile(
    r"\b(?:"
    r"(?:please\s+)?remember\s+(?:that|this|my|me|i\b|i'm|i've)"
    r"|don'?t\s+forget|do\s+not\s+forget|keep\s+in\s+mind|make\s+a\s+note|take\s+note|note\s+that"
    r"|please\s+note|for\s+future\s+reference|from\s+now\s+on"
    r"|forget\s+(?:that|this|about|what|my|everything)"
    r"|(?:that|this|it)(?:'s|\s+is)\s+no\s+longer\s+(?:true|the\s+case|correct)"
    r"|(?:that|this)\s+(?:isn'?t|is\s+not)\s+true\s+any\s*more|not\s+true\s+any\s*more"
    r"|i\s+no\s+longer|i\s+don'?t\s+\w+\s+any\s*more"
    r")",
    re.IGNORECASE,
)
"""Phrases by which a user asks to remember or forget, or corrects what is known of them."""


def is_explicit(text: str) -> bool:
    """True when the text asks to remember or forget something (see :data:`EXPLICIT`)."""
    return EXPLICIT.search(text) is not None


def fingerprint(previous: str, text: str) -> str:
    """A turn's identity: it and the turn before it, whitespace-normalised, hashed."""
    joined = " ".join(previous.split()) + "\x00" + " ".join(text.split())
    return hashlib.sha256(joined.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Exchange:
    """What a job will give the Manager."""

    context: list[Turn]
    new: list[Turn]
    fingerprints: list[str]
    """Of the new user turns: recorded with the job."""
    explicit: bool


def fingerprints_of(turns: Sequence[Turn]) -> list[tuple[int, str]]:
    """(index, fingerprint) of each user turn."""
    return [
        (i, fingerprint(turns[i - 1].text if i else "", turn.text))
        for i, turn in enumerate(turns)
        if turn.role == "user"
    ]


def exchange(turns: Sequence[Turn], processed: set[str], *, threshold: int) -> Exchange | None:
    """The exchange to queue, or None: nothing new, or a routine one below the threshold.

    `processed` holds the fingerprints of this user's turns already taken by a job.
    """
    marks = fingerprints_of(turns)
    fresh = [(i, f) for i, f in marks if f not in processed]
    if not fresh:
        return None
    first = fresh[0][0]
    new = list(turns[first:])
    explicit = any(is_explicit(t.text) for t in new if t.role == "user")
    if not explicit and len(marks) < threshold:
        return None
    return Exchange(list(turns[:first]), new, [f for _, f in fresh], explicit)
