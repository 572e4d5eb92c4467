"""Several memproxy replicas on one database, one of them killed mid-run: is any turn lost or
learned twice? (issue 15)

Starts a fresh database (PostgreSQL `memproxy_bench_<random>`, dropped at the end, or a SQLite
file), the fake upstream, a recording fake Manager (bench/replicas_manager.py, answering in
`--manager-delay-ms`) and `--replicas` memproxies on it. `--users` users chat round-robin over
the replicas (request i to replica i mod N; a replica that refuses or cuts a chat: the next one,
as a load balancer would); every user message carries a unique token ("My code word is
tok-u3-c17-t2"), each chat resends its conversation, streaming and not alternately. At
`--kill-at` of the chats the last replica gets SIGKILL, and `--down-seconds` later it restarts.
A side task measures cross-replica visibility: a memory written on one replica, polled for with
search on another. Once every user's Manager jobs are drained it prints turns sent vs tokens
the Manager saw, Manager calls (re-runs: calls repeating a token) and the lease and skip
counters, the time from a Manager call to its memory's creation, memories vs tokens and their
duplicates (MEMPROXY_DEDUP_THRESHOLD=1: the dedup guard hides no double application), 5xx,
throughput, latency and the visibility delay.

Targets: every turn sent seen by the Manager and stored as one memory, no duplicate, no 5xx on
a replica that was not killed, every job drained (exit status 1 otherwise); re-runs only from
the killed replica's jobs (its lease expiring). The replicas' WARNING and ERROR lines are
counted by kind; `--keep-logs` keeps their logs and the Manager's call log when all passed.

Run: .venv/bin/python bench/replicas.py [--database postgres|sqlite] [--replicas 3]
     [--chats 3000] [--users 10] [--concurrency 20] [--kill-at 0.4] [--down-seconds 5]
     [--lease-seconds 10] [--manager-delay-ms 400] [--probes 100]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import BinaryIO

import httpx
import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.overhead import MODELS, free_port, pct, wait_listening  # noqa: E402
from bench.replicas_manager import TOKEN  # noqa: E402

PYTHON = sys.executable
UVICORN = [PYTHON, "-m", "uvicorn", "--no-access-log", "--log-level", "warning"]
TURNS = 10
"""User messages per conversation; then the next conversation."""
EXCEPTION = re.compile(r"[\w.]+(?:Error|Exception): ")
"""The last line of a traceback."""
MASK = re.compile(r"\b[0-9a-f]{32}\b|\b[0-9a-f-]{36}\b|\d+")
PROBES_AT_ONCE = 10
"""Visibility probes waiting at once (a memory's creation takes seconds on a loaded machine)."""


class Proc:
    """A server process with its output in `<folder>/<name>.log` (appended across restarts)."""

    def __init__(self, name: str, args: list[str], port: int, env: dict[str, str], folder: str):
        self.name, self.args, self.port, self.env = name, args, port, env
        self.log_path = Path(folder) / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.log: BinaryIO | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.log = open(self.log_path, "ab")  # noqa: SIM115 (closed in stop or kill)
        base = {k: v for k, v in os.environ.items() if not k.startswith("MEMPROXY_")}
        self.proc = subprocess.Popen(self.args, cwd=ROOT, env={**base, **self.env},
                                     stdout=self.log, stderr=subprocess.STDOUT)  # fmt: skip
        wait_listening(self.port, self.proc, 120)

    def kill(self) -> int:
        assert self.proc is not None and self.log is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.log.close()
        return self.proc.pid

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        if self.log is not None:
            self.log.close()


@dataclass
class Run:
    args: argparse.Namespace
    replicas: list[Proc]
    start: float = field(default_factory=time.monotonic)
    started: int = 0
    sent: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    status_5xx: Counter[int] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    cut: int = 0
    refused: int = 0
    killed_at: float | None = None
    restarted_at: float | None = None
    requests: Iterator[int] = field(default_factory=itertools.count)
    delays: list[tuple[float, float]] = field(default_factory=list)
    probes_lost: int = 0
    chats_done: bool = False
    chats_end: float = 0.0
    kill_due: asyncio.Event = field(default_factory=asyncio.Event)

    def down(self, replica: int) -> bool:
        """Whether `replica` is the killed one, not yet listening again."""
        return replica == len(self.replicas) - 1 and self.killed_at is not None and (
            self.restarted_at is None
        )  # fmt: skip

    def failed(self, replica: int, began: float, exc: Exception) -> None:
        """A request that got no answer: cut by the kill, refused by the dead replica, or else."""
        killed = self.killed_at if replica == len(self.replicas) - 1 else None
        if killed is not None and began < killed:
            self.cut += 1
        elif killed is not None and (self.restarted_at is None or began < self.restarted_at):
            self.refused += 1
        else:
            self.errors[f"replica {replica}: {type(exc).__name__}"] += 1


async def post_chat(client: httpx.AsyncClient, url: str, user: str,
                    messages: list[dict[str, str]], stream: bool) -> tuple[int, str]:  # fmt: skip
    """(status, the reply's text); a stream cut before `[DONE]` raises."""
    body = {"model": "fake-model", "messages": messages, "stream": stream}
    headers = {"X-User-Id": user}
    if not stream:
        response = await client.post(f"{url}/v1/chat/completions", json=body, headers=headers)
        if response.status_code != 200:
            return response.status_code, ""
        return 200, str(response.json()["choices"][0]["message"]["content"])
    parts, done = [], False
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body,
                             headers=headers) as response:  # fmt: skip
        if response.status_code != 200:
            await response.aread()
            return response.status_code, ""
        async for line in response.aiter_lines():
            done = done or line == "data: [DONE]"
            if line.startswith("data: {") and (choices := orjson.loads(line[6:])["choices"]):
                parts.append(choices[0].get("delta", {}).get("content") or "")
    if not done:
        raise httpx.RemoteProtocolError("stream ended before [DONE]")
    return 200, "".join(parts)


