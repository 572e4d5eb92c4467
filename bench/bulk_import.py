"""Bulk writes: long turns imported through `POST /v1/memories/batch`, while chats go on.

Starts the fake upstream and memproxy (one uvicorn worker each, separate processes, loopback,
the Manager off), seeds the chatting user `bench` with `--memories` memories (synthetic, as
bench/overhead.py does), then per server:

1. a chat probe (user `bench`, a question never asked before each time, so its recall embeds a
   query and searches) sends a chat every `--every` seconds for `--idle` seconds: time to first
   byte with nothing else going on;
2. the same probe goes on while this process imports `--turns` long turns (~250 tokens each, the
   size of LongMemEval's: 12-16 English-like sentences of the bundled model's vocabulary) for the
   user `importer`, `--batch` turns a request, one request after another.

Printed: long turns imported a second, the server's CPU seconds per turn, and the probe's time to
first byte p50 / p99 / max idle and during the import.

`--against REV` runs the same with the code of commit REV too (``git archive``, its own copy of
the seeded database), alternating which goes first each round: what the machine's load does to
one it does to the other. `--set NAME=VALUE` gives this checkout's server a setting the other does
not get (`--against HEAD --set ...`: one setting's A/B).

Run: .venv/bin/python bench/bulk_import.py [--turns 500] [--batch 100] [--memories 1000]
     [--rounds 1] [--against REV] [--set NAME=VALUE]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import TypeVar

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._data import Text  # noqa: E402
from bench.overhead import (  # noqa: E402
    Connection,
    checkout,
    cpu_seconds,
    free_port,
    pct,
    recall_env,
    seed,
    server,
)

TURN_TOKENS = 250
T = TypeVar("T")


def long_turns(count: int) -> list[str]:
    """`count` turns of about TURN_TOKENS tokens of the bundled model (a label, then sentences)."""
    from tokenizers import Tokenizer

    from app.memory.search.embedder import bundled_model_path

    tokenizer = Tokenizer.from_file(str(Path(bundled_model_path()) / "tokenizer.json"))
    tokenizer.no_truncation()  # the file truncates at the model's length
    text = Text(seed=7)
    turns = []
    for i in range(count):
        sentences: list[str] = []
        while len(tokenizer.encode(" ".join(sentences)).ids) < TURN_TOKENS:
            sentences.append(text.sentence(10, 24).capitalize() + ".")
        turns.append(f"Turn {i}: " + " ".join(sentences))
    return turns


async def probe(conn: Connection, stop: asyncio.Event, every: float) -> list[float]:
    """A chat every `every` seconds (or as soon as the last one ends) until `stop`: each one's
    seconds to the first body byte."""
    samples = []
    while not stop.is_set():
        start = time.perf_counter()
        samples.append((await conn.send())[0])
        await asyncio.sleep(max(0.0, every - (time.perf_counter() - start)))
    return samples


async def probed(conn: Connection, every: float, work: Awaitable[T]) -> tuple[list[float], T]:
    """The chats' times to first byte (:func:`probe`) while `work` runs, and what it gave."""
    stop = asyncio.Event()
    chats = asyncio.create_task(probe(conn, stop, every))
    try:
        done = await work
    finally:
        stop.set()
    return await chats, done


async def imported(port: int, pid: int, turns: list[str], batch: int) -> tuple[float, float]:
    """The turns imported `batch` a request: (seconds, the server's CPU seconds)."""
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=600) as client:
        cpu, start = cpu_seconds(pid), time.perf_counter()
        for at in range(0, len(turns), batch):
            body = {"memories": [{"content": t} for t in turns[at : at + batch]]}
            reply = await client.post(
                "/v1/memories/batch",
                json=body,
                headers={"Authorization": "Bearer sk-bench", "X-User-Id": "importer"},
            )
            reply.raise_for_status()
        return time.perf_counter() - start, cpu_seconds(pid) - cpu


async def one(port: int, pid: int, turns: list[str], args: argparse.Namespace) -> list[str]:
    """The idle probe, then the import with the probe beside it; the lines to print."""
    conn = Connection(port, "/v1/chat/completions", vary=True)
    for _ in range(20):  # warm-up: connections, the model's first runs, the user's index
        await conn.send()
    quiet, _ = await probed(conn, args.every, asyncio.sleep(args.idle))
    busy, (took, cpu) = await probed(conn, args.every, imported(port, pid, turns, args.batch))

    def ttfb(samples: list[float]) -> str:
        ms = [s * 1000 for s in samples]
        return f"p50 {pct(ms, 0.5):.1f} / p99 {pct(ms, 0.99):.1f} / max {max(ms):.1f} ms"

    return [
        f"{len(turns)} long turns in {took:.1f} s: {len(turns) / took:.1f} turns/s, "
        f"{cpu / len(turns) * 1000:.0f} ms of server CPU a turn",
        f"chat TTFB idle ({len(quiet)} chats): {ttfb(quiet)}",
        f"chat TTFB during the import ({len(busy)} chats): {ttfb(busy)}",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=500)
    parser.add_argument("--batch", type=int, default=100, help="turns a request")
    parser.add_argument("--memories", type=int, default=1000, help="the chatting user's")
    parser.add_argument("--idle", type=float, default=5.0, help="seconds of the idle probe")
    parser.add_argument("--every", type=float, default=0.05, help="seconds between chats")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--against", metavar="REV", help="compare with this commit")
    parser.add_argument(
        "--set", metavar="NAME=VALUE", action="append", default=[],
        help="a setting for this checkout's server only",
    )  # fmt: skip
    args = parser.parse_args()
    if any("=" not in item for item in args.set):
        parser.error("--set takes NAME=VALUE")
    turns = long_turns(args.turns)
    python = sys.executable
    up_port = free_port()
    upstream = [python, "-m", "uvicorn", "--factory", "bench.fastapi_upstream:create_app",
                "--port", str(up_port), "--no-access-log", "--log-level", "warning"]  # fmt: skip
    with tempfile.TemporaryDirectory() as folder, server(upstream, up_port, {}):
        asyncio.run(seed(f"sqlite+aiosqlite:///{folder}/seed.db", args.memories))
        runs = [("this checkout", ROOT, dict(item.split("=", 1) for item in args.set))]
        if args.against:
            base = checkout(args.against, Path(folder) / "base")
            runs.append((args.against, base, {"PYTHONPATH": str(base)}))
        for round_ in range(args.rounds):
            for which, (label, code, extra) in enumerate(runs if round_ % 2 == 0 else runs[::-1]):
                database = Path(folder) / f"{round_}-{which}.db"
                shutil.copy(Path(folder) / "seed.db", database)
                env = {**recall_env(up_port, f"sqlite+aiosqlite:///{database}"), **extra}
                port = free_port()
                command = [python, "-m", "app.cli", "serve", "--port", str(port)]
                with server(command, port, env, cwd=code) as pid:
                    lines = asyncio.run(one(port, pid, turns, args))
                print(f"round {round_ + 1}, {label}:")
                for line in lines:
                    print(f"  {line}")


if __name__ == "__main__":
    main()
