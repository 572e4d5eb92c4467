"""What memproxy injects for LoCoMo questions once it has learned the conversations, end to end.

A real ``memproxy serve`` (a subprocess on a free port, a fresh SQLite database in a temporary
folder, the bundled embedder, default recall budget) learns each LoCoMo conversation through
``POST /v1/memories/learn``: every session is one Open WebUI chat (the export's shape, as
tests/memory/learning/exports.py makes it) whose messages are dated at the session's date (one
second apart). One speaker is the user and the other the assistant: with ``--speaker both`` (the
default) each conversation is learned twice, once as each speaker's user; ``a`` or ``b`` learns
it once. The script waits until the run's jobs are done (``GET /v1/memories/learn/{id}``).

Then each question of categories 1-4 is sent as a chat with ``X-Memory: read-only`` and the
speaker's name in ``X-OpenWebUI-User-Name`` (as Open WebUI forwards it; ``--no-names``: without)
to the user whose speaker said most of its evidence turns (a tie: speaker a; with ``a`` or
``b``, the questions with no evidence turn of that speaker are left out, for every row).
memproxy's upstream is a loopback server in this script that answers OpenAI-shaped and records
the memory block of the system message it got; that block is scored:

- evidence recall: the share of the question's evidence *sessions* covered by the injected
  memories, a memory mapped to its session by the date it shows (its ``observed_at``: the
  session's date; the sessions of one conversation are on different days), averaged over
  questions;
- answer: the share of questions whose answer string is in the injected lines (case-folded);
- tokens: what the block takes, at 4 characters a token, its fixed header included (0 when
  nothing is injected);
- off-topic: the share of 40 chats about nothing personal (bench/off_topic.py: coding, science,
  how-to), sent to every user, that were shown any memory found for them (the profile, shown in
  every chat, not counted); in brackets, the same for 20 held-out chats written after recall was
  tuned on the 40.

Rows, each a fresh server: facts only (``MEMPROXY_EPISODES=false``), episodes only (a Manager
that answers no operation: the jobs still keep the user's turns), both (the defaults), and the
raw-turn baseline (each turn of both speakers one memory, as bench/recall_eval.py writes it,
``[<session date>] <speaker>: <text>``, ``observed_at`` the session's date, imported with
``/v1/memories/batch``; recalled through the same chat). "learn s" is the wall time from the
first learn request until every run has no job pending (the baseline: its import).

The Manager is ``--manager rules`` (default: the fake upstream's deterministic Manager,
app/devtools/fake_manager.py, answered by the recording server) or ``--manager qwen1.5b`` (or
``qwen0.5b``): bench/llm_server.py's llama-server, json_schema, one slot (install it first with
``bench/llm_server.py install`` and ``model qwen1.5b``). The 1.5B takes about a minute a job on
2 cores: both conversations as both speakers, twice (facts, both), run for hours; ``--speaker a
--conversations conv-26`` is a quarter of it.

    .venv/bin/python bench/pipeline_eval.py                        # rules Manager, dev file
    .venv/bin/python bench/pipeline_eval.py --manager qwen1.5b --speaker a
    .venv/bin/python bench/pipeline_eval.py --rows both --set MEMPROXY_RECALL_LIMIT=12
    .venv/bin/python bench/pipeline_eval.py --rows "raw turns" --no-names --dump /tmp/q.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import socket
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import AsyncExitStack, ExitStack, contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import orjson
import uvicorn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.devtools.fake_manager import decisions  # noqa: E402
from app.devtools.fake_upstream import read_body  # noqa: E402
from app.memory.block import BLOCK_END, BLOCK_START  # noqa: E402
from bench.fake_manager import completion, lifespan, respond  # noqa: E402
from bench.manager_eval import Session, session_of, sessions_of  # noqa: E402
from bench.off_topic import HELD_OUT, PROMPTS, found_lines  # noqa: E402
from bench.overhead import MODELS, free_port  # noqa: E402
from bench.recall_eval import (  # noqa: E402
    CATEGORIES,
    DEFAULT_DATA,
    dated_turns_of,
    normalise_evidence,
)
from bench.replicas import PYTHON, Proc  # noqa: E402
from tests.memory.learning.exports import dumped, owui_linear  # noqa: E402

MODEL = "fake-model"
LINE_DATE = re.compile(r"^- \[(\d{4}-\d{2}-\d{2})\] ", re.M)
ROWS = ("facts", "episodes", "both", "raw turns")


# --- the upstream: answers, records what memproxy injected, plays the Manager -----------------


class Upstream:
    """OpenAI chat completions: a Manager prompt is answered with the rule-based Manager's
    operations (or none: ``writes=False``); any other chat with "ok", its memory block kept in
    :attr:`blocks` ('' when none)."""

    def __init__(self) -> None:
        self.writes = True
        self.blocks: list[str] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        request = orjson.loads(await read_body(receive) or b"{}")
        messages = request.get("messages") or []
        decided = decisions(messages)
        if decided is not None:
            operations = decided["operations"] if self.writes else []
            await respond(send, completion(request, operations))
            return
        system = "\n".join(
            m["content"] for m in messages
            if m.get("role") == "system" and isinstance(m.get("content"), str)
        )  # fmt: skip
        start, end = system.find(BLOCK_START), system.find(BLOCK_END)
        self.blocks.append(system[start : end + len(BLOCK_END)] if start >= 0 else "")
        await respond(send, orjson.dumps({
            "id": "r", "object": "chat.completion", "created": 1, "model": MODEL,
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": "ok"}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }))  # fmt: skip


@contextmanager
def memproxy(folder: Path, name: str, env: dict[str, str]) -> Iterator[str]:
    """A ``memproxy serve`` on a fresh SQLite database; yields its URL. Its output goes to
    `<folder>/<name>.log`."""
    port = free_port()
    env = {
        "MEMPROXY_DATABASE_URL": f"sqlite+aiosqlite:///{folder}/{name}.db",
        "MEMPROXY_EMBEDDING_CACHE_DIR": str(MODELS),
        "MEMPROXY_UPSTREAM_CHECK_AT_START": "false",
        "MEMPROXY_LOG_LEVEL": "WARNING",
        **env,
    }
    proc = Proc(name, [PYTHON, "-m", "app.cli", "serve", "--port", str(port)], port, env,
                str(folder))  # fmt: skip
    proc.start()
    try:
        yield proc.url
    finally:
        proc.stop()


def as_learned(database: Path) -> None:
    """The kept database's recall bookkeeping put back as learning left it (nothing recalled:
    only chats mark recalls). Asking marks what each question recalled, and the profile past
    its budget shows the most recalled first: without this, each run asked of a kept database
    started where the last one ended (seen: "both" 0.862, then 0.889, then 0.873 on one
    database with the 1.5B)."""
    with sqlite3.connect(database) as db:
        db.execute("UPDATE memories SET recall_count = 0, last_recalled_at = NULL")


# --- the data ---------------------------------------------------------------------------------


@dataclass
class Conversation:
    sample: dict[str, Any]
    speakers: dict[str, str]
    """"a" / "b" -> the speaker's name."""
    sessions: dict[str, list[Session]] = field(default_factory=dict)
    """Per speaker letter: the sessions seen with that speaker as the user."""
    by_date: dict[str, set[int]] = field(default_factory=dict)
    """A session's date (YYYY-MM-DD) -> its number(s)."""


