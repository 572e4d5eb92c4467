"""Recall's phases for the Server-Timing header (app/memory/search/timing.py)."""

from __future__ import annotations

import time

from app.memory.search.timing import Laps, server_timing


def test_laps_split_the_time_between_phases_and_a_phase_run_twice_adds_up() -> None:
    laps = Laps()
    time.sleep(0.01)
    laps.lap("index")
    laps.lap("rank")
    time.sleep(0.005)
    laps.lap("index")
    assert list(laps.ms) == ["index", "rank"]
    assert laps.ms["index"] >= 15 and laps.ms["rank"] < 5


def test_the_header_names_recall_then_each_phase() -> None:
    assert server_timing(4.5, {"index": 2.25, "dense": 0.4}) == (
        "recall;dur=4.50, recall-index;dur=2.25, recall-dense;dur=0.40"
    )
    assert server_timing(0.1, {}) == "recall;dur=0.10"
