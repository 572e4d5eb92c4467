"""Recall speed and size: search latency with 1k, 10k and 100k memories for one user among 1M
stored in all, the cold index build (a user's first search: all their memories read from the
database into FAISS + BM25), also after a restart, batch import throughput, and resident memory.

    python bench/recall_bench.py                 # 1M memories in all (~3 min to generate)
    python bench/recall_bench.py --total 200000  # quicker
    python bench/recall_bench.py --total 200000 \
        --database-url postgresql+asyncpg://postgres@127.0.0.1:5432/postgres

By default the database is a temporary SQLite file. With a ``postgresql+asyncpg://`` URL the
bench connects to that server's ``postgres`` database, creates a fresh ``memproxy_bench_<hex>``
(the URL's own database name is not used), runs on it, then ends its connections and drops it,
also when the run fails; after the generation it runs ``VACUUM ANALYZE`` on the memories, as
autovacuum would on a real server (a first read of freshly loaded rows also writes their hint
bits). Any other URL is used as it is: it must name an empty database.

The database is generated directly (bench/_data.py, Core inserts, not the API: a million real
embeddings would take hours here): synthetic English-like sentences, with
random unit vectors stored as the bundled model's, so nothing is re-embedded. Queries are real:
embedded by the real model, searched through the real pipeline (`/v1/memories/search`, in
process), so every figure includes query embedding, the version check, FAISS, BM25 with
feedback and loading the records. Import throughput is measured through the API with real
embeddings.

The cold build of each size is its first search in the app that generated the database (after a
warm-up search of a user with no memories, so it carries no first-query costs). Then that app is
shut down and a new one started on the same database (a new lifespan: new engine, empty caches,
as a replica that never saw the user) and the first search of the 100k user timed again, with
the reading of its rows alone (``MemoryStore.snapshot``) timed after it.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import resource
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, NamedTuple

import httpx
from fastapi import FastAPI
from sqlalchemy import text as sql
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.config import Settings  # noqa: E402
from app.main import create_app  # noqa: E402
from app.memory.search.cache import IndexCache  # noqa: E402
from app.memory.search.parts import vector_model  # noqa: E402
from bench._data import SIZES, Text, generate  # noqa: E402

QUERIES = 200
WARM_UP_USER = {"X-User-Id": "nobody"}
"""A user with no memories: the first search in an app (model warm-up) goes to them."""


def peak_mb() -> float:
    """This process's peak resident memory."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return (
        ordered[len(ordered) // 2] * 1000,
        ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000,
    )


async def _postgres_admin(url: str, *statements: tuple[str, ...]) -> None:
    """Run statements (SQL, then its arguments) on the `postgres` database of `url`'s server."""
    import asyncpg  # the `postgres` extra

    parsed = make_url(url)
    connection = await asyncpg.connect(
        host=parsed.host, port=parsed.port or 5432, user=parsed.username,
        password=parsed.password, database="postgres", timeout=30,
    )  # fmt: skip
    try:
        for statement, *arguments in statements:
            await connection.execute(statement, *arguments)
    finally:
        await connection.close()


@asynccontextmanager
async def bench_database(url: str) -> AsyncIterator[str]:
    """`url` itself, or for PostgreSQL the URL of a new ``memproxy_bench_<hex>`` database on its
    server, dropped at the end (its connections ended first), whatever happened."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "postgresql":
        yield url
        return
    name = f"memproxy_bench_{uuid.uuid4().hex[:12]}"
    await _postgres_admin(url, (f'CREATE DATABASE "{name}"',))
    print(f"created database {name} on {parsed.host}:{parsed.port or 5432}")
    try:
        yield parsed.set(database=name).render_as_string(hide_password=False)
    finally:
        await _postgres_admin(
            url,
            ("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
             "WHERE datname = $1 AND pid <> pg_backend_pid()", name),
            (f'DROP DATABASE IF EXISTS "{name}"',),
        )  # fmt: skip
        print(f"dropped database {name}")


@asynccontextmanager
async def running(settings: Settings) -> AsyncIterator[tuple[FastAPI, httpx.AsyncClient]]:
    """A new app (its own lifespan: engine, caches, model) and a client calling it in process."""
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
            await client.post(
                "/v1/memories/search", json={"query": "warm up"}, headers=WARM_UP_USER
            )
            yield app, client


class Timed(NamedTuple):
    wall: float
    cpu: float
    """This process's CPU time (all threads): the rest of `wall` is waiting, for the database
    server, the disk or other processes on the machine."""

    def __str__(self) -> str:
        return f"{self.wall:.2f} s ({self.cpu:.2f} s CPU)"


async def first_search(client: httpx.AsyncClient, user: dict[str, str]) -> Timed:
    """How long the user's first search takes: it builds their index."""
    started, cpu = time.perf_counter(), time.process_time()
    response = await client.post("/v1/memories/search", json={"query": "warm up"}, headers=user)
    elapsed = Timed(time.perf_counter() - started, time.process_time() - cpu)
    assert response.status_code == 200, response.text
    return elapsed