def conversation_of(sample: dict[str, Any], letters: list[str]) -> Conversation:
    c = sample["conversation"]
    found = Conversation(sample, {x: c[f"speaker_{x}"] for x in ("a", "b")})
    for letter in letters:
        found.sessions[letter] = sessions_of(sample, found.speakers[letter], None)
    for session in next(iter(found.sessions.values())):
        found.by_date.setdefault(session.when.date().isoformat(), set()).add(session.number)
    return found


def export_of(conversation: Conversation, letter: str) -> bytes:
    """The conversation as an Open WebUI export, each session one chat at its own date."""
    chats = [
        owui_linear(f"{conversation.sample['sample_id']} session {s.number}",
                    [(t.role, t.text) for t in s.turns], start=int(s.when.timestamp()), step=1)
        for s in conversation.sessions[letter]
    ]  # fmt: skip
    return dumped(*chats)


@dataclass(frozen=True, slots=True)
class Question:
    text: str
    answer: str
    letter: str
    """Whose user is asked."""
    evidence: frozenset[int]
    """Evidence sessions."""


def questions_of(conversation: Conversation, letters: list[str]) -> tuple[list[Question], int]:
    """The questions of categories 1-4 to ask, and how many evidence ids were dropped."""
    turns = conversation.sample["conversation"]
    speaker_of = {t["dia_id"]: t["speaker"] for key, v in turns.items()
                  if re.fullmatch(r"session_\d+", key) for t in v}  # fmt: skip
    out, dropped = [], 0
    for qa in conversation.sample["qa"]:
        if int(qa.get("category", 0)) not in CATEGORIES:
            continue
        evidence, lost = normalise_evidence(qa.get("evidence", []), set(speaker_of))
        dropped += lost
        said = Counter(speaker_of[d] for d in evidence)
        counts = {x: said[conversation.speakers[x]] for x in letters}
        letter = max(counts, key=lambda x: (counts[x], x == "a"))
        if evidence and counts[letter]:
            sessions = frozenset(session_of(d) for d in evidence)
            out.append(Question(qa["question"], str(qa["answer"]), letter, sessions))
    return out, dropped


