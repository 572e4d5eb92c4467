"""Contextual enrichment, measured: evidence recall over a user's episodes found by their words,
against the same episodes found by their words and the sentence of context the idle work gives
them (app/memory/learning/enrichment.py: its prompt, its checks, its key), with a real model.

For each LoCoMo conversation and each speaker in turn as the user (``--speaker``), every session
is one exchange: the user's turns of it become episodes (their words, a shared photo's caption
kept, as the learning path keeps them), said on the session's day, written together. Two users
of one in-process memproxy hold them: one plain, one whose every episode's index key is its
words then the session's context sentence, which the model (``--model``, a llama-server of
bench/llm_server.py) writes from the session's episodes, once per session (``--contexts`` keeps
them in a file, for a run without the model). The LoCoMo questions of categories 1-4 whose
evidence some of the user's turns are, with the user's name taken out ("Caroline's" ->
"their": memproxy's users ask about themselves, and the episodes do not name them), are searched
in both (``MemoryService.search``, limit 10, min score 0): evidence-session recall at 5 and 10,
as bench/manager_eval.py counts it, and how many contexts the checks refused.

    .venv/bin/python bench/enrichment_eval.py --model qwen1.5b --speaker both
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
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.config import Settings  # noqa: E402
from app.main import create_app  # noqa: E402
from app.memory.learning.enrichment import (  # noqa: E402
    ANSWER_TOKENS,
    INSTRUCTIONS,
    Context,
    context_prompt,
    kept_context,
)
from app.memory.learning.manager import (  # noqa: E402
    Manager,
    ManagerAnswerUnusable,
    build_http_client,
)
from app.memory.search.parts import embed_for_store, with_context  # noqa: E402
from app.memory.service import MemoryService  # noqa: E402
from app.memory.store.records import MemoryRecord, NewMemory  # noqa: E402
from app.memory.store.tables import MemorySource, MemoryType  # noqa: E402
from app.memory.store.upkeep import Keyed, rekeyed  # noqa: E402
from bench.llm_server import start_server  # noqa: E402
from bench.manager_eval import (  # noqa: E402
    KS,
    Session,
    questions_of,
    ranked_sessions,
    score,
    sessions_of,
    without_name,
)
from bench.recall_eval import DEFAULT_DATA  # noqa: E402


async def contexts_for(
    data: list[dict[str, Any]], speakers: list[str], model: str, threads: int
) -> dict[str, str | None]:
    """Each (conversation, user, session)'s context sentence as the checks leave it (None:
    refused), asked of `model`."""
    out: dict[str, str | None] = {}
    server = await asyncio.to_thread(start_server, model, parallel=1, ctx_size=8192,
                                     threads=threads)  # fmt: skip
    with server:
        settings = Settings(upstream_base_url=server.base_url, manager_model=server.alias,
                            manager_temperature=0, manager_output_mode="json_schema")  # fmt: skip
        http = build_http_client(settings)
        manager = Manager(settings, http_client=http)
        try:
            for sample in data:
                for which in speakers:
                    user = sample["conversation"][f"speaker_{which}"]
                    for session in sessions_of(sample, user, None):
                        texts = episodes_of(session, user)
                        if not texts:
                            continue
                        prompt = context_prompt(session.when, texts)
                        try:  # as the idle work asks it
                            answer = (
                                await manager.ask(
                                    server.alias,
                                    Context,
                                    INSTRUCTIONS,
                                    prompt,
                                    max_tokens=ANSWER_TOKENS,
                                )
                            ).context
                        except ManagerAnswerUnusable as exc:
                            answer = f"(unusable: {exc})"
                        kept = kept_context(answer, session.when, texts)
                        out[f"{sample['sample_id']}/{user}/{session.number}"] = kept
                        print(f"  {sample['sample_id']} {user} session {session.number}: "
                              f"{kept or 'REFUSED: ' + answer}", flush=True)  # fmt: skip
        finally:
            await http.aclose()
    return out


async def enrich(
    service: MemoryService, user_id: str, records: list[MemoryRecord], context: str
) -> None:
    """Give these memories `context` as the idle work does (its key, its vectors, its write)."""
    keys = [with_context(r.content, context) for r in records]
    vectors = await embed_for_store(service.embedder, keys)
    read = [Keyed(r.id, r.content, r.content, r.created_at, r.observed_at, 0) for r in records]
    async with service.store.writing(user_id, MemorySource.UPKEEP) as w:
        await rekeyed(w, [(k, key, v.embedding, v.model)
                          for k, key, v in zip(read, keys, vectors, strict=True)])  # fmt: skip


def episodes_of(session: Session, user: str) -> list[str]:
    return [t.text for t in session.turns if t.speaker == user]


async def measure(
    service: MemoryService, data: list[dict[str, Any]], speakers: list[str],
    contexts: dict[str, str | None],
) -> dict[str, dict[int, list[float]]]:  # fmt: skip
    recall: dict[str, dict[int, list[float]]] = {
        name: {k: [] for k in KS} for name in ("plain", "enriched")
    }
    for sample in data:
        for which in speakers:
            user = sample["conversation"][f"speaker_{which}"]
            sessions = sessions_of(sample, user, None)
            sessions_of_memory: dict[str, dict[str, set[int]]] = {"plain": {}, "enriched": {}}
            for name in ("plain", "enriched"):
                for session in sessions:
                    texts = episodes_of(session, user)
                    context = contexts.get(f"{sample['sample_id']}/{user}/{session.number}")
                    items = [NewMemory(text, type=MemoryType.EPISODE, observed_at=session.when)
                             for text in texts]  # fmt: skip
                    owner = f"{sample['sample_id']}-{user}-{name}"
                    written = await service.add(owner, items)
                    if name == "enriched" and context is not None:
                        await enrich(service, owner, written.records, context)
                    for record in written.records:
                        sessions_of_memory[name][record.id] = {session.number}
            for qa, evidence in questions_of(sample, sessions, user):
                question = without_name(qa["question"], user)
                for name in ("plain", "enriched"):
                    ranked = await ranked_sessions(
                        service, f"{sample['sample_id']}-{user}-{name}", question,
                        sessions_of_memory[name],
                    )  # fmt: skip
                    got, _ = score(ranked, evidence, str(qa["answer"]))
                    for k in KS:
                        recall[name][k].append(got[k])
    return recall


async def main(args: argparse.Namespace) -> None:
    started = time.perf_counter()
    data = json.loads(args.data.read_text())
    speakers = ["a", "b"] if args.speaker == "both" else [args.speaker]
    if args.contexts and args.contexts.exists():
        contexts = json.loads(args.contexts.read_text())
        print(f"contexts read from {args.contexts}")
    else:
        contexts = await contexts_for(data, speakers, args.model, args.threads)
        if args.contexts:
            args.contexts.write_text(json.dumps(contexts, indent=1, ensure_ascii=False))
    async with AsyncExitStack() as stack:
        folder = stack.enter_context(tempfile.TemporaryDirectory())
        settings = Settings(database_url=f"sqlite+aiosqlite:///{folder}/eval.db",
                            embedding_cache_dir=str(ROOT / "data" / "models"),
                            manager_enabled=False, upstream_check_at_start=False,
                            log_level="WARNING")  # fmt: skip
        app = create_app(settings)
        await stack.enter_async_context(app.router.lifespan_context(app))
        recall = await measure(app.state.services.memory, data, speakers, contexts)
    refused = sum(v is None for v in contexts.values())
    print(f"\n{len(contexts)} sessions' contexts, {refused} refused by the checks "
          f"({args.model}); questions: {len(recall['plain'][5])}")  # fmt: skip
    print(f"{'episodes found by':<28} {'R@5':>6} {'R@10':>6}")
    for name, label in (("plain", "their words"), ("enriched", "their words + context")):
        print(f"{label:<28} {statistics.fmean(recall[name][5]):6.3f} "
              f"{statistics.fmean(recall[name][10]):6.3f}")  # fmt: skip
    print(f"wall time {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--model", default="qwen1.5b")
    parser.add_argument("--speaker", choices=["a", "b", "both"], default="both")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--contexts", type=Path, help="a JSON file of the contexts: read if there")
    asyncio.run(main(parser.parse_args()))
