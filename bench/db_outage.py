"""The database going away under load for a few seconds: does any chat answered 200 lose its
Manager job, and what do the memory API and /readyz answer meanwhile? (issue 23, point 4)

Creates a scratch PostgreSQL database (`memproxy_bench_<random>`, dropped at the end; the
machine's PostgreSQL itself is never restarted), starts the fake upstream and one memproxy on
it (the fake embedder; its Manager unreachable, so every job stays in the database), and sends
chats from `--concurrency` clients for `--seconds`, each a new conversation with one explicit
request carrying a unique token ("Remember that my code word is tok-17"), streamed and not
alternately. At `--outage-at` seconds the database goes away for `--outage-seconds`, as in a
restart: it takes no connections (``ALLOW_CONNECTIONS false``) and its sessions are terminated,
again every 50 ms (``pg_terminate_backend``). Meanwhile a side task writes and reads through the
memory API, and another polls /readyz.

Prints the chats' statuses, then: answered 200 whose token is in no job (lost: the target is 0),
refused (503) whose token is in a job anyway (harmless: taught without the reply), the memory
API's statuses (the target: 503 with Retry-After, never a bare 500) and how long /readyz said
not ready. `--root` runs memproxy from another source tree (a `git archive` of an older commit,
for the figure before a change).

Run: .venv/bin/python bench/db_outage.py [--seconds 12] [--outage-at 4] [--outage-seconds 2.7]
     [--concurrency 16] [--root DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import re
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.overhead import free_port, pct, wait_listening  # noqa: E402

PYTHON = sys.executable
SERVER = """
import sys

import uvicorn

from app.config import Settings
from app.main import create_app
from tests.fakes import FakeEmbedder

