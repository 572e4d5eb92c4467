"""bench/profile_recall.py's sorting of py-spy samples: idle threads left out, each sample in the
first bucket on its stack, the event loop's rest apart from other threads."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.profile_recall import BUCKETS, OTHER, bucket_of, summarise


@pytest.fixture
def source(tmp_path: Path) -> Path:
    """A worker thread's code (as concurrent/futures/thread.py): line 2 waits, line 3 works."""
    path = tmp_path / "concurrent" / "futures" / "thread.py"
    path.parent.mkdir(parents=True)
    path.write_text("def _worker():\n    item = queue.get()\n    return compute(item)\n")
    return path


def test_a_thread_waiting_for_work_is_idle_and_work_goes_to_its_part(source: Path) -> None:
    loop = "thread (1): MainThread"
    assert bucket_of(["thread (2): pool", f"_worker ({source}:2)"]) is None
    assert bucket_of(["thread (2): pool", f"f ({source}:2)"]) == OTHER  # a .get( that works
    recall = [loop, "ChatMemory._recall (glue.py:10)", "Searcher._find (ranking.py:20)",
              "Searcher._rank (ranking.py:30)", "Cosines.of (dense.py:100)",
              f"f ({source}:3)"]  # fmt: skip
    assert bucket_of(recall) == "dense (FAISS search, cosines of BM25's candidates)"
    assert bucket_of([*recall[:4], f"f ({source}:3)"]) == "fusion and ranking (the rest of _rank)"
    assert bucket_of([loop, "Starlette.__call__ (applications.py:96)", f"f ({source}:3)"]) \
        == BUCKETS[-1][0]  # fmt: skip
    assert bucket_of(["thread (2): Thread-3", f"f ({source}:3)"]) == OTHER
    embed = ["thread (3): ThreadPoolExecutor-0_0", "Embedder.encode (embedder.py:126)",
             f"f ({source}:3)"]  # fmt: skip
    assert bucket_of(embed) == "query embedding (ONNX, the embedder's thread)"


def test_the_summary_is_cpu_per_chat(source: Path, capsys: pytest.CaptureFixture[str]) -> None:
    busy = f"thread (3): X;Embedder.encode (embedder.py:126);f ({source}:3)"
    idle = f"thread (4): Y;_worker ({source}:2)"
    summarise(f"{busy} 300\n{idle} 5000\n", requests=100, rate=1000)
    out = capsys.readouterr().out
    assert "query embedding (ONNX, the embedder's thread)" in out and "3.00 100.0%" in out
    assert "300 samples" in out  # the idle thread's 5,000 are not counted
