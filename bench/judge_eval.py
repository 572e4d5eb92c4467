"""The relevance judge, measured with a real small model: what it changes and what it costs.

One in-process memproxy (the bundled embedder) and a llama-server (bench/llm_server.py) as the
Manager's model. Two sets, each recalled as a chat is (``MemoryService.recall``: the relevance
threshold, 8 memories, the token budget), once without the judge and once with it
(app/memory/chat/judge.py, its prompt and its rules):

- **implicit cases** (bench/implicit_cases.txt): one user holds 24 memories; for each message
  that implies one of them without naming it, whether that memory is in what the chat is shown;
- **LoCoMo** (the dev file, the first ``--questions`` questions of categories 1-4): every turn
  a memory of one user (``[date] Speaker: text``, as bench/recall_eval.py writes them); the
  share of each question's evidence turns among the memories shown.

The time each judged recall took beyond the plain one is what the judge adds to a chat's first
byte: printed as p50 / p90 / max, with how many answers came within the time box (``--seconds``,
default MEMPROXY_RECALL_JUDGE_SECONDS) and how many the box cut (the search's order stood).

    .venv/bin/python bench/judge_eval.py --model qwen0.5b --seconds 1
    .venv/bin/python bench/judge_eval.py --model qwen1.5b --seconds 30   # what it picks, unhurried
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from contextlib import AsyncExitStack
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.config import Settings  # noqa: E402
from app.main import create_app  # noqa: E402
from app.memory.chat.judge import RecallJudge  # noqa: E402
from app.memory.learning.manager import Manager, build_http_client  # noqa: E402
from app.memory.service import MemoryService  # noqa: E402
from app.memory.store.records import NewMemory  # noqa: E402
from app.metrics import Metrics  # noqa: E402
from bench.llm_server import start_server  # noqa: E402
from bench.recall_eval import (  # noqa: E402
    CATEGORIES,
    DEFAULT_DATA,
    dated_turns_of,
    normalise_evidence,
)

CASES = ROOT / "bench" / "implicit_cases.txt"


def implicit_cases() -> tuple[list[str], list[tuple[str, str]]]:
    """The user's memories, and (message, the memory it implies), of implicit_cases.txt."""
    memories, cases = [], []
    for line in CASES.read_text().splitlines():
        if line.startswith("memory | "):
            memories.append(line.split(" | ", 1)[1])
        elif line.startswith("case | "):
            _, message, memory = line.split(" | ")
            cases.append((message, memory))
            memories.append(memory)
    return memories, cases


class Timed:
    """The judge, timed: each call's seconds, and how it ended."""

    def __init__(self, judge: RecallJudge, metrics: Metrics) -> None:
        self.judge = judge
        self.metrics = metrics
        self.seconds: list[float] = []

    async def recall(
        self, service: MemoryService, settings: Settings, user: str, query: str, model: str
    ) -> tuple[list[str], list[str], float]:
        """What a chat is shown without the judge and with it (contents), and the time the
        judged recall took beyond the plain one."""
        args: dict[str, Any] = {
            "limit": settings.recall_limit, "min_score": settings.relevance_threshold,
            "budget_tokens": settings.memory_token_budget,
        }  # fmt: skip
        started = time.perf_counter()
        plain = await service.recall(user, query, **args)
        middle = time.perf_counter()
        judged = await service.recall(user, query, judge=self.judge.for_chat(user, model), **args)
        added = (time.perf_counter() - middle) - (middle - started)
        self.seconds.append(added)
        return [h.content for h in plain.hits], [h.content for h in judged.hits], added


def outcomes(metrics: Metrics) -> dict[str, int]:
    found: dict[str, int] = {}
    for metric in metrics.recall_judge.collect():
        for sample in metric.samples:
            if sample.name.endswith("_total"):
                found[str(sample.labels["outcome"])] = int(sample.value)
    return found