async def chat(client: httpx.AsyncClient, run: Run, user: str,
               messages: list[dict[str, str]], stream: bool) -> str:  # fmt: skip
    """The reply, from replica i mod N or, when that one fails, the next ones."""
    first, began = next(run.requests), time.monotonic()
    n = len(run.replicas)
    for attempt in range(4 * n):
        replica = (first + attempt) % n
        tried = time.monotonic()
        try:
            status, reply = await post_chat(client, run.replicas[replica].url, user, messages,
                                            stream)  # fmt: skip
        except httpx.TransportError as exc:
            run.failed(replica, tried, exc)
            await asyncio.sleep(0.02 * attempt)
            continue
        if status == 200:
            run.latencies.append(time.monotonic() - began)
            return reply
        if status < 500:
            raise RuntimeError(f"replica {replica} answered {status}")
        run.status_5xx[replica] += 1
    raise RuntimeError(f"a chat of {user} failed on every replica")


async def converse(client: httpx.AsyncClient, run: Run, number: int) -> None:
    """One conversation of TURNS user messages (fewer when the run's chats are all started)."""
    user, conversation = number % run.args.users, number // run.args.users
    messages: list[dict[str, str]] = []
    for turn in range(TURNS):
        if run.started >= run.args.chats:
            return
        run.started += 1
        token = f"tok-u{user}-c{conversation}-t{turn}"
        messages.append({"role": "user", "content": f"My code word is {token}"})
        reply = await chat(client, run, f"u{user}", messages, stream=turn % 2 == 0)
        messages.append({"role": "assistant", "content": reply})
        run.sent.append(token)
        if len(run.sent) >= run.args.kill_at * run.args.chats:
            run.kill_due.set()


async def clients(client: httpx.AsyncClient, run: Run) -> None:
    numbers = itertools.count()

    async def worker() -> None:
        while run.started < run.args.chats:
            await converse(client, run, next(numbers))

    await asyncio.gather(*(worker() for _ in range(run.args.concurrency)))
    run.chats_done, run.chats_end = True, time.monotonic()
    run.kill_due.set()