def first_sessions(sample: dict[str, Any], n: int) -> dict[str, Any]:
    """`sample` with its first `n` sessions only, and the questions whose every evidence turn
    (``D<session>:<turn>``) is in them."""
    numbered = re.compile(r"session_(\d+)(?:_date_time)?")
    conversation = {
        key: value for key, value in sample["conversation"].items()
        if not (m := numbered.fullmatch(key)) or int(m.group(1)) <= n
    }  # fmt: skip

    def within(qa: dict[str, Any]) -> bool:
        found = [int(x) for e in qa.get("evidence", []) for x in re.findall(r"D(\d+):", e)]
        return bool(found) and max(found) <= n

    return sample | {"conversation": conversation, "qa": [q for q in sample["qa"] if within(q)]}


# --- one row ----------------------------------------------------------------------------------


@dataclass
class Row:
    name: str
    recall: list[float] = field(default_factory=list)
    answers: list[float] = field(default_factory=list)
    tokens: list[float] = field(default_factory=list)
    off_topic: list[int] = field(default_factory=list)
    held_out: list[int] = field(default_factory=list)
    """The same for bench/off_topic.py's held-out chats."""
    """Per off-topic chat (bench/off_topic.py): the memory lines found for it."""
    learn_seconds: float = 0.0
    memories: Counter[str] = field(default_factory=Counter)
    failed_jobs: int = 0
    asked: list[dict[str, Any]] = field(default_factory=list)
    """Per question: its text, evidence sessions, the sessions covered, the block (``--dump``)."""


def user_of(sample: dict[str, Any], letter: str, tag: str) -> str:
    return f"{sample['sample_id']}-{letter}-{tag}"


async def learn(client: httpx.AsyncClient, convs: list[Conversation], tag: str, row: Row) -> None:
    """Every conversation learned, by each of its users; returns once no job is pending."""
    started = time.perf_counter()
    runs = []
    for conversation in convs:
        for letter in conversation.sessions:
            user = {"X-User-Id": user_of(conversation.sample, letter, tag)}
            response = await client.post("/v1/memories/learn", content=export_of(conversation,
                                         letter), headers=user)  # fmt: skip
            response.raise_for_status()
            body = response.json()
            print(f"  {user['X-User-Id']}: {body['conversations']} chats, {body['jobs']} jobs")
            runs.append((body["id"], user))
    waiting = list(runs)
    while waiting:
        await asyncio.sleep(0.5)
        still = []
        for run, user in waiting:
            response = await client.get(f"/v1/memories/learn/{run}", headers=user)
            response.raise_for_status()
            progress = response.json()
            if progress["pending"]:
                still.append((run, user))
            else:
                row.failed_jobs += progress["failed"]
        waiting = still
    row.learn_seconds = time.perf_counter() - started


async def import_turns(client: httpx.AsyncClient, convs: list[Conversation], row: Row) -> None:
    """The baseline: every turn one memory of each of the conversation's users."""
    started = time.perf_counter()
    for conversation in convs:
        memories = [
            {"content": text} | ({"observed_at": said.isoformat()} if said else {})
            for _, text, said in dated_turns_of(conversation.sample["conversation"])
        ]
        for letter in conversation.sessions:
            user = {"X-User-Id": user_of(conversation.sample, letter, "raw")}
            for start in range(0, len(memories), 1000):
                body = {"memories": memories[start : start + 1000]}
                response = await client.post("/v1/memories/batch", json=body, headers=user)
                response.raise_for_status()
    row.learn_seconds = time.perf_counter() - started


def name_header(conversation: Conversation, names: bool, letter: str) -> dict[str, str]:
    """The user's name, as Open WebUI forwards it (ENABLE_FORWARD_USER_INFO_HEADERS)."""
    return {"X-OpenWebUI-User-Name": conversation.speakers[letter]} if names else {}