async def vacuum(engine: AsyncEngine) -> None:
    """VACUUM ANALYZE the memories on PostgreSQL (outside a transaction, as it must be)."""
    if engine.dialect.name != "postgresql":
        return
    started = time.perf_counter()
    async with engine.connect() as connection:
        autocommit = await connection.execution_options(isolation_level="AUTOCOMMIT")
        await autocommit.execute(sql("VACUUM ANALYZE memories"))
        await autocommit.execute(sql("VACUUM ANALYZE user_state"))
    print(f"VACUUM ANALYZE after the generation: {time.perf_counter() - started:.1f} s")


async def searches(
    client: httpx.AsyncClient, user: dict[str, str], count: int = QUERIES
) -> tuple[float, float, list[list[str]]]:
    """p50 and p99 of `count` searches (the same queries for every user), and what each found."""
    text = Text(seed=3)
    samples, found = [], []
    for _ in range(count):
        query = {"query": text.sentence(4, 10), "limit": 10, "min_score": 0}
        started = time.perf_counter()
        response = await client.post("/v1/memories/search", json=query, headers=user)
        samples.append(time.perf_counter() - started)
        assert response.status_code == 200 and response.json()["data"]
        found.append([hit["id"] for hit in response.json()["data"]])
    return *percentiles(samples), found


async def sizes(
    client: httpx.AsyncClient,
    cache: IndexCache,
    total: int,
    sizes: tuple[int, ...],
    queries: int = QUERIES,
) -> None:
    """Each size searched with the exhaustive index, then the sizes of at least
    MEMPROXY_INDEX_IVF_MIN_VECTORS with the approximate one, the same `queries` queries."""
    ivf_min, cache.upkeep.ivf_min = cache.upkeep.ivf_min, 0
    for size in sizes:
        user = {"X-User-Id": f"u{size // 1000}k"}
        load = await first_search(client, user)
        started = time.perf_counter()
        await cache.settled()  # its image, written in the background: not timed in the searches
        imaged = f", its image written {time.perf_counter() - started:.1f} s later"
        p50, p99, _ = await searches(client, user, queries)
        print(
            f"{size:>7,} memories: search p50 {p50:5.1f} ms, p99 {p99:5.1f} ms "
            f"(first search, building the index: {load}{imaged if size >= 10_000 else ''}); "
            f"RSS {rss_mb():.0f} MB"
        )
    for size in [s for s in sizes if ivf_min and s >= ivf_min]:
        user_id = f"u{size // 1000}k"
        cache.forget(user_id)
        entry = await cache.get(user_id)  # from its image, as the approximate one will be
        p50, p99, restored = await searches(client, {"X-User-Id": user_id}, queries)
        print(f"{size:>7,} memories, from its image, exhaustive: search p50 {p50:5.1f} ms, "
              f"p99 {p99:5.1f} ms")  # fmt: skip
        started = time.perf_counter()
        cache.upkeep.ivf_min = ivf_min
        cache.upkeep.offer(user_id, entry)  # trained in the background, then imaged
        await cache.settled()
        cache.upkeep.ivf_min = 0
        index: Any = entry.vectors._index
        assert entry.vectors.approximate
        trained = time.perf_counter() - started
        p50, p99, found = await searches(client, {"X-User-Id": user_id}, queries)
        same = statistics.mean(
            len(set(a) & set(b)) / len(a) for a, b in zip(found, restored, strict=True)
        )
        print(
            f"{size:>7,} memories, the same index made approximate (IVF, {index.nprobe} of "
            f"{index.nlist} lists probed; trained and imaged in {trained:.1f} s): search p50 "
            f"{p50:5.1f} ms, p99 {p99:5.1f} ms; top 10 shared with the exhaustive search: "
            f"{same:.3f}"
        )
    cache.upkeep.ivf_min = ivf_min
    print(f"index images written (users of >= 10,000 memories): {cache.upkeep.images}")
    gc.collect()
    print(f"RSS with {total:,} stored and these users' indexes cached: {rss_mb():.0f} MB")

    text = Text(seed=5)
    batch = [{"content": f"{text.sentence(8, 30)}. {text.sentence()}."} for _ in range(1000)]
    started = time.perf_counter()
    response = await client.post(
        "/v1/memories/batch",
        json={"memories": batch},
        headers={"X-User-Id": "importer"},
        timeout=600,
    )
    elapsed = time.perf_counter() - started
    assert response.status_code == 201, response.text
    print(f"batch import through the API: 1,000 memories (two sentences each) in "
          f"{elapsed:.1f} s = {1000 / elapsed:.0f} memories/s")  # fmt: skip