async def killer(run: Run) -> None:
    """SIGKILL the last replica at `--kill-at` of the chats; restart it `--down-seconds` later."""
    await run.kill_due.wait()
    if not 0 < run.args.kill_at < 1 or run.chats_done:
        return
    victim = run.replicas[-1]
    run.killed_at = time.monotonic()
    pid = victim.kill()
    print(f"  t={run.killed_at - run.start:5.1f} s  kill -9 {victim.name} (pid {pid}, "
          f":{victim.port}) after {len(run.sent)} chats")  # fmt: skip
    await asyncio.sleep(run.args.down_seconds)
    await asyncio.to_thread(victim.start)
    run.restarted_at = time.monotonic()
    print(f"  t={run.restarted_at - run.start:5.1f} s  {victim.name} restarted, listening, "
          f"after {len(run.sent)} chats")  # fmt: skip


async def probe(client: httpx.AsyncClient, a: str, b: str, n: int) -> tuple[float, float] | None:
    """A memory created on `a`, searched for on `b` every 10 ms: seconds from the creation's
    answer to the start and to the answer of the search that found it (None: not in 10 s)."""
    content = f"Probe {n} marker {uuid.uuid4().hex}"
    headers = {"X-User-Id": "probe"}
    created = await client.post(f"{a}/v1/memories", json={"content": content}, headers=headers)
    created.raise_for_status()
    memory_id, written = created.json()["id"], time.monotonic()
    query = {"query": content, "limit": 3, "min_score": 0.0}
    first = True
    while time.monotonic() - written < 10:
        asked = 0.0 if first else time.monotonic() - written
        found = await client.post(f"{b}/v1/memories/search", json=query, headers=headers)
        if any(hit["id"] == memory_id for hit in found.json()["data"]):
            return asked, time.monotonic() - written
        first = False
        await asyncio.sleep(0.01)
    return None


async def prober(client: httpx.AsyncClient, run: Run) -> None:
    """A probe every 200 ms (at most PROBES_AT_ONCE waiting) until the chats are done."""
    waiting: set[asyncio.Task[None]] = set()
    room = asyncio.Semaphore(PROBES_AT_ONCE)

    async def one(a: int, b: int, n: int) -> None:
        try:
            delay = await probe(client, run.replicas[a].url, run.replicas[b].url, n)
        except httpx.TransportError:
            return  # a replica killed under it: not a visibility figure
        finally:
            room.release()
        if delay is None:
            run.probes_lost += 1
        else:
            run.delays.append(delay)

    for n in range(run.args.probes):
        await room.acquire()
        await asyncio.sleep(0.2)
        if run.chats_done:
            room.release()
            break
        alive = [r for r in range(len(run.replicas)) if not run.down(r)]
        task = asyncio.create_task(one(alive[n % len(alive)], alive[(n + 1) % len(alive)], n))
        waiting.add(task)
        task.add_done_callback(waiting.discard)
    await asyncio.gather(*waiting)


async def drain(client: httpx.AsyncClient, url: str, users: int, seconds: float) -> dict[str, int]:
    """Wait until no user has a pending job (or `seconds`); the job counts summed over users."""
    deadline = time.monotonic() + seconds
    while True:
        totals: Counter[str] = Counter()
        for user in range(users):
            stats = await client.get(f"{url}/v1/memories/stats", headers={"X-User-Id": f"u{user}"})
            totals.update({k: v for k, v in stats.json()["jobs"].items() if isinstance(v, int)})
        if totals["pending"] == 0 or time.monotonic() > deadline:
            return dict(totals)
        await asyncio.sleep(0.5)


async def contents(client: httpx.AsyncClient, url: str, user: str) -> list[tuple[str, float]]:
    """The user's memories: (content, created at as a Unix time)."""
    found: list[tuple[str, float]] = []
    while True:
        page = (await client.get(f"{url}/v1/memories", headers={"X-User-Id": user},
                                 params={"limit": 1000, "offset": len(found)})).json()  # fmt: skip
        found += [(m["content"], datetime.fromisoformat(m["created_at"]).timestamp())
                  for m in page["data"]]  # fmt: skip
        if not page["has_more"]:
            return found


def scraped(text: str, name: str) -> float | None:
    """The sum of a metric's samples (`name` with or without labels); None when absent."""
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if line.startswith((name + " ", name + "{"))]  # fmt: skip
    return sum(values) if values else None