async def ask(
    client: httpx.AsyncClient, upstream: Upstream, convs: list[Conversation], tag: str, row: Row,
    letters: list[str], names: bool,
) -> None:  # fmt: skip
    for conversation in convs:
        named = partial(name_header, conversation, names)

        for letter in conversation.sessions:
            user = user_of(conversation.sample, letter, tag)
            for kind, params in (("all", {}), ("episode", {"type": "episode"})):
                listed = await client.get("/v1/memories", params={"limit": 1, **params},
                                          headers={"X-User-Id": user})  # fmt: skip
                listed.raise_for_status()
                row.memories[kind] += listed.json()["total"]
        for question in questions_of(conversation, letters)[0]:
            user = user_of(conversation.sample, question.letter, tag)
            response = await client.post(
                "/v1/chat/completions",
                json={"model": MODEL, "messages": [{"role": "user", "content": question.text}]},
                headers={"X-User-Id": user, "X-Memory": "read-only", **named(question.letter)},
            )
            response.raise_for_status()
            block = upstream.blocks.pop()
            covered = set().union(*(conversation.by_date.get(d, set())
                                    for d in LINE_DATE.findall(block)))  # fmt: skip
            row.recall.append(len(covered & question.evidence) / len(question.evidence))
            row.asked.append({"question": question.text, "answer": question.answer,
                              "user": user, "evidence": sorted(question.evidence),
                              "covered": sorted(covered), "block": block})  # fmt: skip
            lines = "\n".join(line for line in block.splitlines() if line.startswith("- ["))
            row.answers.append(float(question.answer.casefold() in lines.casefold()))
            row.tokens.append(len(block) / 4)
        for letter in conversation.sessions:
            user = user_of(conversation.sample, letter, tag)
            for prompt in (*PROMPTS, *HELD_OUT):
                response = await client.post(
                    "/v1/chat/completions",
                    json={"model": MODEL, "messages": [{"role": "user", "content": prompt}]},
                    headers={"X-User-Id": user, "X-Memory": "read-only", **named(letter)},
                )
                response.raise_for_status()
                found = found_lines(upstream.blocks.pop())
                (row.held_out if prompt in HELD_OUT else row.off_topic).append(len(found))
                if found:
                    row.asked.append({"off_topic": prompt, "user": user, "found": found})


# --- main -------------------------------------------------------------------------------------


def mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else float("nan")


