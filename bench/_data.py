"""Synthetic memories for the benchmarks, written straight into the database (Core inserts):
a million real embeddings would take hours on these machines, and search cost does not depend on
what the vectors mean."""

from __future__ import annotations

import ast
import bisect
import json
import random
import re
import site
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from app.memory.search.lexical import STOP_WORDS
from app.memory.store.tables import Memory, UserState

SIZES = (1_000, 10_000, 100_000)


def vocabulary() -> list[str]:
    """English words that the bundled model's tokenizer keeps whole (realistic token counts)."""
    from app.memory.search.embedder import bundled_model_path

    vocab = json.loads((Path(bundled_model_path()) / "tokenizer.json").read_text())
    words = vocab["model"]["vocab"]
    return sorted(w for w in words if w.isalpha() and w.isascii() and len(w) > 3)


class Text:
    """English-like sentences: 40 % stop words (as in English prose), the rest content words of
    a 5,000-word vocabulary drawn by Zipf's law (the most common content word ~1 % of them)."""

    def __init__(self, seed: int = 1) -> None:
        self.rng = random.Random(seed)
        self.stop_words = sorted(w for w in STOP_WORDS if len(w) > 1)
        self.words = [w for w in vocabulary() if w not in STOP_WORDS][:5000]
        random.Random(0).shuffle(self.words)  # Zipf ranks unrelated to the vocabulary's order
        weights = 1.0 / (np.arange(1, 5001) + 10) ** 1.1
        self.cumulative = list(np.cumsum(weights / weights.sum()))

    def sentence(self, low: int = 5, high: int = 14) -> str:
        words = []
        for _ in range(self.rng.randint(low, high)):
            if self.rng.random() < 0.4:
                words.append(self.rng.choice(self.stop_words))
            else:
                rank = min(4999, bisect.bisect(self.cumulative, self.rng.random()))
                words.append(self.words[rank])
        return " ".join(words)


async def generate(
    engine: Any, model: str, dim: int, total: int, users: dict[str, int] | None = None
) -> dict[str, int]:
    """Memories of `users` (name -> count; default `u1k`, `u10k`, `u100k`), then filler users
    of 1,000 memories each up to `total`; random unit vectors stored as `model`'s."""
    users = dict(users or {f"u{size // 1000}k": size for size in SIZES})
    filler = max(0, total - sum(users.values()))
    users.update({f"filler{i}": 1000 for i in range(filler // 1000)})
    text = Text()
    rng = np.random.default_rng(2)
    now = datetime.now(UTC)
    started = time.perf_counter()
    done = 0
    for user, size in users.items():
        async with engine.begin() as connection:  # a transaction per user keeps the WAL small
            for start in range(0, size, 5000):
                n = min(5000, size - start)
                vectors = rng.standard_normal((n, dim)).astype(np.float32)
                vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
                rows = [
                    {
                        "id": str(uuid.uuid4()), "user_id": user, "content": text.sentence(),
                        "type": "fact", "metadata": {}, "source": "import", "pinned": False,
                        "created_at": now, "updated_at": now, "recall_count": 0,
                        "embedding": vectors[i].astype("<f4").tobytes(), "embedding_model": model,
                        "seq": 1,
                    }
                    for i in range(n)
                ]  # fmt: skip
                await connection.execute(Memory.__table__.insert(), rows)
                done += n
            await connection.execute(
                UserState.__table__.insert(), [{"user_id": user, "version": 1}]
            )
            if done % 100_000 < 1000:
                print(f"  generated {done:,} memories ({time.perf_counter() - started:.0f} s)")
    return users


def prose(count: int) -> list[str]:
    """`count` distinct English sentences (6-40 words) from the docstrings of the installed
    packages, in a fixed order: real text none of the questions is about."""
    found: dict[str, None] = {}
    for folder in sorted(Path(p) for p in site.getsitepackages()):
        for path in sorted(folder.rglob("*.py")):
            try:
                tree = ast.parse(path.read_text(encoding="utf-8"))
            except (SyntaxError, UnicodeDecodeError, ValueError, OSError):
                continue
            for node in ast.walk(tree):
                if not isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef):
                    continue
                doc = ast.get_docstring(node) or ""
                for sentence in re.split(r"(?<=[.!?])\s+", " ".join(doc.split())):
                    if 6 <= len(sentence.split()) <= 40 and sentence[0].isupper():
                        found[sentence] = None
                        if len(found) == count:
                            return list(found)
    raise SystemExit(f"only {len(found)} sentences of prose found, not {count}")


def recombined(
    conversation: dict[str, Any], cited: set[str], count: int, seed: int = 7
) -> list[str]:
    """`count` distinct memories in a LoCoMo conversation's own words and form, for a store of
    the same life many times larger: each ``[<a session's date>] <a speaker>: `` and one to
    three sentences that speaker said, each from a different turn, none from a turn of `cited`
    (the ids its questions cite as evidence: so no copy of an answer). Near the questions,
    unlike :func:`prose`: the same people, topics and dates."""
    rng = random.Random(seed)
    talk = conversation["conversation"]
    dates: list[str] = []
    turns: dict[str, list[list[str]]] = {}  # speaker -> their uncited turns' sentences
    for key, session in talk.items():
        if not (re.fullmatch(r"session_\d+", key) and isinstance(session, list)):
            continue
        dates.append(talk.get(f"{key}_date_time", ""))
        for turn in session:
            sentences = [
                s for s in re.split(r"(?<=[.!?])\s+", turn["text"].strip()) if len(s.split()) >= 3
            ]
            if turn["dia_id"] not in cited and sentences:
                turns.setdefault(turn["speaker"], []).append(sentences)
    speakers = sorted(turns)
    found: dict[str, None] = {}
    for _ in range(count * 20):
        speaker = rng.choice(speakers)
        picked = rng.sample(turns[speaker], min(rng.randint(1, 3), len(turns[speaker])))
        said = " ".join(rng.choice(sentences) for sentences in picked)
        found[f"[{rng.choice(dates)}] {speaker}: {said}"] = None
        if len(found) == count:
            return list(found)
    raise SystemExit(f"only {len(found)} distinct recombined memories, not {count}")
