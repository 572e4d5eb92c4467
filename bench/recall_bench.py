"""Recall speed and size: search latency with 1k, 10k and 100k memories for one user among 1M
stored in all, batch import throughput, and resident memory.

    python bench/recall_bench.py                 # 1M memories in all (~3 min to generate)
    python bench/recall_bench.py --total 200000  # quicker

The database is generated directly (bench/_data.py, Core inserts, not the API: a million real
embeddings would take hours here): synthetic English-like sentences, with
random unit vectors stored as the bundled model's, so nothing is re-embedded. Queries are real:
embedded by the real model, searched through the real pipeline (`/v1/memories/search`, in
process), so every figure includes query embedding, the version check, FAISS, BM25 with
feedback and loading the records. Import throughput is measured through the API with real
embeddings.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import resource
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.config import Settings  # noqa: E402
from app.main import create_app  # noqa: E402
from app.memory.search.parts import vector_model  # noqa: E402
from bench._data import SIZES, Text, generate  # noqa: E402

QUERIES = 200


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


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--total", type=int, default=1_000_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        settings = Settings(
            database_url=f"sqlite+aiosqlite:///{folder}/bench.db",
            embedding_cache_dir=str(ROOT / "data" / "models"),
            log_level="WARNING",
        )
        app = create_app(settings)
        async with app.router.lifespan_context(app):
            services = app.state.services
            memory = services.memory
            print(f"generating {args.total:,} memories ...")
            await generate(
                services.engine, vector_model(memory.embedder), memory.embedder.dim, args.total
            )
            gc.collect()
            print(f"RSS after start-up and generation: {rss_mb():.0f} MB")
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://m") as client:
                text = Text(seed=3)
                for size in SIZES:
                    user = {"X-User-Id": f"u{size // 1000}k"}
                    started = time.perf_counter()
                    await client.post(
                        "/v1/memories/search", json={"query": "warm up"}, headers=user
                    )
                    load = time.perf_counter() - started
                    samples = []
                    for _ in range(QUERIES):
                        query = {"query": text.sentence(4, 10), "limit": 10, "min_score": 0}
                        started = time.perf_counter()
                        response = await client.post(
                            "/v1/memories/search", json=query, headers=user
                        )
                        samples.append(time.perf_counter() - started)
                        assert response.status_code == 200 and response.json()["data"]
                    p50, p99 = percentiles(samples)
                    print(
                        f"{size:>7,} memories: search p50 {p50:5.1f} ms, p99 {p99:5.1f} ms "
                        f"(first search, building the index: {load:.1f} s); RSS {rss_mb():.0f} MB"
                    )
                gc.collect()
                print(f"RSS with 1M stored and these users' indexes cached: {rss_mb():.0f} MB")

                batch = [
                    {"content": f"{text.sentence(8, 30)}. {text.sentence()}."} for _ in range(1000)
                ]
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


if __name__ == "__main__":
    asyncio.run(main())
