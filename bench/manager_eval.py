"""How well the Manager turns LoCoMo chats into memories, with a real small model.

The Manager runs through memproxy's own pipeline, on LoCoMo-format conversations.

For each conversation, one speaker is the user and the other the assistant (``--speaker a``: the
first speaker is the user). Each session, in order, is one Manager job, as the worker runs one:
the user's memories most related to the session's user turns are shown (the worker's search:
the user turns joined, the last 2,000 characters, ``MemoryService.search``, limit 20), all the
session's turns are new (no context), ``now`` is the session's date, and the operations are
applied by the real ``Applier`` (dedup threshold 0.9) to a real ``MemoryService`` (the app's own
lifespan: a temporary SQLite database, the bundled embedder). A session whose prompt would not
fit an 8k context is passed in chunks of at most 30 turns, each with the 6 turns before it as
context (the output says how many sessions were split; LoCoMo's fit whole). A photo a turn shares
is written into its text, ``[shares a photo: <caption>]``. Every run ends by itself: each job is
bounded by ``--job-timeout`` (the Manager's own job timeout), the llama-server is stopped at the
end (and at exit).

What is printed, per model and output mode (all conversations and speakers together):

- answers: jobs, usable (parse success: the Manager returned operations), unusable (its answer
  did not fit, through the retry), unavailable (an HTTP error or a timeout; e.g. a retry beyond
  the context), the operations' outcomes (created, updated, deleted, unchanged: an UPDATE
  restating the memory, duplicate, ungrounded: not the user's words, refused, failed), and
  seconds per session (the Manager's calls and the applying, p50 and max);
- memories: the user's memories at the end, per session; the user's gold observations (LoCoMo's
  ``session_N_observation``) recovered: a gold fact counts when some final memory has a cosine
  >= the threshold with it (the bundled embedder, whole texts), with the user's name taken out of
  the gold fact first ("Caroline's" -> "their", "Caroline" -> ""), since memories are written
  without it (and "the user" out of the memory, the same way): a name on one side only costs
  0.05-0.1 of cosine. Swept at 0.5 / 0.6 / 0.7; 0.6 is the default, the one to quote: on
  hand-made pairs, paraphrases of a gold fact score 0.57-0.80 and unrelated facts of the same
  person below 0.4;
- non-facts, among the memories written (created or updated): ``assistant`` (its best cosine
  match among the session's turns is an assistant turn, not a user turn, and fewer than half of
  its words, stemmed, are the user's in the session: the other person's words stored as the
  user's; a fact the user told and the other speaker echoed is closer to the echo, and is
  not counted), ``1st person`` (I, I'm, me, my, mine, we, our, us...: not in the
  third person), ``phrases`` (assistant talk: "I'm sorry", "as an AI", "let me know", "happy to
  help", "feel free", "the assistant"...), ``question`` (ends with "?"), ``echo`` (the prompt
  copied: a line starting "USER:" or "ASSISTANT:", or a heading of the prompt such as "Current
  date and time:"), and ``any`` of those; ``clean@.6``: the gold facts recovered at 0.6 by
  memories without any of these flags (echoed transcript lines match gold facts well);
  ``dup pairs``: pairs of final memories with cosine >= 0.9 (the dedup threshold);
  ``upd`` / ``unrel``: UPDATEs applied, and those whose new text has a cosine < 0.4 with the
  memory it replaced (an unrelated memory overwritten);
- downstream: the LoCoMo questions of categories 1-4 whose evidence lies in the sessions
  processed and includes a turn of the user speaker, searched in the user's memories with
  ``MemoryService.search`` (min_score 0, as bench/recall_eval.py). Each memory remembers the
  sessions it was written from (created in, and updated in). Evidence recall@k is the share of
  the question's evidence *sessions* covered by the sessions of the top-k memories, averaged
  over questions; ``ans@5``: the share of questions whose answer string appears (case-folded)
  in the top-5 memories' text. The same questions against the raw turns of the same sessions
  (each turn one memory, as in bench/recall_eval.py; session-level too) give the baseline row.
  With few sessions and few memories, R@10 is near 1 by construction: compare with the baseline.

    .venv/bin/python bench/manager_eval.py                           # qwen1.5b, json_schema, all
    .venv/bin/python bench/manager_eval.py --models qwen1.5b,qwen0.5b --modes json_schema,prompted
    .venv/bin/python bench/manager_eval.py --conversations conv-26 --sessions 3 --speaker a \\
        --json /tmp/manager.json                                      # a quick slice, raw answers

``--json`` writes every job: the prompt, each raw answer of the model with its tokens and
seconds (on a retry, what was sent back too), the operations, their outcomes and checks; the
final memories, each gold fact with its best memory, each question with its top 10. The models
are bench/llm_server.py's (installed with its ``install`` and ``model`` commands); one
llama-server at a time, one slot (``-np 1``), an 8,192-token context. On the idle 2-core machine
the 1.5B takes 55-150 s a session (up to 1,024 tokens of answer at ~13 tokens/s), so a whole
conversation (19-25 sessions) takes 30-50 min per model and mode; beside another busy process,
jobs can reach ``--job-timeout``. Figures go in docs/performance.md.
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
from collections import Counter
from collections.abc import Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx2
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.config import Settings  # noqa: E402
from app.main import create_app  # noqa: E402
from app.memory.learning.after_model import after_model  # noqa: E402
from app.memory.learning.applier import Applied, Applier  # noqa: E402
from app.memory.learning.consolidation import Consolidation, Tidied  # noqa: E402
from app.memory.learning.decisions import Op, Operation  # noqa: E402
from app.memory.learning.extraction import CONTEXT_TURNS  # noqa: E402
from app.memory.learning.grounding import Grounds, with_requests  # noqa: E402
from app.memory.learning.manager import (  # noqa: E402
    Manager,
    ManagerAnswerUnusable,
    ManagerUnavailable,
    build_http_client,
)
from app.memory.learning.prompt import Shown, build_prompt, instructions  # noqa: E402
from app.memory.learning.shown import ShownMemories  # noqa: E402
from app.memory.learning.turns import Role, turn  # noqa: E402
from app.memory.search.lexical import Analyzer  # noqa: E402
from app.memory.service import MemoryService  # noqa: E402
from app.memory.store.records import NewMemory  # noqa: E402
from bench.llm_server import start_server  # noqa: E402
from bench.recall_eval import CATEGORIES, DEFAULT_DATA, normalise_evidence  # noqa: E402
from bench.recall_eval import turns_of as raw_turns_of  # noqa: E402

MODES = ("json_schema", "tool", "prompted", "auto")
THRESHOLDS = (0.5, 0.6, 0.7)
DEFAULT_THRESHOLD = 0.6
UNRELATED_UPDATE = 0.4
CTX_SIZE = 8192
CHUNK_TURNS = 30
SCHEMA_ALLOWANCE = 1000
"""Tokens kept for what the prompt does not show: the chat template, a tool's or the prompted
mode's schema."""
CHARS_PER_TOKEN = 3.0  # conservative for English (the app's own estimate is 4)
KS = (5, 10)