async def metrics(client: httpx.AsyncClient, run: Run) -> dict[str, float | None]:
    pages = [(await client.get(f"{r.url}/metrics")).text for r in run.replicas]
    names = {
        "leases expired": "memproxy_manager_leases_expired_total",
        "jobs skipped": "memproxy_manager_jobs_skipped_total",
        "jobs applied": "memproxy_manager_jobs_applied_total",
        "duplicate operations": 'memproxy_manager_operations_total{result="duplicate"}',
    }
    sums: dict[str, float | None] = {}
    for label, name in names.items():
        values = [v for page in pages if (v := scraped(page, name)) is not None]
        sums[label] = sum(values) if values or "{" in name else None  # a label unused: 0
    return sums


def calls_of(log: Path) -> list[tuple[float, list[str]]]:
    """The fake Manager's calls: (Unix time, the tokens of its new exchange)."""
    if not log.exists():
        return []
    return [(c["at"], c["tokens"]) for c in map(orjson.loads, log.read_text().splitlines())]


def apply_lags(
    calls: list[tuple[float, list[str]]], memories: list[tuple[str, float]]
) -> list[float]:
    """Per memory, seconds from the last Manager call that held its token to its creation."""
    asked: dict[str, list[float]] = {}
    for at, tokens in calls:
        for token in tokens:
            asked.setdefault(token, []).append(at)
    lags = []
    for content, created in memories:
        times = [
            t for token in TOKEN.findall(content) for t in asked.get(token, ()) if t <= created
        ]
        if times:
            lags.append(created - max(times))
    return lags


def log_lines(folder: Path) -> Counter[str]:
    """The replicas' WARNING and ERROR lines and the exceptions in their tracebacks, by kind
    (ids and numbers masked); the open-server warning left out."""
    found: Counter[str] = Counter()
    for path in folder.glob("replica*.log"):
        for line in path.read_text(errors="replace").splitlines():
            parts = line.split(" ", 4)  # date time LEVEL logger [request id] message
            if len(parts) == 5 and parts[2] in ("WARNING", "ERROR"):
                line = " ".join(parts[2:])
            elif not EXCEPTION.match(line):
                continue
            if "MEMPROXY_API_KEYS is empty" not in line:
                found[MASK.sub("#", line)[:120]] += 1
    return found