async def every_user(client: httpx.AsyncClient, cache: IndexCache, users: list[str]) -> None:
    """Each of these users searched once (an index built for each, the least recently used
    evicted past MEMPROXY_INDEX_CACHE_MAX_MEMORIES), then every index dropped: what the process
    holds with many users, and what it gives back when they go cold."""
    started = time.perf_counter()
    for user_id in users:
        await first_search(client, {"X-User-Id": user_id})
    gc.collect()
    took = time.perf_counter() - started
    print(f"every one of {len(users):,} more users searched once ({took:.0f} s): "
          f"{cache.memories_cached:,} memories cached, RSS {rss_mb():.0f} MB "
          f"(peak {peak_mb():.0f} MB)")  # fmt: skip
    cache.forget()  # as MEMPROXY_INDEX_IDLE_SECONDS drops them: then malloc_trim in a thread
    dropped = rss_mb()
    await cache.settled()
    print(f"every index dropped (as when the users go idle): RSS {dropped:.0f} MB, then "
          f"{rss_mb():.0f} MB once the freed memory is given back (malloc_trim)")  # fmt: skip


async def restart(settings: Settings, size: int) -> None:
    """The largest user's first search in a new app on the same database: from its index image,
    then with images off (built from the rows), then its rows' read alone."""
    user_id = f"u{size // 1000}k"
    async with running(settings) as (app, client):
        loaded = await first_search(client, {"X-User-Id": user_id})
        cache = app.state.services.memory.cache
        assert cache.upkeep.restores == 1, "no image was loaded"
        entry = cache.cached(user_id)
        kind = "approximate" if entry is not None and entry.vectors.approximate else "exhaustive"
    print(f"after a restart (new app, same database): first search of the {size:,}-memory user, "
          f"loading its index image ({kind}) and catching up: {loaded}")  # fmt: skip
    without = settings.model_copy(update={"index_image_min_memories": 0})
    async with running(without) as (app, client):
        build = await first_search(client, {"X-User-Id": user_id})
        started, cpu = time.perf_counter(), time.process_time()
        snapshot = await app.state.services.store.snapshot(user_id)
        read = Timed(time.perf_counter() - started, time.process_time() - cpu)
        assert len(snapshot.rows) == size
    print(f"the same with images off (MEMPROXY_INDEX_IMAGE_MIN_MEMORIES=0), building the index "
          f"from its rows: {build}; reading its rows alone (MemoryStore.snapshot, timed "
          f"after): {read}")  # fmt: skip


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--total", type=int, default=1_000_000)
    parser.add_argument(
        "--database-url",
        help="default: a temporary SQLite file; postgresql+asyncpg://HOST/NAME: a fresh "
        "memproxy_bench_<hex> database on that server, dropped at the end",
    )
    parser.add_argument(
        "--sizes", default=",".join(map(str, SIZES)),
        help="the users searched: how many memories each (comma-separated; the largest is "
        "also searched after a restart)",
    )  # fmt: skip
    parser.add_argument(
        "--ivf-min-vectors", type=int, default=50_000,
        help="MEMPROXY_INDEX_IVF_MIN_VECTORS: the sizes of at least this many are searched "
        "again once their index is made approximate (0: not)",
    )  # fmt: skip
    parser.add_argument(
        "--queries", type=int, default=QUERIES,
        help="searches per measurement (their p99 is the second worst of 200; more, steadier)",
    )  # fmt: skip
    parser.add_argument(
        "--every-user", action="store_true",
        help="then search every other user once (1,000 memories each), and drop every index",
    )  # fmt: skip
    args = parser.parse_args()
    chosen = tuple(sorted(int(n) for n in args.sizes.split(",")))
    with tempfile.TemporaryDirectory() as folder:
        url = args.database_url or f"sqlite+aiosqlite:///{folder}/bench.db"
        async with bench_database(url) as database_url:
            settings = Settings(
                database_url=database_url,
                embedding_cache_dir=str(ROOT / "data" / "models"),
                log_level="WARNING",
                index_ivf_min_vectors=args.ivf_min_vectors,
            )
            print(f"database: {make_url(database_url).render_as_string()}")
            async with running(settings) as (app, client):
                services = app.state.services
                memory = services.memory
                print(f"generating {args.total:,} memories ...")
                started = time.perf_counter()
                users = await generate(
                    services.engine, vector_model(memory.embedder), memory.embedder.dim,
                    args.total, {f"u{size // 1000}k": size for size in chosen},
                )  # fmt: skip
                print(f"generated in {time.perf_counter() - started:.0f} s")
                await vacuum(services.engine)
                gc.collect()
                print(f"RSS after start-up and generation: {rss_mb():.0f} MB")
                await sizes(client, memory.cache, args.total, chosen, args.queries)
                if args.every_user:
                    fillers = [u for u in users if u.startswith("filler")]
                    await every_user(client, memory.cache, fillers)
            await restart(settings, chosen[-1])


if __name__ == "__main__":
    asyncio.run(main())