FIRST_PERSON = re.compile(r"(?<![\w'’])(?:I|I['’](?:m|ve|d|ll)|[Mm]e|[Mm]y|[Mm]ine|[Mm]yself"
                          r"|[Ww]e|[Oo]ur|[Oo]urs|[Uu]s)(?![\w'’-])")  # fmt: skip
"""A word of the first person; not "me-time" (a noun)."""
ECHO = re.compile(
    r"^\s*(?:USER|ASSISTANT)\s*:|Current date and time:|Existing memories:|The new exchange"
    r"|Earlier in the conversation"
)
"""The prompt copied into a memory: a transcript line, or one of the prompt's headings."""
ASSISTANT_PHRASES = re.compile(
    r"\b(?:I['’]m sorry|I am sorry|as an AI|language model|happy to help|glad to help"
    r"|let me know|feel free|how can I help|I['’]d be happy|I['’]m here|the assistant)\b",
    re.IGNORECASE,
)


# --- the data ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Turn:
    dia_id: str
    speaker: str
    role: Role
    text: str


@dataclass(frozen=True, slots=True)
class Session:
    number: int
    when: datetime
    turns: list[Turn]
    gold: list[tuple[str, str]]
    """The user's gold observations: (fact, dia_id)."""


def sessions_of(sample: dict[str, Any], user: str, limit: int | None) -> list[Session]:
    """The conversation's sessions in order, seen with `user` as the user."""
    conversation = sample["conversation"]
    numbers = sorted(
        int(m.group(1))
        for key in conversation
        if (m := re.fullmatch(r"session_(\d+)", key)) and isinstance(conversation[key], list)
    )
    observations = sample.get("observation", {})
    out = []
    for number in numbers[:limit]:
        when = datetime.strptime(
            conversation[f"session_{number}_date_time"], "%I:%M %p on %d %B, %Y"
        ).replace(tzinfo=UTC)
        turns = []
        for item in conversation[f"session_{number}"]:
            text = item["text"]
            if item.get("blip_caption"):
                text += f" [shares a photo: {item['blip_caption']}]"
            role: Role = "user" if item["speaker"] == user else "assistant"
            turns.append(Turn(item["dia_id"], item["speaker"], role, text))
        gold = observations.get(f"session_{number}_observation", {}).get(user, [])
        out.append(Session(number, when, turns, [(str(f), str(d)) for f, d in gold]))
    return out


def without_name(text: str, name: str) -> str:
    """`text` without `name` ("Caroline's" -> "their", "Caroline" -> ""): gold facts name the
    user, memories are written without a name (or with "the user", taken out the same way)."""
    text = re.sub(rf"\b{re.escape(name)}['’]s\b", "their", text, flags=re.IGNORECASE)
    return " ".join(re.sub(rf"\b{re.escape(name)}\b", "", text, flags=re.IGNORECASE).split())


def session_of(dia_id: str) -> int:
    return int(dia_id[1:].split(":")[0])


# --- the model's raw answers ------------------------------------------------------------------