def report(run: Run, calls: list[tuple[float, list[str]]], jobs: dict[str, int],
           memories: list[tuple[str, float]],
           counters: dict[str, float | None], elapsed: float, drained: float,
           folder: Path) -> bool:  # fmt: skip
    """Print the figures; True when nothing was lost or doubled."""
    seen: set[str] = set()
    firsts = reruns = empty = 0
    for _, tokens in calls:
        if not tokens:
            empty += 1
        elif seen & set(tokens):
            reruns += 1
        else:
            firsts += 1
        seen.update(tokens)
    sent = set(run.sent)
    unseen = sorted(sent - seen)
    stored = Counter(t for m, _ in memories for t in TOKEN.findall(m))
    doubled = sorted(t for t, n in stored.items() if n > 1)
    no_memory = sorted(sent - set(stored))
    ms = 1000
    print(f"turns sent {len(run.sent)} ({len(sent)} distinct); distinct tokens the Manager saw "
          f"{len(seen)}; sent but never seen {len(unseen)} {unseen[:10]}; seen but not sent "
          f"{len(seen - sent)}")  # fmt: skip
    print(
        f"Manager calls {len(calls)}: {firsts} first calls, {reruns} re-runs (repeating a "
        f"token), {empty} without a token; calls per job {len(calls) / max(firsts, 1):.3f}"
    )
    print(
        "  summed over replicas (the killed one's counters restart at 0): "
        + ", ".join(f"{k} {'n/a' if v is None else f'{v:g}'}" for k, v in counters.items())
    )
    print(f"jobs {drained:.1f} s after the last chat: {jobs}")
    if lags := apply_lags(calls, memories):
        print(f"from the Manager call to the memory stored: p50 {pct(lags, .5):.2f} s, p99 "
              f"{pct(lags, .99):.2f} s, max {max(lags):.2f} s")  # fmt: skip
    print(
        f"memories {len(memories)} for {len(sent)} tokens: tokens with no memory "
        f"{len(no_memory)} {no_memory[:10]}; duplicated {len(doubled)} {doubled[:10]}"
    )
    survivors = {r: n for r, n in run.status_5xx.items() if r != len(run.replicas) - 1}
    print(
        f"5xx by replica {dict(run.status_5xx) or 0} (survivors: {sum(survivors.values())}); "
        f"killed replica: cut by the kill {run.cut}, refused while dead {run.refused} (all "
        f"retried on the next replica); other errors {dict(run.errors) or 0}"
    )
    lat = run.latencies
    print(f"{len(lat)} chats in {elapsed:.1f} s: {len(lat) / elapsed:.1f} chats/s; latency p50 "
          f"{pct(lat, .5) * ms:.1f} ms, p99 {pct(lat, .99) * ms:.1f} ms")  # fmt: skip
    if run.delays:
        start, answer = [d[0] for d in run.delays], [d[1] for d in run.delays]
        print(f"cross-replica visibility: {len(answer)} probes ({run.probes_lost} not found in 10 "
              f"s), {start.count(0.0)} found by the first search after the write; from the write "
              f"to the answer that found it p50 {pct(answer, .5) * ms:.1f} ms, p99 "
              f"{pct(answer, .99) * ms:.1f} ms, max {max(answer) * ms:.1f} ms; to that search's "
              f"start: max {max(start) * ms:.1f} ms")  # fmt: skip
    lines = log_lines(folder)
    print(f"replica log lines (WARNING, ERROR, exceptions): {sum(lines.values())}")
    for line, n in lines.most_common(8):
        print(f"  {n:5} x {line}")
    undrained = jobs.get("pending", 0) + jobs.get("failed", 0)
    return not (unseen or doubled or no_memory or survivors or run.errors or run.probes_lost
                or undrained)  # fmt: skip


async def bench(run: Run, folder: Path) -> bool:
    # Idle connections closed before the replicas close them (uvicorn: after 5 s, httpx's own
    # default): else a request sent on a connection the server is closing fails (ReadError).
    limits = httpx.Limits(max_connections=4 * run.args.concurrency, keepalive_expiry=2.0)
    async with httpx.AsyncClient(timeout=60, limits=limits, trust_env=False) as client:
        run.start = time.monotonic()
        await asyncio.gather(clients(client, run), killer(run), prober(client, run))
        elapsed = run.chats_end - run.start
        survivor = run.replicas[0].url
        jobs = await drain(client, survivor, run.args.users, 3 * run.args.lease_seconds + 60)
        drained = time.monotonic() - run.chats_end
        memories = [m for u in range(run.args.users)
                    for m in await contents(client, survivor, f"u{u}")]  # fmt: skip
        counters = await metrics(client, run)
    calls = calls_of(folder / "manager-calls.jsonl")
    return report(run, calls, jobs, memories, counters, elapsed, drained, folder)


@contextmanager
def database(args: argparse.Namespace, folder: str) -> Iterator[str]:
    """The bench's database URL; a PostgreSQL one is created here and dropped at the end."""
    if args.database == "sqlite":
        yield f"sqlite+aiosqlite:///{folder}/memproxy.db"
        return
    import asyncpg  # type: ignore[import-untyped]  # the `postgres` extra

    server = args.postgres_url.replace("postgresql+asyncpg://", "postgresql://")
    name = f"memproxy_bench_{uuid.uuid4().hex[:12]}"

    async def execute(sql: str) -> None:
        connection = await asyncpg.connect(server)
        try:
            await connection.execute(sql)
        finally:
            await connection.close()

    asyncio.run(execute(f"CREATE DATABASE {name}"))
    try:
        yield f"{args.postgres_url.rsplit('/', 1)[0]}/{name}"
    finally:
        asyncio.run(execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))


