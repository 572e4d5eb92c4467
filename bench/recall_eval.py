"""Recall quality on LoCoMo-format conversations, through memproxy's HTTP memory API.

For each conversation: every dialog turn becomes one memory of one user (``[<session date>]
<speaker>: <text>``, plus `` (shares photo: <caption>)``), said at its session's date
(``observed_at``, read as UTC), imported with ``/v1/memories/batch``;
each question of categories 1-4 is asked with ``/v1/memories/search`` (``min_score`` 0, limit
20), and the ranks of its evidence turns give recall@1/5/10/20 (share of a question's evidence
in the top k, averaged over questions) and MRR, overall and per category, plus search latency.

    python bench/recall_eval.py                          # the dev file, an in-process app
    python bench/recall_eval.py --dense-weight 0         # BM25 side alone (1: dense alone)
    python bench/recall_eval.py --quantize all           # int8 for memories too (none: fp32 only)
    python bench/recall_eval.py --url http://127.0.0.1:8000   # a running memproxy
    python bench/recall_eval.py --approximate --distractors 50000   # IVFs among 50k more
    python bench/recall_eval.py --approximate --distractors 20000 --recombined   # of one life

Evidence ids are normalised ("D30:05" -> "D30:5", "D:11:26" -> "D11:26", "D9:1 D4:4" split);
ids naming no turn are dropped and counted; a question left with none is skipped and counted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from datetime import UTC, datetime
from itertools import chain
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DEFAULT_DATA = ROOT.parent / "shared" / "data" / "locomo_dev.json"
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
KS = (1, 5, 10, 20)


def turns_of(conversation: dict[str, Any]) -> list[tuple[str, str]]:
    """(dia_id, memory text) for every turn, sessions in order."""
    return [(dia, text) for dia, text, _ in dated_turns_of(conversation)]


def session_time(text: str) -> datetime | None:
    """A LoCoMo session's date ("1:56 pm on 8 May, 2023"), as UTC; None when not in that form."""
    try:
        return datetime.strptime(text.strip(), "%I:%M %p on %d %B, %Y").replace(tzinfo=UTC)
    except ValueError:
        return None


def dated_turns_of(conversation: dict[str, Any]) -> list[tuple[str, str, datetime | None]]:
    """(dia_id, memory text, when the session was) for every turn, sessions in order."""
    sessions = sorted(
        (int(m.group(1)), key)
        for key in conversation
        if (m := re.fullmatch(r"session_(\d+)", key)) and isinstance(conversation[key], list)
    )
    out = []
    for number, key in sessions:
        date = conversation.get(f"session_{number}_date_time", "")
        for turn in conversation[key]:
            text = f"[{date}] {turn['speaker']}: {turn['text']}"
            if turn.get("blip_caption"):
                text += f" (shares photo: {turn['blip_caption']})"
            out.append((turn["dia_id"], text, session_time(date)))
    return out


def normalise_evidence(raw: list[str], known: set[str]) -> tuple[list[str], int]:
    ids, dropped = [], 0
    for item in raw:
        for part in re.split(r"[\s;,]+", item.strip()):
            if not part:
                continue
            m = re.fullmatch(r"D:?(\d+):0*(\d+)", part)
            fixed = f"D{m.group(1)}:{m.group(2)}" if m else part
            if fixed in known:
                ids.append(fixed)
            else:
                dropped += 1
    return list(dict.fromkeys(ids)), dropped


