"""A soak of memory over time (issue 27): many chats of many users through a real ``memproxy
serve`` with small capacities, idle jobs forgetting as users go quiet, and one user learning a
LoCoMo conversation in the middle of it all.

The upstream is a loopback server (bench/pipeline_eval.py's): chats get "ok", Manager prompts the
deterministic rules Manager (app/devtools/fake_manager.py). Each generic user's chat is a new
conversation of one sentence about them carrying a unique note (``n123``: "I like kayaking, note
n123."). The users are two halves that take turns, a round of ``--round`` chats each: while one
half chats, the other is quiet for longer than ``MEMPROXY_IDLE_SECONDS``, so idle jobs forget over
the capacities while chats are served. The LoCoMo user (speaker a of ``--conversation``) learns
its sessions spread over the rounds through ``POST /v1/memories/learn`` (dated, as
bench/pipeline_eval.py does), under the same capacities; it never chats (nothing of it is
recalled before its questions, asked at the end).

The same workload runs twice, in one run: a control server (no idle work, no capacity), then the
soak server. Printed:

- every user's facts and episodes at the end against the capacities (and the most any held
  while chatting: capacities hold at idle time, not between two chats);
- pinned and profile memories (3 + 3 per user, written first, the least used of all) still there;
- acknowledged turns lost: a chat answered 200 whose note is in no memory, no forgotten memory
  and no job left (the database, read directly);
- chat latency p50 / p99, soak over control (a ratio: the machine is noisy);
- the LoCoMo user's evidence recall at the end, soak against control.

    .venv/bin/python bench/soak.py                          # 20,000 chats of 20 users
    .venv/bin/python bench/soak.py --chats 4000 --max-facts 30 --max-episodes 60
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import socket
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import uvicorn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.pipeline_eval import (  # noqa: E402
    MODEL,
    Row,
    Upstream,
    ask,
    conversation_of,
    memproxy,
    user_of,
)
from bench.recall_eval import DEFAULT_DATA  # noqa: E402
from tests.memory.learning.exports import dumped, owui_linear  # noqa: E402

LIKES = ["kayaking", "sourdough", "chess", "jazz", "tulips", "hiking", "ramen", "sudoku",
         "pottery", "cycling", "opera", "knitting", "birdwatching", "tango", "curry"]  # fmt: skip
KINDS = ["colour", "film", "city", "book", "season", "tea", "game", "painter"]
THINGS = ["teal", "Alien", "Lisbon", "Dune", "autumn", "oolong", "Go", "Vermeer", "amber",
          "Heat", "Kyoto", "Emma", "spring", "sencha", "bridge", "Turner"]  # fmt: skip


def sentence(rng: random.Random, note: str) -> str:
    """One thing a user says about themselves, with its note."""
    shape = rng.randrange(3)
    if shape == 0:
        return f"I like {rng.choice(LIKES)} on {rng.choice(THINGS)} days, note {note}."
    if shape == 1:
        return f"My favourite {rng.choice(KINDS)} is {rng.choice(THINGS)}, note {note}."
    return f"I am planning a trip to {rng.choice(THINGS)} with my cousin, note {note}."


@dataclass
class Run:
    name: str
    latencies: list[float] = field(default_factory=list)
    answered: dict[str, str] = field(default_factory=dict)
    """Note -> user, for every chat answered 200."""
    failed_chats: int = 0
    peak: dict[str, tuple[int, int]] = field(default_factory=dict)
    """User -> the most facts and episodes seen while chatting."""
    final: dict[str, tuple[int, int]] = field(default_factory=dict)
    kept_lost: int = 0
    """Pinned or profile memories missing at the end."""
    lost: list[str] = field(default_factory=list)
    row: Row = field(default_factory=lambda: Row("locomo"))
    forgotten: int = 0
    seconds: float = 0.0


async def counts(client: httpx.AsyncClient, user: str) -> tuple[int, int]:
    stats = (await client.get("/v1/memories/stats", headers={"X-User-Id": user})).json()
    episodes = int(stats["by_type"].get("episode", 0))
    return int(stats["total"]) - episodes, episodes


async def settled(client: httpx.AsyncClient, users: list[str], quiet: float) -> None:
    """Until no user has a job waiting or running (idle ones included), twice `quiet` apart."""
    calm = 0
    while calm < 2:
        await asyncio.sleep(max(quiet, 0.5))
        busy = 0
        for user in users:
            jobs = (await client.get("/v1/memories/stats",
                                     headers={"X-User-Id": user})).json()["jobs"]  # fmt: skip
            busy += jobs["pending"] + jobs["idle"]
        calm = calm + 1 if busy == 0 else 0


async def chatter(client: httpx.AsyncClient, run: Run, queue: asyncio.Queue[tuple[str, str]],
                  rng: random.Random) -> None:  # fmt: skip
    """Send the queued chats, one at a time, timing each."""
    while not queue.empty():
        user, mark = queue.get_nowait()
        body = {"model": MODEL, "messages": [{"role": "user", "content": sentence(rng, mark)}]}
        began = time.perf_counter()
        response = await client.post("/v1/chat/completions", json=body,
                                     headers={"X-User-Id": user})  # fmt: skip
        run.latencies.append(time.perf_counter() - began)
        if response.status_code == 200:
            run.answered[mark] = user
        else:
            run.failed_chats += 1


async def soak(client: httpx.AsyncClient, run: Run, args: argparse.Namespace,
               locomo: Any, locomo_user: str) -> None:  # fmt: skip
    rng = random.Random(7)
    users = [f"soak-{i:02d}" for i in range(args.users)]
    for user in users:  # kept ones first: the least used of all, so the first to go if any did
        for i in range(3):
            for flags in ({"pinned": True}, {"profile": True}):
                body = {"content": f"{user} keeps {next(iter(flags))} thing {i}", **flags}
                response = await client.post("/v1/memories", json=body,
                                             headers={"X-User-Id": user})  # fmt: skip
                response.raise_for_status()
    sessions = locomo.sessions["a"]
    rounds = max(1, args.chats // args.round)
    per_round = args.chats // rounds
    per_session = -(-len(sessions) // rounds)  # sessions a round, all of them learned
    note = 0
    started = time.perf_counter()
    for r in range(rounds):
        half = users[r % 2 :: 2]
        for s in sessions[r * per_session : (r + 1) * per_session]:  # the LoCoMo user learns
            export = dumped(owui_linear(f"{locomo.sample['sample_id']} session {s.number}",
                                        [(t.role, t.text) for t in s.turns],
                                        start=int(s.when.timestamp()), step=1))  # fmt: skip
            response = await client.post("/v1/memories/learn", content=export,
                                         headers={"X-User-Id": locomo_user})  # fmt: skip
            response.raise_for_status()
        queue: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
        for _ in range(per_round):
            note += 1
            queue.put_nowait((rng.choice(half), f"n{note}"))

        await asyncio.gather(*(chatter(client, run, queue, rng) for _ in range(args.concurrency)))
        for user in users:
            facts, episodes = await counts(client, user)
            old = run.peak.get(user, (0, 0))
            run.peak[user] = (max(old[0], facts), max(old[1], episodes))
        print(f"  {run.name}: round {r + 1}/{rounds}, {note} chats, "
              f"{time.perf_counter() - started:.0f} s", flush=True)  # fmt: skip
    await settled(client, [*users, locomo_user], args.idle_seconds * 2)
    run.seconds = time.perf_counter() - started
    for user in users:
        run.final[user] = await counts(client, user)
        listed = (await client.get("/v1/memories", params={"limit": 100, "q": "keeps"},
                                   headers={"X-User-Id": user})).json()  # fmt: skip
        run.kept_lost += 6 - sum(m["pinned"] or m["profile"] for m in listed["data"])


def lost_turns(database: Path, answered: dict[str, str]) -> list[str]:
    """The notes of answered chats found in no memory, no forgotten memory and no job."""
    with sqlite3.connect(database) as db:
        texts = [row[0] for row in db.execute("SELECT content FROM memories")]
        texts += [row[0] for row in db.execute("SELECT content FROM forgotten_memories")]
        texts += [json.dumps(row[0]) for row in db.execute("SELECT payload FROM manager_jobs")]
    found: set[str] = set()
    for text in texts:
        for word in text.replace(".", " ").replace(",", " ").split():
            if word.startswith("n") and word[1:].isdigit():
                found.add(word)
    return sorted(set(answered) - found, key=lambda n: int(n[1:]))


def forgotten_count(database: Path) -> int:
    with sqlite3.connect(database) as db:
        return int(db.execute("SELECT count(*) FROM forgotten_memories").fetchone()[0])


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000 if ordered else 0.0


async def main_async(args: argparse.Namespace) -> None:
    sample = next(s for s in json.loads(args.data.read_text())
                  if s["sample_id"] == args.conversation)  # fmt: skip
    locomo = conversation_of(sample, ["a"])
    upstream = Upstream()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    up_url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    server = uvicorn.Server(uvicorn.Config(upstream, log_level="warning", access_log=False))
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    folder = Path(args.folder)
    common = {
        "MEMPROXY_UPSTREAM_BASE_URL": up_url, "MEMPROXY_MANAGER_MODEL": MODEL,
        "MEMPROXY_MANAGER_STEPS": "one", "MEMPROXY_CONVERSATION_THRESHOLD": "1",
        "MEMPROXY_PROCESSING_INTERVAL": "0", "MEMPROXY_MANAGER_QUEUE_LIMIT": "100000",
        # the worker looks for quiet users every third of a lease: every second here
        "MEMPROXY_MANAGER_LEASE_SECONDS": "3",
    }  # fmt: skip
    soaked = {
        "MEMPROXY_IDLE_SECONDS": str(args.idle_seconds),
        "MEMPROXY_MAX_FACTS": str(args.max_facts), "MEMPROXY_MAX_EPISODES": str(args.max_episodes),
    }  # fmt: skip
    runs = []
    try:
        for name, env in (("control", {"MEMPROXY_IDLE_SECONDS": "0"}), ("soak", soaked)):
            run, tag = Run(name), uuid.uuid4().hex[:6]
            locomo_user = user_of(sample, "a", tag)
            with memproxy(folder, name, {**common, **env}) as url:
                async with AsyncExitStack() as stack:
                    client = await stack.enter_async_context(httpx.AsyncClient(
                        base_url=url, timeout=600,
                        limits=httpx.Limits(max_connections=args.concurrency + 4)))  # fmt: skip
                    await soak(client, run, args, locomo, locomo_user)
                    upstream.blocks.clear()
                    await ask(client, upstream, [locomo], tag, run.row, ["a"], names=True)
            run.lost = lost_turns(folder / f"{name}.db", run.answered)
            run.forgotten = forgotten_count(folder / f"{name}.db")
            runs.append(run)
    finally:
        server.should_exit = True
        await serving
    control, soaked_run = runs
    print(f"\nlogs and databases: {folder}\n")
    print(
        "| run | chats answered (failed) | s | p50 ms | p99 ms | turns lost | pinned/profile "
        "lost | forgotten | facts at end (max) | episodes at end (max) | most held while "
        "chatting (facts / episodes) | LoCoMo evidence recall |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for run in runs:
        facts = [f for f, _ in run.final.values()]
        episodes = [e for _, e in run.final.values()]
        peak_f = max((f for f, _ in run.peak.values()), default=0)
        peak_e = max((e for _, e in run.peak.values()), default=0)
        print(f"| {run.name} | {len(run.answered)} ({run.failed_chats}) | {run.seconds:.0f} | "
              f"{pct(run.latencies, 0.5):.1f} | {pct(run.latencies, 0.99):.1f} | "
              f"{len(run.lost)} | {run.kept_lost} | {run.forgotten} | "
              f"{statistics.fmean(facts):.0f} ({max(facts)}) | "
              f"{statistics.fmean(episodes):.0f} ({max(episodes)}) | {peak_f} / {peak_e} | "
              f"{statistics.fmean(run.row.recall):.3f} ({len(run.row.recall)} q) |")  # fmt: skip
    print(
        f"\ncapacities: {args.max_facts} facts, {args.max_episodes} episodes (6 of the facts "
        f"pinned or profile); latency soak/control: p50 "
        f"{pct(soaked_run.latencies, 0.5) / pct(control.latencies, 0.5):.2f}, p99 "
        f"{pct(soaked_run.latencies, 0.99) / pct(control.latencies, 0.99):.2f}; LoCoMo "
        f"recall soak - control: "
        f"{statistics.fmean(soaked_run.row.recall) - statistics.fmean(control.row.recall):+.3f}"
    )
    if soaked_run.lost:
        print(f"lost notes (first 20): {soaked_run.lost[:20]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--conversation", default="conv-26", help="the LoCoMo user's")
    parser.add_argument("--chats", type=int, default=20_000)
    parser.add_argument("--users", type=int, default=20)
    parser.add_argument("--round", type=int, default=500, help="chats of one half of the users")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-facts", type=int, default=60)
    parser.add_argument("--max-episodes", type=int, default=150)
    parser.add_argument("--idle-seconds", type=float, default=2.0)
    parser.add_argument("--folder", help="keep the servers' logs and databases here")
    args = parser.parse_args()
    args.folder = args.folder or tempfile.mkdtemp(prefix="soak-")
    Path(args.folder).mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    asyncio.run(main_async(args))
    print(f"\nwall time {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