class Recorder:
    """Every request the Manager's HTTP client sends and the answer it gets (httpx event hooks:
    `decide` keeps only the operations, or the last answer of an unusable job)."""

    def __init__(self, client: httpx2.AsyncClient) -> None:
        self.exchanges: list[dict[str, Any]] = []
        self._started: dict[int, float] = {}
        client.event_hooks = {"request": [self._request], "response": [self._response]}

    def take(self) -> list[dict[str, Any]]:
        taken, self.exchanges = self.exchanges, []
        return taken

    async def _request(self, request: httpx2.Request) -> None:
        self._started[id(request)] = time.perf_counter()

    async def _response(self, response: httpx2.Response) -> None:
        await response.aread()
        started = self._started.pop(id(response.request), time.perf_counter())
        entry: dict[str, Any] = {
            "status": response.status_code,
            "seconds": round(time.perf_counter() - started, 2),
        }
        try:
            sent = json.loads(response.request.content)
            entry["messages"] = len(sent.get("messages", []))
            users = [m for m in sent.get("messages", []) if m.get("role") == "user"]
            if users:  # the two-step Manager's calls each send a prompt of their own
                entry["prompt"] = str(users[-1].get("content"))[:6000]
            entry["response_format"] = "response_format" in sent
            entry["tools"] = [t["function"]["name"] for t in sent.get("tools", [])]
            if any(m.get("role") == "assistant" for m in sent.get("messages", [])):
                entry["sent_back"] = str(sent["messages"][-1].get("content"))[:2000]  # a retry
            body = response.json()
            message = body["choices"][0]["message"]
            entry["answer"] = message.get("content")
            entry["tool_calls"] = [c["function"] for c in message.get("tool_calls") or []]
            entry["finish_reason"] = body["choices"][0].get("finish_reason")
            entry["usage"] = body.get("usage")
        except Exception as exc:  # an error body, or not JSON: kept as it came
            entry["error"] = f"{type(exc).__name__}: {exc}"
            entry["body"] = response.text[:2000]
        self.exchanges.append(entry)


# --- one run: a conversation, a speaker as the user, a model, a mode ------------------------


@dataclass
class RunStats:
    jobs: int = 0
    usable: int = 0
    unusable: int = 0
    unavailable: int = 0
    split_sessions: int = 0
    max_prompt_tokens: int = 0
    results: Counter[str] = field(default_factory=Counter)
    session_seconds: list[float] = field(default_factory=list)
    sessions: int = 0
    final_memories: int = 0
    gold_best: list[float] = field(default_factory=list)
    gold_clean_best: list[float] = field(default_factory=list)
    written: int = 0
    flags: Counter[str] = field(default_factory=Counter)
    duplicate_pairs: int = 0
    updates: int = 0
    unrelated_updates: int = 0
    recall: dict[int, list[float]] = field(default_factory=lambda: {k: [] for k in KS})
    answer_in_5: list[float] = field(default_factory=list)
    baseline: dict[int, list[float]] = field(default_factory=lambda: {k: [] for k in KS})
    baseline_answer_in_5: list[float] = field(default_factory=list)

    def add(self, other: RunStats) -> None:
        for name, value in vars(other).items():
            mine = getattr(self, name)
            if isinstance(mine, Counter):
                mine.update(value)
            elif isinstance(mine, list):
                mine.extend(value)
            elif isinstance(mine, dict):
                for k, items in value.items():
                    mine[k].extend(items)
            elif name == "max_prompt_tokens":
                self.max_prompt_tokens = max(mine, value)
            else:
                setattr(self, name, mine + value)


ANALYZER = Analyzer()


def _users_words(content: str, user_terms: set[str]) -> bool:
    """Whether half or more of a memory's words (stemmed) are the user's in the session: a fact
    the user told that the other speaker echoed ("That charity race sounds great!") is closer
    to the echo by cosine, and is no assistant text."""
    words = set(ANALYZER.terms(content))
    return bool(words) and 2 * len(words & user_terms) >= len(words)


def flags_of(content: str) -> list[str]:
    found = []
    if ECHO.search(content):
        found.append("echo")
    if FIRST_PERSON.search(content):
        found.append("first_person")
    if ASSISTANT_PHRASES.search(content):
        found.append("phrases")
    if content.rstrip().endswith("?"):
        found.append("question")
    return found


