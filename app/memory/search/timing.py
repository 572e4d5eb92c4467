"""Where one recall's time went, phase by phase, for the chat's ``Server-Timing`` header: what an
operator (or ``bench/overhead.py``) reads to see which part of recall a slow chat waited on.

The phases of :meth:`app.memory.search.ranking.Searcher.recall`, in order, each the wall time
since the one before: ``index`` (the version check, and a catch-up or build when another
process wrote), ``lexical`` (the index's lock, the profile, BM25), ``embedding`` (what was left
to wait for the query's vector, begun with the version check), ``dense`` (the vector scan; for
an index of over :data:`~app.memory.search.ranking.OFFLOAD_ABOVE` vectors, the scan in a thread
and BM25 beside it, after ``embedding``, and ``lexical`` only the lock and the profile),
``rank`` (fusion, feedback, time words), ``judge`` (the relevance judge, when on), ``choice``
(the budgets, and the lock again after a judge). A recall with no question, or over no memory,
names ``index`` alone."""

from __future__ import annotations

import time


class Laps:
    """Wall-clock laps, in milliseconds, by phase name (a phase run twice adds up)."""

    def __init__(self) -> None:
        self.ms: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, phase: str) -> None:
        """The time since the last lap (or since this was made) goes to `phase`."""
        now = time.perf_counter()
        self.ms[phase] = self.ms.get(phase, 0.0) + (now - self._last) * 1000
        self._last = now


def server_timing(total_ms: float, phases: dict[str, float]) -> str:
    """The ``Server-Timing`` value: recall's total, then each phase as ``recall-<phase>``."""
    parts = [f"recall;dur={total_ms:.2f}"]
    parts += [f"recall-{name};dur={ms:.2f}" for name, ms in phases.items()]
    return ", ".join(parts)