app = create_app(Settings(), embedder=FakeEmbedder())
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
"""
TOKEN = re.compile(r"tok-\d+")


@dataclass
class Tally:
    chats: Counter[str] = field(default_factory=Counter)
    answered: set[str] = field(default_factory=set)
    refused: set[str] = field(default_factory=set)
    api: Counter[str] = field(default_factory=Counter)
    not_ready: list[float] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)


async def chat(client: httpx.AsyncClient, url: str, token: str, stream: bool, tally: Tally) -> None:
    body = {
        "model": "m",
        "stream": stream,
        "messages": [{"role": "user", "content": f"Remember that my code word is {token}"}],
    }
    began = time.monotonic()
    try:
        async with client.stream(
            "POST", f"{url}/v1/chat/completions", json=body, headers={"X-User-Id": "ann"}
        ) as response:
            text = (await response.aread()).decode()
    except httpx.HTTPError as exc:
        tally.chats[type(exc).__name__] += 1
        return
    status = response.status_code
    retry = " Retry-After" if "retry-after" in response.headers else ""
    tally.chats[f"{status}{retry}"] += 1
    if status == 200 and (text.rstrip().endswith("}") or "[DONE]" in text):
        tally.answered.add(token)
        tally.latencies.append(time.monotonic() - began)
    elif status == 503:
        tally.refused.add(token)


async def chats(
    client: httpx.AsyncClient, url: str, args: argparse.Namespace, tally: Tally
) -> None:
    numbers = itertools.count()
    end = time.monotonic() + args.seconds

    async def one_client() -> None:
        while time.monotonic() < end:
            n = next(numbers)
            await chat(client, url, f"tok-{n}", n % 2 == 0, tally)

    await asyncio.gather(*(one_client() for _ in range(args.concurrency)))


async def memory_api(client: httpx.AsyncClient, url: str, seconds: float, tally: Tally) -> None:
    end = time.monotonic() + seconds
    for n in itertools.count():
        if time.monotonic() >= end:
            return
        headers = {"X-User-Id": "api"}
        for method, body in (("POST", {"content": f"fact {n}"}), ("GET", None)):
            try:
                response = await client.request(
                    method, f"{url}/v1/memories", json=body, headers=headers
                )
            except httpx.HTTPError as exc:
                tally.api[f"{method} {type(exc).__name__}"] += 1
                continue
            retry = " Retry-After" if "retry-after" in response.headers else ""
            tally.api[f"{method} {response.status_code}{retry}"] += 1
        await asyncio.sleep(0.05)


async def readyz(client: httpx.AsyncClient, url: str, seconds: float, tally: Tally) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        response = await client.get(f"{url}/readyz")
        if response.status_code != 200:
            tally.not_ready.append(time.monotonic())
        await asyncio.sleep(0.1)


async def admin(server: str, *statements: str) -> None:
    import asyncpg  # type: ignore[import-untyped]  # the `postgres` extra

    connection = await asyncpg.connect(server)
    try:
        for statement in statements:
            await connection.execute(statement)
    finally:
        await connection.close()


async def outage(server: str, name: str, args: argparse.Namespace) -> tuple[float, float]:
    await asyncio.sleep(args.outage_at)
    terminate = (
        f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}' "
        "AND pid <> pg_backend_pid()"
    )
    began = time.monotonic()
    await admin(server, f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false', terminate)
    while time.monotonic() - began < args.outage_seconds:
        await admin(server, terminate)
        await asyncio.sleep(0.05)
    await admin(server, f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
    return began, time.monotonic()


async def jobs_tokens(server: str, name: str) -> Counter[str]:
    import asyncpg

    connection = await asyncpg.connect(server.rsplit("/", 1)[0] + f"/{name}")
    try:
        rows = await connection.fetch("SELECT payload::text AS p FROM manager_jobs")
    finally:
        await connection.close()
    found: Counter[str] = Counter()
    for row in rows:
        found.update(set(TOKEN.findall(row["p"])))
    return found


async def bench(url: str, server: str, name: str, args: argparse.Namespace) -> bool:
    tally = Tally()
    limits = httpx.Limits(max_connections=4 * args.concurrency, keepalive_expiry=2.0)
    async with httpx.AsyncClient(timeout=60, limits=limits, trust_env=False) as client:
        started = time.monotonic()
        _, _, _, (down, up) = await asyncio.gather(
            chats(client, url, args, tally),
            memory_api(client, url, args.seconds, tally),
            readyz(client, url, args.seconds + 3, tally),
            outage(server, name, args),
        )
    await asyncio.sleep(1.0)  # the last exchanges' completions and withdrawals
    jobs = await jobs_tokens(server, name)
    lost = sorted(tally.answered - set(jobs), key=lambda t: int(t[4:]))
    ghosts = tally.refused & set(jobs)
    twice = [t for t, n in jobs.items() if n > 1]
    print(
        f"outage {up - down:.1f} s from {down - started:.1f} s; {sum(tally.chats.values())} chats"
    )
    print(f"chats: {dict(sorted(tally.chats.items()))}")
    if tally.latencies:
        print(
            f"answered 200: p50 {pct(tally.latencies, 0.5) * 1000:.0f} ms, "
            f"p99 {pct(tally.latencies, 0.99) * 1000:.0f} ms, max {max(tally.latencies):.2f} s"
        )
    print(f"answered 200 with no job (lost): {len(lost)} of {len(tally.answered)} {lost[:10]}")
    print(f"refused 503 with a job anyway: {len(ghosts)}; tokens in two jobs: {len(twice)}")
    print(f"memory API: {dict(sorted(tally.api.items()))}")
    if tally.not_ready:
        print(
            f"/readyz not ready from {tally.not_ready[0] - started:.1f} s to "
            f"{tally.not_ready[-1] - started:.1f} s ({len(tally.not_ready)} probes)"
        )
    else:
        print("/readyz: ready throughout")
    bare_500 = sum(n for k, n in tally.api.items() if " 500" in k)
    return not lost and not bare_500


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--postgres-url", default="postgresql://postgres@127.0.0.1:5432/postgres",
                        help="where the bench database is created and dropped")  # fmt: skip
    parser.add_argument("--seconds", type=float, default=12.0)
    parser.add_argument("--outage-at", type=float, default=4.0)
    parser.add_argument("--outage-seconds", type=float, default=2.7)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--root", type=Path, default=ROOT, help="the memproxy source tree to run")
    args = parser.parse_args()
    server = args.postgres_url.replace("postgresql+asyncpg://", "postgresql://")
    name = f"memproxy_bench_{uuid.uuid4().hex[:12]}"
    asyncio.run(admin(server, f'CREATE DATABASE "{name}"'))
    folder = Path(tempfile.mkdtemp(prefix="memproxy-outage-"))
    procs: list[subprocess.Popen[bytes]] = []
    ok = False
    try:
        base = {k: v for k, v in os.environ.items() if not k.startswith("MEMPROXY_")}
        up, port = free_port(), free_port()
        fake = "app.devtools.fake_upstream:FakeUpstream"
        upstream_cmd = [PYTHON, "-m", "uvicorn", "--no-access-log", "--log-level", "warning",
                        "--factory", fake, "--port", str(up)]  # fmt: skip
        database = f"postgresql+asyncpg://{server.split('://', 1)[1].rsplit('/', 1)[0]}/{name}"
        env = {
            **base,
            "PYTHONPATH": str(args.root),
            "MEMPROXY_DATABASE_URL": database,
            "MEMPROXY_UPSTREAM_BASE_URL": f"http://127.0.0.1:{up}/v1",
            "MEMPROXY_UPSTREAM_CHECK_AT_START": "false",
            "MEMPROXY_MANAGER_BASE_URL": f"http://127.0.0.1:{free_port()}/v1",
            "MEMPROXY_MANAGER_RETRY_SECONDS": "3600",
            "MEMPROXY_CONVERSATION_THRESHOLD": "1",
            "MEMPROXY_LOG_LEVEL": "WARNING",
        }  # fmt: skip
        with (folder / "upstream.log").open("wb") as log:
            procs.append(subprocess.Popen(upstream_cmd, cwd=ROOT, env=base, stdout=log, stderr=log))
        wait_listening(up, procs[-1])
        with (folder / "memproxy.log").open("wb") as log:
            procs.append(subprocess.Popen([PYTHON, "-c", SERVER, str(port)], cwd=args.root,
                                          env=env, stdout=log, stderr=log))  # fmt: skip
        wait_listening(port, procs[-1], 120)
        print(f"memproxy from {args.root}, PostgreSQL database {name}, {args.concurrency} clients")
        ok = asyncio.run(bench(f"http://127.0.0.1:{port}", server, name, args))
        lines = (folder / "memproxy.log").read_text(errors="replace").splitlines()
        kinds = Counter(
            re.sub(r"\d+", "N", line.split("] ", 1)[-1])[:90]
            for line in lines
            if " WARNING " in line or " ERROR " in line
        )
        for kind, n in kinds.most_common(8):
            print(f"  log x{n}: {kind}")
    finally:
        for proc in reversed(procs):
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
        asyncio.run(admin(server, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    print("PASS" if ok else "FAIL", f"(logs in {folder})")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
