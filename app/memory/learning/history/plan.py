"""A past conversation cut into Manager jobs, each dated when its words were said.

Promises:

- a user turn's fingerprint is a chat's (:func:`~app.memory.learning.turns.fingerprint`: it and
  the turn before it), so a turn memproxy already learned from in a chat, or from an earlier
  export, is not learned from again, and an export sent again queues nothing new;
- each job holds new turns of one day (UTC) only, at most :data:`JOB_TURNS` of them (a user turn
  always with the answers after it), starting at a user turn, and the turns before them as
  context (:data:`~app.memory.learning.extraction.CONTEXT_TURNS`, already learned); a long turn
  is cut as a chat's is (:func:`~app.memory.learning.extraction.for_manager`);
- a job's date (``said_at``: the Manager's "today", and its memories' ``observed_at``) is the
  time of its last user turn: by then all it learns from had been said, on that day.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from pydantic_ai.messages import ModelMessage

from app.memory.learning.extraction import CONTEXT_TURNS, MAX_JOB_TURNS, for_manager, is_explicit
from app.memory.learning.history.export import Conversation, Said
from app.memory.learning.turns import fingerprint, turn

JOB_TURNS = 20
"""The most new turns of a past conversation one job gives the Manager: about ten exchanges, what
a chat's routine jobs hold when they merge within the processing interval. A hundred turns
(:data:`~app.memory.learning.extraction.MAX_JOB_TURNS`, the worker's bound) in one call is more
than a small model reads well: it answers with the facts of a few."""


@dataclass(frozen=True, slots=True)
class Piece:
    """One job's worth of a conversation."""

    context: list[ModelMessage]
    new: list[ModelMessage]
    fingerprints: list[str]
    said_at: datetime
    explicit: bool
    """A user turn in it asks to remember or forget (shown on the jobs' list)."""


def fingerprints(conversation: Conversation) -> list[str | None]:
    """Each turn's fingerprint; None for the assistant's."""
    said = conversation.said
    return [
        fingerprint(said[i - 1].text if i else "", s.text) if s.role == "user" else None
        for i, s in enumerate(said)
    ]


def plan(conversation: Conversation, marks: list[str | None], taken: set[str]) -> list[Piece]:
    """The jobs for the turns whose fingerprints are in `taken` (each user turn with the answers
    after it), oldest first."""
    said = conversation.said
    runs: list[list[int]] = []
    current: list[int] = []
    keep = False
    for i, s in enumerate(said):
        if s.role == "user":
            keep = marks[i] in taken
        if not keep:
            current = _closed(runs, current)
        elif s.role == "assistant":
            if len(current) < MAX_JOB_TURNS:  # beyond: answers past the worker's bound are left
                current.append(i)
        else:
            if current and (len(current) >= JOB_TURNS or s.at.date() != said[current[0]].at.date()):
                current = _closed(runs, current)
            current.append(i)
    _closed(runs, current)
    return [_piece(said, marks, run) for run in runs]


def _closed(runs: list[list[int]], current: list[int]) -> list[int]:
    if current:
        runs.append(current)
    return []


def _piece(said: tuple[Said, ...], marks: list[str | None], run: list[int]) -> Piece:
    first = run[0]
    users = [said[i] for i in run if said[i].role == "user"]
    return Piece(
        context=[_turn(s) for s in said[max(0, first - CONTEXT_TURNS) : first]],
        new=[_turn(said[i]) for i in run],
        fingerprints=sorted({m for i in run if (m := marks[i]) is not None}),
        said_at=users[-1].at,
        explicit=any(is_explicit(s.text) for s in users),
    )


def _turn(said: Said) -> ModelMessage:
    return turn(said.role, for_manager(said.text), said.at)