async def main(args: argparse.Namespace) -> None:
    started = time.perf_counter()
    server = await asyncio.to_thread(start_server, args.model, parallel=1, ctx_size=8192,
                                     threads=args.threads)  # fmt: skip
    with server, tempfile.TemporaryDirectory() as folder:
        settings = Settings(
            database_url=f"sqlite+aiosqlite:///{folder}/eval.db",
            embedding_cache_dir=str(ROOT / "data" / "models"), manager_enabled=False,
            upstream_check_at_start=False, log_level="WARNING",
            upstream_base_url=server.base_url, manager_model=server.alias,
            manager_temperature=0, recall_judge=True, recall_judge_seconds=args.seconds,
        )  # fmt: skip
        async with AsyncExitStack() as stack:
            app = create_app(settings)
            await stack.enter_async_context(app.router.lifespan_context(app))
            service: MemoryService = app.state.services.memory
            http = build_http_client(settings)
            stack.push_async_callback(http.aclose)
            metrics = Metrics()
            timed = Timed(RecallJudge(Manager(settings, http_client=http), settings, metrics),
                          metrics)  # fmt: skip
            # implicit cases
            memories, cases = implicit_cases()
            await service.add("implicit", [NewMemory(m) for m in memories])
            await service.search("implicit", "warm up", limit=1, min_score=0.0)  # index built
            found = {"plain": 0, "judged": 0}
            for message, memory in cases:
                plain, judged, added = await timed.recall(service, settings, "implicit",
                                                          message, server.alias)  # fmt: skip
                found["plain"] += memory in plain
                found["judged"] += memory in judged
                print(
                    f"  {added * 1000:6.0f} ms  {'+' if memory in plain else '-'}"
                    f"{'+' if memory in judged else '-'}  {message} -> {memory}",
                    flush=True,
                )
            # LoCoMo
            recall: dict[str, list[float]] = {"plain": [], "judged": []}
            asked = 0
            for sample in json.loads(args.data.read_text()):
                turns = dated_turns_of(sample["conversation"])
                user = f"locomo-{sample['sample_id']}"
                items = [NewMemory(text, observed_at=said or datetime.now(UTC))
                         for _, text, said in turns]  # fmt: skip
                written = await service.add(user, items)
                dia_of = {r.content: d for r, (d, _, _) in zip(written.records, turns, strict=True)}
                known = {d for d, _, _ in turns}
                await service.search(user, "warm up", limit=1, min_score=0.0)  # index built
                for qa in sample["qa"]:
                    if asked >= args.questions or int(qa.get("category", 0)) not in CATEGORIES:
                        continue
                    evidence, _ = normalise_evidence(qa.get("evidence", []), known)
                    if not evidence:
                        continue
                    asked += 1
                    plain, judged, _ = await timed.recall(service, settings, user,
                                                          qa["question"], server.alias)  # fmt: skip
                    for name, shown in (("plain", plain), ("judged", judged)):
                        got = {dia_of.get(c) for c in shown}
                        recall[name].append(len(got & set(evidence)) / len(evidence))
    seconds = sorted(timed.seconds)
    counted = outcomes(metrics)
    print(f"\nmodel {args.model}, time box {args.seconds} s; judge outcomes: {counted}")
    print(f"implicit cases: the implied memory shown {found['plain']}/{len(cases)} without the "
          f"judge, {found['judged']}/{len(cases)} with it")  # fmt: skip
    print(f"LoCoMo ({asked} questions): evidence among the memories shown "
          f"{statistics.fmean(recall['plain']):.3f} without, "
          f"{statistics.fmean(recall['judged']):.3f} with the judge")  # fmt: skip
    print(f"added to recall (a chat's first byte): p50 {seconds[len(seconds) // 2] * 1000:.0f} "
          f"ms, p90 {seconds[int(len(seconds) * 0.9)] * 1000:.0f} ms, max "
          f"{seconds[-1] * 1000:.0f} ms over {len(seconds)} recalls")  # fmt: skip
    print(f"wall time {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--model", default="qwen1.5b")
    parser.add_argument("--seconds", type=float, default=1.0, help="the judge's time box")
    parser.add_argument("--questions", type=int, default=100, help="LoCoMo questions asked")
    parser.add_argument("--threads", type=int, default=2)
    asyncio.run(main(parser.parse_args()))