async def evaluate(
    client: httpx.AsyncClient,
    data: list[dict[str, Any]],
    approximate: Callable[[str, str], Awaitable[str]] | None = None,
    crowd: Callable[[str, dict[str, Any]], Awaitable[None]] | None = None,
) -> dict[str, dict[str, Any]]:
    """Each conversation imported, then its questions searched: with `approximate` (given the
    user, it makes their index approximate and says how), once as is and once after it, so
    both are measured on the same memories; `crowd` adds memories to the user's after the
    import (--distractors)."""
    rounds = ["exhaustive", *VARIANTS] if approximate else ["as is"]
    results: dict[str, dict[str, Any]] = {
        name: {"questions": [], "latencies": [], "dropped_evidence": 0, "skipped_questions": 0}
        for name in rounds
    }
    import_seconds = 0.0
    imported = 0
    for sample in data:
        user_id = f"locomo-{sample['sample_id']}-{uuid.uuid4().hex[:6]}"
        user = {"X-User-Id": user_id}
        turns = dated_turns_of(sample["conversation"])
        id_to_dia: dict[str, str] = {}
        started = time.perf_counter()
        for start in range(0, len(turns), 1000):
            chunk = turns[start : start + 1000]
            body = {"memories": [
                {"content": text, "metadata": {"dia_id": d}}
                | ({"observed_at": said.isoformat()} if said else {})
                for d, text, said in chunk
            ]}  # fmt: skip
            response = await client.post("/v1/memories/batch", json=body, headers=user)
            response.raise_for_status()
            for memory, (dia, _, _) in zip(response.json()["data"], chunk, strict=True):
                id_to_dia[memory["id"]] = dia
        import_seconds += time.perf_counter() - started
        imported += len(turns)
        if crowd is not None:
            await crowd(user_id, sample)
        known = {d for d, _, _ in turns}
        for name in rounds:
            if name in VARIANTS and approximate is not None:
                print(f"  {sample['sample_id']}, {name}: {await approximate(user_id, name)}")
            result = results[name]
            for qa in sample["qa"]:
                category = int(qa.get("category", 0))
                if category not in CATEGORIES:
                    continue
                evidence, lost = normalise_evidence(qa.get("evidence", []), known)
                result["dropped_evidence"] += lost
                if not evidence:
                    result["skipped_questions"] += 1
                    continue
                started = time.perf_counter()
                response = await client.post(
                    "/v1/memories/search",
                    json={"query": qa["question"], "limit": max(KS), "min_score": 0},
                    headers=user,
                )
                result["latencies"].append(time.perf_counter() - started)
                response.raise_for_status()
                # a memory not of the conversation (--distractors) is no evidence
                ranked = [id_to_dia.get(h["id"], "") for h in response.json()["data"]]
                recall = {k: len(set(ranked[:k]) & set(evidence)) / len(evidence) for k in KS}
                first = next((i for i, d in enumerate(ranked) if d in evidence), None)
                result["questions"].append(
                    (category, recall, 0.0 if first is None else 1.0 / (first + 1))
                )
    for result in results.values():
        result.update(imported=imported, import_seconds=import_seconds)
    return results


VARIANTS = {
    "ivf sqrt(n) lists, 1/16 probed": (1.0, 16),
    "ivf sqrt(n) lists, 1/8 probed": (1.0, 8),
    "ivf sqrt(n) lists, 1/4 probed": (1.0, 4),
    "ivf 4 sqrt(n) lists, 1/16 probed": (4.0, 16),
    "ivf 4 sqrt(n) lists, 1/8 probed": (4.0, 8),
}
"""(lists per square root of the vectors, the share of them probed): each variant's IVF is
trained on all of the user's vectors, as a user past MEMPROXY_INDEX_IVF_MIN_VECTORS gets it."""


def approximating(cache: Any, probe_min: int) -> Callable[[str, str], Awaitable[str]]:
    """What makes a user's index an IVF of a variant, probing at least `probe_min` lists."""
    from app.memory.search import ivf

    ivf.PROBE_MIN = probe_min

    async def approximate(user_id: str, variant: str) -> str:
        ivf.LISTS_PER_ROOT, ivf.PROBED_SHARE = VARIANTS[variant]
        kept, cache.upkeep.ivf_min = cache.upkeep.ivf_min, 1
        cache.forget(user_id)
        entry = await cache.get(user_id)
        await cache.settled()
        cache.upkeep.ivf_min = kept
        index = entry.vectors._index
        assert entry.vectors.approximate, "no approximate index"
        return f"IVF of {index.ntotal} vectors, {index.nprobe} of {index.nlist} lists probed"

    return approximate


async def crowding(
    service: Any, count: int, recombine: bool = False
) -> Callable[[str, dict[str, Any]], Awaitable[None]]:
    """What adds `count` sentences of prose (embedded here, once) to a user's memories, or with
    `recombine`, `count` memories recombined from the user's conversation (bench/_data.py)."""
    from dataclasses import replace

    from app.memory.search.parts import embed_for_store
    from app.memory.store.records import NewMemory
    from bench._data import prose, recombined

    async def embedded(texts: list[str]) -> list[Any]:
        started = time.perf_counter()
        vectors = await embed_for_store(service.embedder, texts)
        print(f"{count:,} distractors embedded in {time.perf_counter() - started:.0f} s")
        return [replace(NewMemory(content=t), embedding=e.embedding, embedding_model=e.model)
                for t, e in zip(texts, vectors, strict=True)]  # fmt: skip

    shared = [] if recombine else await embedded(prose(count))

    async def crowd(user_id: str, sample: dict[str, Any]) -> None:
        items = shared
        if recombine:  # no turn a question cites, read as the questions' evidence is
            known = {d for d, _, _ in dated_turns_of(sample["conversation"])}
            evidence = (normalise_evidence(qa.get("evidence", []), known)[0] for qa in sample["qa"])
            items = await embedded(recombined(sample, set(chain.from_iterable(evidence)), count))
        for start in range(0, len(items), 5000):
            await service.store.add(user_id, items[start : start + 5000])
        service.cache.forget(user_id)  # built again from the rows, then made approximate
        await service.cache.get(user_id)  # when past MEMPROXY_INDEX_IVF_MIN_VECTORS: before
        await service.cache.settled()  # the questions, not in the middle of them

    return crowd


