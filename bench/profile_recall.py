"""Where a recalled chat's CPU goes: py-spy samples memproxy while it serves chats with recall.

Starts the upstream and memproxy as `bench/overhead.py` does (one worker each, a database
holding `--memories` memories of the benchmark's user, the relevance threshold at 0 so that every
chat recalls and injects: the worst case), warms up, then samples the memproxy process with
py-spy (every thread, `--rate` per second) while `--requests` sequential streaming chats, each
asking something new, go through it. Each sample is put in the first bucket whose function is
on its stack (:data:`BUCKETS`, from the request's way in to the leaf); a thread waiting for work
(the event loop in its poll, the SQLite thread and the embedder's pool on their queues) is idle
and not counted; the event loop's samples no bucket takes are its rest (the HTTP server, the
middleware, the relay upstream, SQLAlchemy's async glue). Prints, per bucket, its CPU per chat
and its share.

Run: .venv/bin/python bench/profile_recall.py [--memories 10000] [--requests 2000]
     [--rate 1000] [--upstream fastapi] [--keep FILE (the raw samples)]
"""

from __future__ import annotations

import argparse
import asyncio
import linecache
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.overhead import (  # noqa: E402
    UPSTREAMS,
    Connection,
    free_port,
    recall_env,
    seed,
    server,
)

BUCKETS: list[tuple[str, tuple[str, ...]]] = [
    ("query embedding (ONNX, the embedder's thread)", ("Embedder.encode",)),
    ("database (the SQLite thread: version check, marks)", ("_connection_worker_thread",)),
    ("recall marks (the event loop)", ("RecallMarks.",)),
    ("index check (the version query, on the loop)", ("IndexCache.get",)),
    ("BM25 (query terms, scores, feedback terms)",
     ("LexicalIndex.", "Scores.", "Analyzer.query_terms")),
    ("dense (FAISS search, cosines of BM25's candidates)",
     ("VectorIndex.", "Cosines.", "_Cosines.")),
    ("fusion and ranking (the rest of _rank)", ("Searcher._rank", "Ranked.")),
    ("choice within the budgets (selection)", ("Searcher._choose", "choose")),
    ("the rest of recall (profile, time words)", ("Searcher._find", "ChatMemory._recall")),
    ("memory glue (block injection, turns)", ("ChatMemory.", "JobWriter.", "inject")),
    ("the loop's rest (HTTP, middleware, relay, SQLAlchemy)", ("thread (",)),
]  # fmt: skip
"""(bucket, function name prefixes): the first bucket with a frame on the stack takes it."""
OTHER = "other threads"
_FRAME = re.compile(r"^(?P<name>.*) \((?P<file>.*?):(?P<line>\d+)\)$")
_WAITS = {
    ("Runner.run", "asyncio/runners.py"): "run_until_complete",
    ("_connection_worker_thread", "aiosqlite/core.py"): ".get(",
    ("_worker", "concurrent/futures/thread.py"): ".get(",
    ("Condition.wait", "threading.py"): "wait(",
    ("Event.wait", "threading.py"): "wait(",
    ("BaseSelector.select", "selectors.py"): "select(",
    ("EpollSelector.select", "selectors.py"): "poll(",
}
"""Where a thread waits for work (idle), by its leaf frame's function and file, with what its
source line says while waiting there (py-spy counts these waits as busy: they are in C)."""


def bucket_of(frames: list[str]) -> str | None:
    """The sample's bucket, or None when its thread is idle."""
    leaf = _FRAME.match(frames[-1])
    if leaf is not None:
        for (name, file), waiting in _WAITS.items():
            if (leaf["name"] == name and leaf["file"].endswith(file)
                    and waiting in linecache.getline(leaf["file"], int(leaf["line"]))):  # fmt: skip
                return None
    names = [m["name"] if (m := _FRAME.match(f)) else f for f in frames[1:]]
    for bucket, prefixes in BUCKETS[:-1]:
        if any(n.startswith(prefixes) for n in names):
            return bucket
    # py-spy's first frame names the thread: the event loop's is the main thread
    return BUCKETS[-1][0] if frames[0].endswith("MainThread") else OTHER


def summarise(raw: str, requests: int, rate: int) -> None:
    counts: Counter[str] = Counter()
    for line in raw.splitlines():
        stack, _, n = line.rpartition(" ")
        if stack:
            bucket = bucket_of(stack.split(";"))
            if bucket is not None:
                counts[bucket] += int(n)
    total = sum(counts.values())
    per = 1000 / rate / requests  # ms of CPU per chat, per sample
    print(f"CPU per recalled chat, by where it goes ({requests} chats, {total} samples at "
          f"{rate}/s; idle threads not counted)")  # fmt: skip
    print(f"  {'':58} {'ms/chat':>8} {'share':>6}")
    for bucket, _ in [*BUCKETS, (OTHER, ())]:
        if counts[bucket]:
            print(f"  {bucket:58} {counts[bucket] * per:8.2f} {counts[bucket] / total:6.1%}")
    print(f"  {'total':58} {total * per:8.2f}")


async def chats(port: int, requests: int) -> float:
    conn = Connection(port, "/v1/chat/completions", vary=True)
    for _ in range(50):  # warm-up: the index built, the caches filled
        await conn.send()
    began = time.perf_counter()
    for _ in range(requests):
        await conn.send()
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--memories", type=int, default=10_000)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--upstream", choices=sorted(UPSTREAMS), default="fastapi")
    parser.add_argument("--keep", type=Path, help="keep py-spy's raw samples in this file")
    args = parser.parse_args()
    spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    if spy is None:
        sys.exit("py-spy is not installed: make install-dev")
    up_port, proxy_port = free_port(), free_port()
    python = sys.executable
    upstream = [python, "-m", "uvicorn", "--factory", UPSTREAMS[args.upstream], "--port",
                str(up_port), "--no-access-log", "--log-level", "warning"]  # fmt: skip
    with tempfile.TemporaryDirectory() as folder:
        database = f"sqlite+aiosqlite:///{folder}/memproxy.db"
        asyncio.run(seed(database, args.memories))
        env = recall_env(up_port, database)
        samples = Path(folder) / "samples.txt"
        with (
            server(upstream, up_port, {}),
            server(
                [python, "-m", "app.cli", "serve", "--port", str(proxy_port)], proxy_port, env
            ) as pid,  # fmt: skip
        ):
            asyncio.run(chats(proxy_port, 50))  # the index built before sampling begins
            sampler = subprocess.Popen(
                [spy, "record", "--pid", str(pid), "--rate", str(args.rate), "--format", "raw",
                 "--output", str(samples), "--nonblocking", "--threads"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            time.sleep(1.0)  # attached
            seconds = asyncio.run(chats(proxy_port, args.requests))
            sampler.send_signal(signal.SIGINT)
            sampler.wait(30)
        raw = samples.read_text()
        if args.keep:
            args.keep.write_text(raw)
    print(f"{args.requests} chats with recall over {args.memories:,} memories in {seconds:.1f} s "
          f"({seconds / args.requests * 1000:.2f} ms each, end to end)")  # fmt: skip
    summarise(raw, args.requests + 50, args.rate)


if __name__ == "__main__":
    main()