def replica_env(args: argparse.Namespace, url: str, up: int, manager: int) -> dict[str, str]:
    env = {
        "MEMPROXY_DATABASE_URL": url,
        "MEMPROXY_UPSTREAM_BASE_URL": f"http://127.0.0.1:{up}/v1",
        "MEMPROXY_MANAGER_BASE_URL": f"http://127.0.0.1:{manager}/v1",
        "MEMPROXY_EMBEDDING_CACHE_DIR": str(MODELS),
        "MEMPROXY_CONVERSATION_THRESHOLD": "1",
        "MEMPROXY_PROCESSING_INTERVAL": "0",
        "MEMPROXY_LOG_LEVEL": args.log_level,
        "MEMPROXY_DEDUP_THRESHOLD": "1",  # "Code word is tok-..." memories are all alike
    }
    if "manager_lease_seconds" in (ROOT / "app" / "config.py").read_text():
        env["MEMPROXY_MANAGER_LEASE_SECONDS"] = str(args.lease_seconds)
    return env


def run_all(args: argparse.Namespace, url: str, folder: str) -> bool:
    env = {"MEMPROXY_DATABASE_URL": url, "MEMPROXY_EMBEDDING_CACHE_DIR": str(MODELS)}
    subprocess.run([PYTHON, "-m", "app.cli", "db", "upgrade"], cwd=ROOT, check=True,
                   env={**os.environ, **env}, capture_output=True)  # fmt: skip
    manager_log = Path(folder) / "manager-calls.jsonl"
    up, manager = free_port(), free_port()
    helpers = [
        Proc("upstream", [*UVICORN, "--factory", "app.devtools.fake_upstream:FakeUpstream",
                          "--port", str(up)], up, {}, folder),
        Proc("manager", [*UVICORN, "bench.replicas_manager:app", "--port", str(manager)],
             manager, {"MANAGER_DELAY_MS": str(args.manager_delay_ms),
                       "MANAGER_LOG": str(manager_log)}, folder),
    ]  # fmt: skip
    env = replica_env(args, url, up, manager)
    replicas = []
    for i in range(args.replicas):
        port = free_port()
        replicas.append(Proc(f"replica{i}", [PYTHON, "-m", "app.cli", "serve", "--port",
                                             str(port)], port, env, folder))  # fmt: skip
    lease = env.get("MEMPROXY_MANAGER_LEASE_SECONDS", "not a setting yet")
    print(
        f"{args.database}, {args.replicas} replicas, {args.users} users, {args.chats} chats at "
        f"concurrency {args.concurrency}; Manager {args.manager_delay_ms} ms; lease {lease}"
    )
    with ExitStack() as stack:
        for proc in [*helpers, *replicas]:
            stack.callback(proc.stop)
            proc.start()
        return asyncio.run(bench(Run(args, replicas), Path(folder)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database", choices=["postgres", "sqlite"], default="postgres")
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--postgres-url", default="postgresql+asyncpg://postgres@127.0.0.1:5432/postgres",
                        help="where the bench database is created and dropped")  # fmt: skip
    parser.add_argument("--users", type=int, default=10)
    parser.add_argument("--chats", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=20)
    parser.add_argument(
        "--kill-at", type=float, default=0.4, help="share of the chats sent; 0: no kill"
    )
    parser.add_argument("--down-seconds", type=float, default=5.0)
    parser.add_argument("--lease-seconds", type=float, default=10.0)
    parser.add_argument("--manager-delay-ms", type=int, default=400)
    parser.add_argument("--probes", type=int, default=100)
    parser.add_argument("--log-level", default="WARNING", help="the replicas' MEMPROXY_LOG_LEVEL")
    parser.add_argument("--keep-logs", action="store_true", help="keep them when passed too")
    args = parser.parse_args()
    if args.replicas < 2:
        parser.error("--replicas: at least 2 (one is killed)")
    folder = tempfile.mkdtemp(prefix="memproxy-replicas-")
    ok = False
    began = time.monotonic()
    try:
        with database(args, folder) as url:
            ok = run_all(args, url, folder)
    finally:
        print(f"{'passed' if ok else 'FAILED'} in {time.monotonic() - began:.0f} s")
        if ok and not args.keep_logs:
            shutil.rmtree(folder, ignore_errors=True)
        else:
            print(f"logs: {folder}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