class Run:
    def __init__(
        self,
        service: MemoryService,
        applier: Applier,
        manager: Manager,
        recorder: Recorder,
        model: str,
        *,
        user_id: str,
        chunk_turns: int,
        manager_max_tokens: int,
    ) -> None:
        self.service = service
        self.applier = applier
        self.manager = manager
        self.recorder = recorder
        self.model = model
        self.user_id = user_id
        self.chunk_turns = chunk_turns
        self.manager_max_tokens = manager_max_tokens
        self.stats = RunStats()
        self.sessions_of_memory: dict[str, set[int]] = {}
        self.flags_of_memory: dict[str, list[str]] = {}
        self.raw_sessions: dict[str, set[int]] = {}

    async def cosines(self, texts: Sequence[str], others: Sequence[str]) -> np.ndarray:
        if not texts or not others:
            return np.zeros((len(texts), len(others)), dtype=np.float32)
        vectors = await self.service.embedder.embed([*texts, *others])
        return np.asarray(vectors[: len(texts)] @ vectors[len(texts) :].T)

    def chunks(self, session: Session, prompt: str) -> list[list[Turn]]:
        """The whole session, or chunks of at most `chunk_turns` (30) when it would not fit."""
        turns = session.turns
        size = self.chunk_turns
        if not size:
            chars = len(instructions(shape=True)) + len(prompt)
            tokens = chars / CHARS_PER_TOKEN + SCHEMA_ALLOWANCE + self.manager_max_tokens
            if tokens <= CTX_SIZE:
                return [turns]
            size = CHUNK_TURNS
        count = -(-len(turns) // size)
        even = -(-len(turns) // count)
        return [turns[i : i + even] for i in range(0, len(turns), even)]

    async def related(self, turns: Sequence[Turn], when: datetime) -> ShownMemories:
        """What the worker shows: the user's memories most related to the new user turns (and,
        for the two-step Manager, those most like each sentence it chooses)."""
        book = ShownMemories(self.service, self.user_id, when)
        await book.related([t.text for t in turns if t.role == "user"])
        return book

    async def session(self, session: Session) -> dict[str, Any]:
        record: dict[str, Any] = {
            "session": session.number, "date": session.when.isoformat(), "jobs": [],
        }  # fmt: skip
        started = time.perf_counter()
        shown = (await self.related(session.turns, session.when)).shown
        whole = build_prompt(
            now=session.when, memories=shown, context=[],
            new=[turn(t.role, t.text) for t in session.turns], role_aware=True,
        )  # fmt: skip
        chunks = self.chunks(session, whole)
        if len(chunks) > 1:
            self.stats.split_sessions += 1
        done = 0
        for chunk in chunks:
            context = session.turns[max(0, done - CONTEXT_TURNS) : done]
            record["jobs"].append(await self.job(session, chunk, context))
            done += len(chunk)
        seconds = time.perf_counter() - started
        self.stats.session_seconds.append(seconds)
        self.stats.sessions += 1
        record["seconds"] = round(seconds, 2)
        return record

    async def job(self, session: Session, new: list[Turn], context: list[Turn]) -> dict[str, Any]:
        stats = self.stats
        book = await self.related(new, session.when)
        shown = list(book.shown)
        new_turns = [turn(t.role, t.text) for t in new]
        context_turns = [turn(t.role, t.text) for t in context]
        prompt = build_prompt(now=session.when, memories=shown, context=context_turns,
                              new=new_turns, role_aware=True)  # fmt: skip
        job: dict[str, Any] = {
            "turns": [t.dia_id for t in new], "context": [t.dia_id for t in context],
            "prompt": prompt, "shown": len(shown),
        }  # fmt: skip
        stats.jobs += 1
        self.recorder.take()
        started = time.perf_counter()
        operations: list[Operation] = []
        try:
            operations = await self.manager.decide(
                self.model, memories=shown, context=context_turns, new=new_turns,
                now=session.when, lookup=book,
            )  # fmt: skip
            job["status"] = "usable"
            stats.usable += 1
        except ManagerAnswerUnusable as exc:
            job["status"], job["error"], job["answer"] = "unusable", str(exc), exc.answer
            stats.unusable += 1
        except ManagerUnavailable as exc:
            job["status"], job["error"] = "unavailable", str(exc)
            stats.unavailable += 1
        job["decide_seconds"] = round(time.perf_counter() - started, 2)
        job["exchanges"] = self.recorder.take()
        for exchange in job["exchanges"]:
            tokens = (exchange.get("usage") or {}).get("prompt_tokens") or 0
            stats.max_prompt_tokens = max(stats.max_prompt_tokens, int(tokens))
        # as the worker does: grounds, the rules after the model, the user's explicit requests
        grounds = Grounds.of([*context_turns, *new_turns], book.shown, new_turns, session.when)
        kept, dropped = after_model(operations, grounds)
        kept, more = after_model(with_requests(kept, new_turns, grounds), grounds)
        dropped += more
        stats.results["ruled"] += len(dropped)
        job["ruled"] = [[d.operation.content, d.reason] for d in dropped]
        outcomes = await self.applier.apply(
            self.user_id, kept, book.aliases,
            job_id=f"eval-{uuid.uuid4().hex[:12]}", grounds=grounds, observed_at=session.when,
        )  # fmt: skip
        job["outcomes"] = await self.checked(session, outcomes, book.shown)
        return job

    async def checked(
        self, session: Session, outcomes: Sequence[Applied], shown: Sequence[Shown]
    ) -> list[dict[str, Any]]:
        """Each outcome as a record, with the checks of the module docstring; counted."""
        stats = self.stats
        user_turns = [t for t in session.turns if t.role == "user"]
        other_turns = [t for t in session.turns if t.role == "assistant"]
        written = [o for o in outcomes if o.result in ("created", "updated")]
        contents = [o.operation.content or "" for o in written]
        to_user = await self.cosines(contents, [t.text for t in user_turns])
        to_other = await self.cosines(contents, [t.text for t in other_turns])
        before = {s.alias: s.content for s in shown}
        user_terms = set(ANALYZER.terms(" ".join(t.text for t in user_turns)))
        records = []
        index = 0
        for outcome in outcomes:
            operation = outcome.operation
            stats.results[outcome.result] += 1
            entry: dict[str, Any] = {
                "op": operation.op.value, "id": operation.id, "content": operation.content,
                "type": operation.type.value if operation.type else None,
                "result": outcome.result, "reason": outcome.reason,
            }  # fmt: skip
            if outcome.result in ("created", "updated"):
                assert outcome.memory_id is not None
                self.sessions_of_memory.setdefault(outcome.memory_id, set()).add(session.number)
                flags = flags_of(operation.content or "")
                best_user = float(to_user[index].max()) if user_turns else -1.0
                best_other = float(to_other[index].max()) if other_turns else -1.0
                if best_other > best_user and not _users_words(operation.content or "",
                                                              user_terms):  # fmt: skip
                    flags.insert(0, "assistant")
                    entry["best_turn"] = other_turns[int(to_other[index].argmax())].dia_id
                elif user_turns:
                    entry["best_turn"] = user_turns[int(to_user[index].argmax())].dia_id
                entry["best_user_cosine"] = round(best_user, 3)
                entry["best_assistant_cosine"] = round(best_other, 3)
                entry["flags"] = flags
                self.flags_of_memory[outcome.memory_id] = flags
                stats.written += 1
                stats.flags.update(flags)
                if flags:
                    stats.flags["any"] += 1
                index += 1
            if operation.op is Op.UPDATE and outcome.result == "updated" and operation.id:
                old = before.get(operation.id, "")
                (similarity,) = (await self.cosines([old], [operation.content or ""]))[0]
                entry["replaced"] = old
                entry["replaced_cosine"] = round(float(similarity), 3)
                stats.updates += 1
                if similarity < UNRELATED_UPDATE:
                    stats.unrelated_updates += 1
            records.append(entry)
        return records

    async def finish(self, sessions: Sequence[Session], user: str) -> dict[str, Any]:
        """The final memories, the gold facts' best matches and duplicates."""
        stats = self.stats
        memories = [m async for m, _ in self.service.export_linked(self.user_id)]
        stats.final_memories += len(memories)
        contents = [m.content for m in memories]
        gold = [(s.number, fact, dia) for s in sessions for fact, dia in s.gold]
        matches = await self.cosines(
            [without_name(f, user) for _, f, _ in gold],
            [without_name(c, "the user") for c in contents],
        )
        clean = np.array([not self.flags_of_memory.get(m.id) for m in memories], dtype=bool)
        gold_records = []
        for i, (number, fact, dia) in enumerate(gold):
            best = int(matches[i].argmax()) if contents else -1
            cosine = float(matches[i, best]) if contents else 0.0
            stats.gold_best.append(cosine)
            stats.gold_clean_best.append(float(matches[i, clean].max()) if clean.any() else 0.0)
            gold_records.append({
                "session": number, "dia_id": dia, "fact": fact, "cosine": round(cosine, 3),
                "memory": contents[best] if contents else None,
            })  # fmt: skip
        pairs = await self.cosines(contents, contents)
        upper = np.triu(pairs, k=1) >= 0.9
        stats.duplicate_pairs += int(upper.sum())
        duplicates = [[contents[i], contents[j]] for i, j in zip(*np.nonzero(upper), strict=True)]
        return {
            "memories": [
                {"content": m.content, "type": m.type,
                 "sessions": sorted(self.sessions_of_memory.get(m.id, set()))}
                for m in memories
            ],
            "gold": gold_records,
            "duplicate_pairs": duplicates,
        }  # fmt: skip


# --- downstream: LoCoMo questions over the memories -------------------------------------------


def questions_of(
    sample: dict[str, Any], sessions: Sequence[Session], user: str
) -> list[tuple[dict[str, Any], set[int]]]:
    """Categories 1-4, evidence within the sessions processed, some of it said by the user."""
    speaker_of = {t.dia_id: t.speaker for s in sessions for t in s.turns}
    known = {d for d, _ in raw_turns_of(sample["conversation"])}
    out = []
    for qa in sample["qa"]:
        if int(qa.get("category", 0)) not in CATEGORIES:
            continue
        evidence, _ = normalise_evidence(qa.get("evidence", []), known)
        if not evidence or any(d not in speaker_of for d in evidence):
            continue
        if not any(speaker_of[d] == user for d in evidence):
            continue
        out.append((qa, {session_of(d) for d in evidence}))
    return out


async def ranked_sessions(
    service: MemoryService, user_id: str, question: str, sessions_of: dict[str, set[int]]
) -> list[tuple[str, set[int]]]:
    found = await service.search(user_id, question, limit=max(KS), min_score=0.0)
    return [(f.memory.content, sessions_of.get(f.memory.id, set())) for f in found]


def score(
    ranked: Sequence[tuple[str, set[int]]], evidence: set[int], answer: str
) -> tuple[dict[int, float], float]:
    recall = {}
    for k in KS:
        covered: set[int] = set().union(*(s for _, s in ranked[:k]))
        recall[k] = len(covered & evidence) / len(evidence)
    text = " ".join(c for c, _ in ranked[:5]).casefold()
    return recall, float(answer.casefold() in text)


async def downstream(
    run: Run,
    sample: dict[str, Any],
    sessions: Sequence[Session],
    user: str,
    *,
    baseline: str | None = None,
) -> list[dict[str, Any]]:
    """Evidence recall over the Manager's memories, and over the raw turns (the baseline; the
    user `baseline` holds them already: a second look at the same run's memories)."""
    stats = run.stats
    numbers = {s.number for s in sessions}
    baseline_user = baseline or f"{run.user_id}-raw"
    raw = [(d, text) for d, text in raw_turns_of(sample["conversation"])
           if session_of(d) in numbers]  # fmt: skip
    if baseline is None:
        written = await run.service.add(baseline_user, [NewMemory(content=t) for _, t in raw])
        run.raw_sessions = {
            record.id: {session_of(d)} for record, (d, _) in zip(written.records, raw, strict=True)
        }
    raw_sessions = run.raw_sessions
    out = []
    for qa, evidence in questions_of(sample, sessions, user):
        answer = str(qa["answer"])
        ranked = await ranked_sessions(run.service, run.user_id, qa["question"],
                                       run.sessions_of_memory)  # fmt: skip
        recall, hit = score(ranked, evidence, answer)
        base = await ranked_sessions(run.service, baseline_user, qa["question"], raw_sessions)
        base_recall, base_hit = score(base, evidence, answer)
        for k in KS:
            stats.recall[k].append(recall[k])
            stats.baseline[k].append(base_recall[k])
        stats.answer_in_5.append(hit)
        stats.baseline_answer_in_5.append(base_hit)
        out.append({
            "question": qa["question"], "answer": answer, "category": qa["category"],
            "evidence_sessions": sorted(evidence),
            "recall": {str(k): v for k, v in recall.items()}, "answer_in_top5": bool(hit),
            "top10": [[c, sorted(s)] for c, s in ranked],
        })  # fmt: skip
    return out


# --- the report -------------------------------------------------------------------------------


def mean(values: Sequence[float]) -> float:
    return statistics.fmean(values) if values else float("nan")


def share(part: int, whole: int) -> str:
    return f"{part / whole:.2f}" if whole else "-"


def writes(results: Counter[str]) -> int:
    """The NEW and UPDATE operations the applier was given (every outcome but deleted)."""
    return sum(n for result, n in results.items() if result not in ("deleted", "ruled"))


def report(results: dict[tuple[str, str], RunStats]) -> None:
    names = {key: f"{key[0]} {key[1]}" for key in results}
    width = max(22, *(len(n) for n in names.values()))
    print("\nManager answers (jobs: sessions, or chunks of a split session)")
    print(f"{'model mode':<{width}} {'jobs':>4} {'usable':>6} {'unusbl':>6} {'unavail':>7} "
          f"{'created':>7} {'updated':>7} {'deleted':>7} {'unchg':>5} {'dup':>4} {'ungrd':>5} "
          f"{'failed':>6} {'ruled':>5} {'refused':>7} "
          f"{'s/sess p50':>10} {'max':>6} {'max prompt':>10}")  # fmt: skip
    for key, s in results.items():
        r = s.results
        seconds = sorted(s.session_seconds)
        p50 = statistics.median(seconds) if seconds else float("nan")
        top = seconds[-1] if seconds else float("nan")
        print(f"{names[key]:<{width}} {s.jobs:>4} {share(s.usable, s.jobs):>6} "
              f"{s.unusable:>6} {s.unavailable:>7} {r['created']:>7} {r['updated']:>7} "
              f"{r['deleted']:>7} {r['unchanged']:>5} {r['duplicate']:>4} {r['ungrounded']:>5} "
              f"{r['failed']:>6} {r['ruled']:>5} {share(r['ungrounded'], writes(r)):>7} "
              f"{p50:>10.1f} {top:>6.1f} "
              f"{s.max_prompt_tokens:>10}")  # fmt: skip
    print(f"\nMemories: gold = the user's observations recovered at cosine >= 0.5 / 0.6 / 0.7 "
          f"(default {DEFAULT_THRESHOLD}); flags among the memories written")  # fmt: skip
    print(f"{'model mode':<{width}} {'mem':>4} {'/sess':>5} {'gold':>4} {'@.5':>5} {'@.6':>5} "
          f"{'@.7':>5} {'clean@.6':>8} {'written':>7} {'assist':>6} {'1st p':>5} "
          f"{'phrase':>6} {'quest':>5} {'echo':>4} {'any':>4} {'dup pairs':>9} {'upd':>4} "
          f"{'unrel':>5}")  # fmt: skip
    for key, s in results.items():
        f = s.flags
        sweep = " ".join(
            f"{share(sum(c >= t for c in s.gold_best), len(s.gold_best)):>5}" for t in THRESHOLDS
        )
        clean = share(sum(c >= DEFAULT_THRESHOLD for c in s.gold_clean_best), len(s.gold_best))
        print(f"{names[key]:<{width}} {s.final_memories:>4} "
              f"{s.final_memories / max(s.sessions, 1):>5.1f} {len(s.gold_best):>4} {sweep} "
              f"{clean:>8} {s.written:>7} {f['assistant']:>6} {f['first_person']:>5} "
              f"{f['phrases']:>6} {f['question']:>5} {f['echo']:>4} {f['any']:>4} "
              f"{s.duplicate_pairs:>9} {s.updates:>4} {s.unrelated_updates:>5}")  # fmt: skip
    print("\nLoCoMo questions (categories 1-4, evidence in the sessions run, some said by the "
          "user): evidence-session recall")  # fmt: skip
    print(f"{'memories of':<{width}} {'n':>4} {'R@5':>6} {'R@10':>6} {'ans@5':>6}")
    for key, s in results.items():
        print(f"{names[key]:<{width}} {len(s.answer_in_5):>4} {mean(s.recall[5]):6.3f} "
              f"{mean(s.recall[10]):6.3f} {mean(s.answer_in_5):6.3f}")  # fmt: skip
    first = next(iter(results.values()), None)
    if first is not None:
        label = "raw turns (baseline)"
        print(f"{label:<{width}} {len(first.baseline_answer_in_5):>4} "
              f"{mean(first.baseline[5]):6.3f} {mean(first.baseline[10]):6.3f} "
              f"{mean(first.baseline_answer_in_5):6.3f}")  # fmt: skip


# --- main -------------------------------------------------------------------------------------


async def evaluate(args: argparse.Namespace, data: list[dict[str, Any]]) -> None:
    started = time.perf_counter()
    runs: list[dict[str, Any]] = []
    results: dict[tuple[str, str], RunStats] = {}
    async with AsyncExitStack() as stack:
        folder = stack.enter_context(tempfile.TemporaryDirectory())
        app_settings = Settings(
            database_url=f"sqlite+aiosqlite:///{folder}/eval.db",
            embedding_cache_dir=str(ROOT / "data" / "models"),
            manager_enabled=False,  # no worker: the jobs are run here, one by one
            upstream_check_at_start=False,
            log_level="WARNING",
        )
        app = create_app(app_settings)
        await stack.enter_async_context(app.router.lifespan_context(app))
        service: MemoryService = app.state.services.memory
        applier = Applier(service, dedup_threshold=app_settings.dedup_threshold)
        print(f"in-process memproxy: embedder {service.embedder.model_name}, dedup threshold "
              f"{app_settings.dedup_threshold}")  # fmt: skip
        for model in args.models:
            print(f"starting llama-server {model} (threads {args.threads}, ctx {CTX_SIZE}, "
                  "1 slot)...", flush=True)  # fmt: skip
            try:
                server = await asyncio.to_thread(
                    start_server, model, parallel=1, ctx_size=CTX_SIZE, threads=args.threads
                )
            except RuntimeError as exc:  # not installed, or it would not start: says why
                sys.exit(f"llama-server {model}: {exc}")
            with server:
                for mode in args.modes:
                    settings = Settings(
                        upstream_base_url=server.base_url, manager_model=server.alias,
                        manager_output_mode=mode, manager_temperature=0,
                        manager_steps=args.steps, manager_second_look=args.second_look,
                        manager_timeout_seconds=args.job_timeout,
                        manager_job_timeout_seconds=args.job_timeout,
                    )  # fmt: skip
                    http = build_http_client(settings)
                    recorder = Recorder(http)
                    manager = Manager(settings, http_client=http)
                    total, tidied = RunStats(), RunStats()
                    try:
                        for sample in data:
                            for which in args.speakers:
                                run = Run(
                                    service, applier, manager, recorder, server.alias,
                                    user_id=f"eval-{model}-{mode}-{sample['sample_id']}-{which}",
                                    chunk_turns=args.chunk_turns,
                                    manager_max_tokens=settings.manager_max_tokens,
                                )  # fmt: skip
                                runs.append(await one_run(run, sample, which, args.sessions))
                                runs[-1].update(model=model, mode=mode)
                                total.add(run.stats)
                                if args.consolidate:
                                    after, record = await consolidated(
                                        run, sample, which, args.sessions, settings
                                    )
                                    runs[-1]["consolidated"] = record
                                    tidied.add(after.stats)
                    finally:
                        await http.aclose()
                    results[(model, mode)] = total
                    report({(model, mode): total})
                    if args.consolidate:
                        results[(model, f"{mode} consolidated")] = tidied
                        report({(model, mode): total, (model, f"{mode} consolidated"): tidied})
    if len(results) > 1:
        print("\nAll together:")
        report(results)
    print(f"\nwall time {time.perf_counter() - started:.0f} s")
    if args.json:
        body = {"arguments": {k: v for k, v in vars(args).items() if k not in ("data", "json")},
                "data": str(args.data), "runs": runs}  # fmt: skip
        args.json.write_text(json.dumps(body, indent=1, ensure_ascii=False))
        print(f"raw records: {args.json}")


async def one_run(
    run: Run, sample: dict[str, Any], which: str, limit: int | None
) -> dict[str, Any]:
    conversation = sample["conversation"]
    user = conversation[f"speaker_{which}"]
    other = conversation["speaker_b" if which == "a" else "speaker_a"]
    sessions = sessions_of(sample, user, limit)
    print(f"  {sample['sample_id']}: {user} as the user, {other} as the assistant, "
          f"{len(sessions)} sessions", flush=True)  # fmt: skip
    records = []
    for session in sessions:
        record = await run.session(session)
        records.append(record)
        results = Counter(o["result"] for j in record["jobs"] for o in j["outcomes"])
        statuses = ",".join(j["status"] for j in record["jobs"])
        print(f"    session {session.number} ({len(session.turns)} turns, {len(record['jobs'])} "
              f"job{'s' if len(record['jobs']) > 1 else ''}): {statuses}; "
              f"{dict(results) or 'no operations'}; {record['seconds']:.1f} s",
              flush=True)  # fmt: skip
    final = await run.finish(sessions, user)
    questions = await downstream(run, sample, sessions, user)
    split = run.stats.split_sessions
    print(f"  jobs: {'one per session' if not split else f'{split} session(s) split in chunks'}")
    return {
        "conversation": sample["sample_id"], "user": user, "assistant": other,
        "sessions": records, **final, "questions": questions,
    }  # fmt: skip


async def consolidated(
    run: Run, sample: dict[str, Any], which: str, limit: int | None, settings: Settings
) -> tuple[Run, dict[str, Any]]:
    """The run's memories after consolidation, as idle jobs would leave them (one after the
    other, each going on where the last stopped), measured again as `run`'s were."""
    user = sample["conversation"][f"speaker_{which}"]
    sessions = sessions_of(sample, user, limit)
    tidy = Consolidation(run.service, run.manager, settings)
    started = time.perf_counter()
    total, since, jobs = Tidied(), 0, 0
    while True:
        done = await tidy.run(run.user_id, since=since, model=run.model, job_id="bench-idle")
        jobs += 1
        total.merged += done.merged
        total.superseded += done.superseded
        total.asked += done.asked
        total.refused += done.refused
        for gone, into in done.into.items():  # a survivor merged later hands on what it holds
            total.into.update({k: into for k, v in total.into.items() if v == gone})
            total.into[gone] = into
        if done.stopped_at is None:
            break
        since = done.stopped_at
    seconds = time.perf_counter() - started
    after = Run(run.service, run.applier, run.manager, run.recorder, run.model,
                user_id=run.user_id, chunk_turns=run.chunk_turns,
                manager_max_tokens=run.manager_max_tokens)  # fmt: skip
    after.sessions_of_memory = {k: set(v) for k, v in run.sessions_of_memory.items()}
    for gone, into in total.into.items():  # provenance follows a merge
        after.sessions_of_memory.setdefault(into, set()).update(
            run.sessions_of_memory.get(gone, set())
        )
    after.flags_of_memory = dict(run.flags_of_memory)
    after.raw_sessions = run.raw_sessions
    after.stats.sessions = run.stats.sessions
    final = await after.finish(sessions, user)
    questions = await downstream(after, sample, sessions, user, baseline=f"{run.user_id}-raw")
    left, _ = await run.service.store.forgotten(run.user_id, limit=10_000)
    print(f"  consolidated: {total.merged} merged, {total.superseded} superseded, "
          f"{total.asked} questions ({total.refused} refused), {jobs} idle job(s), "
          f"{seconds:.0f} s", flush=True)  # fmt: skip
    return after, {
        "merged": total.merged, "superseded": total.superseded, "questions": total.asked,
        "refused": total.refused, "seconds": round(seconds, 1), **final,
        "left": [{"content": m.content, "cause": m.cause, "reason": m.reason} for m in left],
        "questions_after": questions,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--models", default="qwen1.5b", help="comma-separated: qwen1.5b,qwen0.5b")
    parser.add_argument(
        "--modes", default="json_schema", help=f"comma-separated: {','.join(MODES)}"
    )
    parser.add_argument("--conversations", default="", help="sample ids, e.g. conv-26 (all)")
    parser.add_argument("--sessions", type=int, help="the first N sessions of each (all)")
    parser.add_argument("--speaker", choices=["a", "b", "both"], default="a",
                        help="which speaker is the user")  # fmt: skip
    parser.add_argument("--json", type=Path, help="write the raw per-session records here")
    parser.add_argument(
        "--chunk-turns",
        type=int,
        default=0,
        help="turns per job (0: the whole session when it fits 8k, else 30)",
    )
    parser.add_argument(
        "--steps",
        choices=["auto", "one", "two"],
        default="auto",
        help="MEMPROXY_MANAGER_STEPS (auto: two for these small models)",
    )
    parser.add_argument(
        "--second-look",
        action="store_true",
        help="MEMPROXY_MANAGER_SECOND_LOOK: one more call for missed facts",
    )
    parser.add_argument(
        "--consolidate",
        action="store_true",
        help="then consolidate each run's memories as idle jobs would, and measure them again",
    )
    parser.add_argument("--threads", type=int, default=2, help="llama-server's threads")
    parser.add_argument(
        "--job-timeout",
        type=float,
        default=600.0,
        help="seconds one job may take with the model (then: unavailable)",
    )
    args = parser.parse_args()  # fmt: skip
    args.models = [m for m in args.models.split(",") if m]
    args.modes = [m for m in args.modes.split(",") if m]
    if bad := [m for m in args.modes if m not in MODES]:
        parser.error(f"unknown mode(s) {bad}; known: {', '.join(MODES)}")
    args.speakers = ["a", "b"] if args.speaker == "both" else [args.speaker]
    data = json.loads(args.data.read_text())
    if args.conversations:
        wanted = args.conversations.split(",")
        data = [s for s in data if s["sample_id"] in wanted]
        if missing := set(wanted) - {s["sample_id"] for s in data}:
            parser.error(f"no conversation {sorted(missing)} in {args.data}")
    print(f"data: {args.data} ({', '.join(s['sample_id'] for s in data)}); models "
          f"{', '.join(args.models)}; modes {', '.join(args.modes)}; steps {args.steps}"
          f"{' + second look' if args.second_look else ''}; user = speaker "
          f"{args.speaker}; sessions {args.sessions or 'all'}")  # fmt: skip
    asyncio.run(evaluate(args, data))


if __name__ == "__main__":
    main()