def table(rows: list[Row]) -> str:
    out = ["| row | evidence recall | answer in injected | tokens injected (mean) | off-topic "
           "chats given memories (held out) | learn s | memories (facts / episodes) |",
           "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        episodes = r.memories["episode"]
        facts = r.memories["all"] - episodes
        out.append(
            f"| {r.name} | {mean(r.recall):.3f} | {mean(r.answers):.3f} | "
            f"{mean(r.tokens):.0f} | {mean([float(n > 0) for n in r.off_topic]):.3f} "
            f"({mean([float(n > 0) for n in r.held_out]):.3f}) | "
            f"{r.learn_seconds:.0f} | {facts} / {episodes} |"
        )
    return "\n".join(out)


async def evaluate(args: argparse.Namespace, convs: list[Conversation]) -> list[Row]:
    letters = ["a", "b"] if args.speaker == "both" else [args.speaker]
    folder = Path(args.folder)
    upstream = Upstream()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    up_url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    server = uvicorn.Server(uvicorn.Config(upstream, log_level="warning", access_log=False))
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    manager_env: dict[str, str] = {"MEMPROXY_MANAGER_MODEL": MODEL}
    rows = []
    with ExitStack() as stack:
        if args.manager != "rules":
            from bench.llm_server import start_server

            llm = stack.enter_context(await asyncio.to_thread(
                start_server, args.manager, parallel=1, ctx_size=8192, threads=args.threads
            ))  # fmt: skip
            manager_env = {
                "MEMPROXY_MANAGER_BASE_URL": llm.base_url, "MEMPROXY_MANAGER_MODEL": llm.alias,
                "MEMPROXY_MANAGER_OUTPUT_MODE": "json_schema",
                "MEMPROXY_MANAGER_CONCURRENCY": "1",
                "MEMPROXY_MANAGER_TIMEOUT_SECONDS": "600",
                "MEMPROXY_MANAGER_JOB_TIMEOUT_SECONDS": "900",
            }  # fmt: skip
        settings = {
            "facts": {**manager_env, "MEMPROXY_EPISODES": "false"},
            "episodes": {"MEMPROXY_MANAGER_MODEL": MODEL},  # the recording server: no operation
            "both": manager_env,
            "raw turns": {},
        }
        try:
            for name in args.rows:
                row = Row(name)
                kept = folder / f"{name.replace(' ', '-')}.tag"
                tag = kept.read_text() if args.reuse else uuid.uuid4().hex[:6]
                kept.write_text(tag)
                upstream.writes = name != "episodes"
                chosen = {**settings[name], **args.set}  # --set has the last word
                env = {"MEMPROXY_UPSTREAM_BASE_URL": up_url, **chosen}
                print(f"{name}: {' '.join(f'{k}={v}' for k, v in chosen.items())}", flush=True)
                if args.reuse:
                    as_learned(folder / f"{name.replace(' ', '-')}.db")
                with memproxy(folder, name.replace(" ", "-"), env) as url:
                    async with AsyncExitStack() as inner:
                        client = await inner.enter_async_context(
                            httpx.AsyncClient(base_url=url, timeout=600)
                        )
                        if args.reuse:
                            pass  # asked again of what a previous run learned in --folder
                        elif name == "raw turns":
                            await import_turns(client, convs, row)
                        else:
                            await learn(client, convs, tag, row)
                        await ask(client, upstream, convs, "raw" if name == "raw turns" else tag,
                                  row, letters, names=not args.no_names)  # fmt: skip
                print(
                    f"  {len(row.recall)} questions; learned in {row.learn_seconds:.0f} s; "
                    f"memories {dict(row.memories)}; failed jobs {row.failed_jobs}",
                    flush=True,
                )
                rows.append(row)
        finally:
            server.should_exit = True
            await serving
    print(f"logs and databases: {folder}")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--manager", choices=["rules", "qwen1.5b", "qwen0.5b"], default="rules")
    parser.add_argument(
        "--speaker",
        choices=["a", "b", "both"],
        default="both",
        help="which speaker is the user (both: each conversation learned twice)",
    )
    parser.add_argument("--conversations", default="", help="sample ids, e.g. conv-26 (all)")
    parser.add_argument("--threads", type=int, default=2, help="llama-server's threads")
    parser.add_argument("--folder", help="keep the servers' logs and databases here")
    parser.add_argument(
        "--sessions", type=int, default=0,
        help="learn the first N sessions of each conversation and ask only the questions whose "
        "evidence is in them (all)",
    )  # fmt: skip
    parser.add_argument(
        "--reuse", action="store_true",
        help="ask again, without learning, of the databases a previous run kept in --folder "
        "(same --rows and data; --set changes recall settings only)",
    )  # fmt: skip
    parser.add_argument(
        "--no-names", action="store_true",
        help="ask without the user's name (X-OpenWebUI-User-Name, sent by default)",
    )  # fmt: skip
    parser.add_argument("--dump", type=Path, help="write each row's questions and blocks (JSON)")
    parser.add_argument("--rows", default=",".join(ROWS), help=f"of {', '.join(ROWS)} (all)")
    parser.add_argument(
        "--set", action="append", default=[], metavar="NAME=VALUE",
        help="a setting for every row's server, e.g. MEMPROXY_RECALL_LIMIT=12 (repeatable)",
    )  # fmt: skip
    args = parser.parse_args()
    args.rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    if unknown := sorted(set(args.rows) - set(ROWS)):
        parser.error(f"--rows: no row {', '.join(unknown)} (rows: {', '.join(ROWS)})")
    if bad := [s for s in args.set if "=" not in s or not s.startswith("MEMPROXY_")]:
        parser.error(f"--set takes MEMPROXY_NAME=VALUE, not {', '.join(bad)}")
    args.set = dict(s.split("=", 1) for s in args.set)
    if args.reuse and not args.folder:
        parser.error("--reuse needs --folder: the folder a previous run kept")
    args.folder = args.folder or tempfile.mkdtemp(prefix="pipeline-eval-")
    Path(args.folder).mkdir(parents=True, exist_ok=True)
    data = json.loads(args.data.read_text())
    if args.conversations:
        data = [s for s in data if s["sample_id"] in args.conversations.split(",")]
    if args.sessions:
        data = [first_sessions(s, args.sessions) for s in data]
    letters = ["a", "b"] if args.speaker == "both" else [args.speaker]
    convs = [conversation_of(sample, letters) for sample in data]
    asked = [questions_of(c, letters) for c in convs]
    shared = sum(len(v) > 1 for c in convs for v in c.by_date.values())
    print(f"data: {args.data} ({', '.join(s['sample_id'] for s in data)}); Manager "
          f"{args.manager}; user = speaker {args.speaker}; {sum(len(q) for q, _ in asked)} "
          f"questions; evidence ids dropped {sum(d for _, d in asked)}; dates shared by two "
          f"sessions {shared}", flush=True)  # fmt: skip
    started = time.perf_counter()
    rows = asyncio.run(evaluate(args, convs))
    if args.dump:
        args.dump.write_bytes(
            orjson.dumps({r.name: r.asked for r in rows}, option=orjson.OPT_INDENT_2)
        )
        print(f"per question: {args.dump}")
    print(f"\n{table(rows)}\n\nwall time {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
