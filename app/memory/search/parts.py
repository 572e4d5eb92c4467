"""What of a memory is embedded: the whole text, and each of its sentences when it has several.

A long memory's single vector blurs what it says; scoring the memory by its best-matching part
(the whole or one sentence, "max-sim") finds it by any one of its statements. Measured on the
LoCoMo dev conversations (``bench/recall_eval.py``): +3 points of recall@5 and @10.

Each sentence is embedded with the memory's leading label, when it has one: a short prefix ending
in ``": "`` such as a speaker in a transcript (``[8 May 2023] Caroline: ...``) or a topic in a note
(``Work: ...``). Without it a sentence loses who and when it is about (measured: -5 points).

A key enrichment gave a sentence of context (after :data:`CONTEXT_MARK`,
:mod:`app.memory.learning.enrichment`) is embedded as its words are, with the context as one more
part (its last): whoever embeds it again (a new model, a memory put back) gets the same vectors.
The split of a key without one is unchanged (``SCHEME`` stays): no stored vector is made stale.

In the FAISS index a part's id is ``key << PART_BITS | part`` (part 0 is the whole text, its
words for an enriched key), still one int64 per vector; the store keeps all of a memory's
vectors in its ``embedding`` column, the whole text's first.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from app.memory.search.embedder import TextEmbedder

PART_BITS = 5
MAX_PARTS = 1 << PART_BITS
"""The whole text and at most 31 sentences (more are grouped into 31 runs of sentences; an
enriched key's words into 30, its context the last part)."""
MIN_WORDS = 3
"""Shorter sentences ("Wow!", "Thanks, Mel!") say nothing on their own and are not embedded."""
LABEL_MAX_CHARS = 80

SCHEME = "parts-v1"
"""Stored with the model name: a change to how memories are split re-embeds them."""
EMBED_BATCH = 64

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=\S)")
_LABEL = re.compile(rf"^(.{{1,{LABEL_MAX_CHARS}}}?:)\s", re.S)


CONTEXT_MARK = "\n\x1e"
"""What comes before the sentence of context in an enriched memory's index key: a record
separator no one types (a user's own "Context: ..." line is words like any other), and no word
for BM25 to read."""


def plain_key(key: str) -> str:
    """A memory's index key without the context enrichment gave it."""
    return key.split(CONTEXT_MARK, 1)[0]


def with_context(key: str, context: str) -> str:
    """A memory's index key with `context` (in place of any it had)."""
    return f"{plain_key(key)}{CONTEXT_MARK}{context}"


def parts_of(text: str) -> list[str]:
    """The texts to embed for a memory, at most :data:`MAX_PARTS`: the whole first, then its
    sentences (if two or more have at least MIN_WORDS words; runs of them when there are more
    than fit), each carrying the memory's label. An enriched key's are its words' (the words
    whole first: what consolidation compares), then its context."""
    words, mark, context = text.partition(CONTEXT_MARK)
    if mark:
        return [*_parts_of_words(words, MAX_PARTS - 1), context]
    return _parts_of_words(text, MAX_PARTS)


def _parts_of_words(text: str, most: int) -> list[str]:
    label_match = _LABEL.match(text)
    label = label_match.group(1) if label_match and "\n" not in label_match.group(1) else ""
    body = text[len(label) :].strip() if label else text
    sentences = [s for s in _SENTENCE_END.split(body) if len(s.split()) >= MIN_WORDS]
    if len(sentences) < 2:
        return [text]
    if len(sentences) > most - 1:
        size = -(-len(sentences) // (most - 1))  # ceiling division
        sentences = [" ".join(sentences[i : i + size]) for i in range(0, len(sentences), size)]
    return [text, *(f"{label} {s}" if label else s for s in sentences)]


KEY_FACT_CHARS = 1500
"""Most characters the facts add to an episode's key: a job writes a few facts from one turn,
while an import's lines may link an episode to any number of long ones (a key is embedded,
indexed and stored: it must stay about the size of the words it keys)."""


def index_key(text: str, facts: Sequence[str]) -> str:
    """The key an episode (`text`, the user's words) is found by: its words, then the facts
    written from it, each as a sentence of its own, as many as fit in :data:`KEY_FACT_CHARS`
    (the learning path's and an import's: :func:`app.memory.learning.episodes.index_keys`)."""
    added: list[str] = []
    room = KEY_FACT_CHARS
    for fact in facts:
        sentence = _sentence(fact)
        if len(sentence) + 1 > room:
            continue  # too long for what is left; a shorter one after it may still fit
        added.append(sentence)
        room -= len(sentence) + 1
    return " ".join([text, *added])


def _sentence(text: str) -> str:
    text = " ".join(text.split())
    return text if text.endswith((".", "!", "?")) else f"{text}."


def parts_ids(keys: np.ndarray, parts: np.ndarray) -> np.ndarray:
    """The FAISS ids of each key's parts (``key << PART_BITS | part``, `parts[i]` of key
    `keys[i]`), key after key, in one array operation."""
    starts = np.cumsum(parts) - parts
    within = np.arange(int(parts.sum()), dtype=np.int64) - np.repeat(starts, parts)
    ids: np.ndarray = (np.repeat(keys.astype(np.int64), parts) << PART_BITS) + within
    return ids


def key_of(ids: np.ndarray) -> np.ndarray:
    return ids >> PART_BITS


def decode(embedding: bytes, dim: int) -> np.ndarray:
    """A stored embedding as (parts, dim) float32."""
    return np.frombuffer(embedding, dtype="<f4").reshape(-1, dim).astype(np.float32)


def encode(vectors: np.ndarray) -> bytes:
    return np.ascontiguousarray(vectors, dtype="<f4").tobytes()


def vector_model(embedder: TextEmbedder) -> str:
    """What the store records as a memory's `embedding_model`."""
    return f"{embedder.model_name}/{SCHEME}"


async def embed_memories(embedder: TextEmbedder, texts: Sequence[str]) -> list[np.ndarray]:
    """Each text's (parts, dim) vectors. Each different part is embedded once (an exchange's
    memories share their context), shortest first, in batches, so a batch pads little (the
    model runs on the longest text of its batch)."""
    parts = [parts_of(text) for text in texts]
    unique = sorted(dict.fromkeys(part for each in parts for part in each), key=len)
    vectors = np.zeros((len(unique), embedder.dim), dtype=np.float32)
    for start in range(0, len(unique), EMBED_BATCH):
        vectors[start : start + EMBED_BATCH] = await embedder.embed(
            unique[start : start + EMBED_BATCH]
        )
    at = {part: i for i, part in enumerate(unique)}
    return [vectors[[at[part] for part in each]] for each in parts]


@dataclass(frozen=True, slots=True)
class Embedded:
    """A memory's text embedded for the store: its vectors, and what a row keeps of them."""

    vectors: np.ndarray
    """(parts, dim), as :func:`embed_memories` gives them."""
    embedding: bytes
    """The vectors as the row stores them (:func:`encode`)."""
    model: str
    """The row's ``embedding_model`` (:func:`vector_model`)."""


async def embed_for_store(embedder: TextEmbedder, texts: Sequence[str]) -> list[Embedded]:
    """Each text embedded and encoded for its row: the one step every writer of memories (the
    API, an import, the Manager, a re-embedding) takes."""
    model = vector_model(embedder)
    return [Embedded(v, encode(v), model) for v in await embed_memories(embedder, texts)]