def report(result: dict[str, Any]) -> None:
    questions = result["questions"]
    groups: dict[str, list[tuple[int, dict[int, float], float]]] = defaultdict(list)
    for item in questions:
        groups["all"].append(item)
        groups[CATEGORIES[item[0]]].append(item)
    print(
        f"{'subset':<12} {'n':>4} " + " ".join(f"{'R@' + str(k):>6}" for k in KS) + f" {'MRR':>6}"
    )
    for name in ["all", *CATEGORIES.values()]:
        items = groups.get(name, [])
        if not items:
            continue
        recalls = " ".join(f"{statistics.fmean(r[k] for _, r, _ in items):6.3f}" for k in KS)
        mrr = statistics.fmean(m for _, _, m in items)
        print(f"{name:<12} {len(items):>4} {recalls} {mrr:6.3f}")
    lat = sorted(result["latencies"])
    p50 = lat[len(lat) // 2] * 1000
    p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000
    print(
        f"search latency over HTTP: p50 {p50:.1f} ms, p99 {p99:.1f} ms ({len(lat)} queries); "
        f"import {result['imported']} memories in {result['import_seconds']:.1f} s "
        f"({result['imported'] / max(result['import_seconds'], 1e-9):.0f}/s)"
    )
    print(
        f"evidence ids dropped (naming no turn): {result['dropped_evidence']}; "
        f"questions skipped (no evidence left): {result['skipped_questions']}"
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--url", help="a running memproxy (default: an in-process app)")
    parser.add_argument("--key", help="bearer key for --url")
    parser.add_argument("--dense-weight", type=float, help="MEMPROXY_DENSE_WEIGHT for the app")
    parser.add_argument(
        "--quantize", choices=["queries", "all", "none"], default="queries",
        help="MEMPROXY_EMBEDDING_QUANTIZE: which texts the int8 export embeds",
    )  # fmt: skip
    parser.add_argument("--model", default="", help="MEMPROXY_EMBEDDING_MODEL (a local folder)")
    parser.add_argument(
        "--approximate", action="store_true",
        help="in process: each user's questions searched again once their index is made an IVF "
        "(app/memory/search/ivf.py) probing the share of its lists a 100,000-memory user's "
        "probes (--probe-min 1: ceil(lists / 16) of them)",
    )  # fmt: skip
    parser.add_argument("--probe-min", type=int, default=1, help="with --approximate")
    parser.add_argument(
        "--distractors", type=int, default=0,
        help="in process: each user also holds this many sentences of English prose (the "
        "docstrings of the installed packages), embedded once, stored as the model's (past "
        "MEMPROXY_INDEX_IVF_MIN_VECTORS, searched through an IVF, as a user's would be)",
    )  # fmt: skip
    parser.add_argument(
        "--recombined", action="store_true",
        help="with --distractors: each user's are their conversation's own sentences "
        "recombined (none from a cited turn): the same people and topics, near the questions",
    )  # fmt: skip
    args = parser.parse_args()
    data = json.loads(args.data.read_text())

    async with AsyncExitStack() as stack:
        if args.url:
            headers = {"Authorization": f"Bearer {args.key}"} if args.key else {}
            client = await stack.enter_async_context(
                httpx.AsyncClient(base_url=args.url, headers=headers, timeout=300)
            )
            print(f"memproxy at {args.url}")
        else:
            from app.config import Settings
            from app.main import create_app

            folder = stack.enter_context(tempfile.TemporaryDirectory())
            overrides: dict[str, Any] = {
                "database_url": f"sqlite+aiosqlite:///{folder}/eval.db",
                "embedding_quantize": args.quantize,
                "embedding_model": args.model,
                "embedding_cache_dir": str(ROOT / "data" / "models"),
            }
            if args.dense_weight is not None:
                overrides["dense_weight"] = args.dense_weight
            if args.approximate:  # each variant trains its own IVF, not one restored from an image
                overrides["index_image_min_memories"] = 0
                overrides["index_ivf_min_vectors"] = 0  # and the first round is exhaustive
            settings = Settings(**overrides)
            app = create_app(settings)
            await stack.enter_async_context(app.router.lifespan_context(app))
            client = await stack.enter_async_context(
                httpx.AsyncClient(
                    transport=httpx.ASGITransport(app=app), base_url="http://localhost", timeout=300
                )
            )
            print(
                f"in-process memproxy: embedder {app.state.services.memory.embedder.model_name}, "
                f"dense weight {settings.dense_weight}"
            )
        print(f"data: {args.data} ({len(data)} conversations)")
        approximate = None
        if args.approximate and not args.url:
            approximate = approximating(app.state.services.memory.cache, args.probe_min)
        crowd = None
        if args.distractors and not args.url:
            crowd = await crowding(app.state.services.memory, args.distractors, args.recombined)
        for name, result in (await evaluate(client, data, approximate, crowd)).items():
            print(f"--- {name}")
            report(result)


if __name__ == "__main__":
    asyncio.run(main())
