"""What the user said in a job's new turns, as the texts of episodes.

An episode keeps the user's own words beside the facts the Manager draws from them (issue 25):
a fact loses what the user did not think to say twice, the words keep it. :func:`episode_texts`
turns the job's new user turns into episode texts:

- only the user's own words (:func:`~app.memory.learning.own_words.own_words`: no pasted email,
  code, quotation or retrieved document), whitespace collapsed;
- a long turn in passages of at most :data:`SENTENCES` sentences and :data:`PASSAGE_CHARS`
  characters, cut between sentences (a sentence longer than that, between words);
- a short answer to the assistant's question ("No.", "Twice a week") with that question, which
  it needs to mean anything: ``No. (answering "Do you eat honey?")``.

Nothing here writes: the applier stores the episodes (:func:`episode_row`) in the job's own
unit of work, with a link from each fact the job wrote to the episodes it came from
(:func:`sources_of`); a job parked as failed stores them as it parks
(:mod:`app.memory.learning.parking`).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Sequence
from datetime import datetime

from pydantic_ai.messages import ModelMessage

from app.memory.learning.own_words import own_words
from app.memory.learning.turns import role_of, text_of
from app.memory.search.lexical import STOP_WORDS
from app.memory.search.parts import Embedded, index_key
from app.memory.search.user_index import UserIndex
from app.memory.store.tables import Memory, MemorySource, MemoryType
from app.memory.store.unit import Writer

SENTENCES = 4
"""Sentences in one passage at most: a passage is recalled whole, so it must stay on one
subject, and keep the sentence that says what the next ones are about ("I signed up for a
pottery class. It's like therapy for me"). Measured with bench/pipeline_eval.py (rules Manager,
dev file, "both", questions in the first person, threshold 0.15): 3 sentences / 600 characters
.876 evidence recall, 4 / 800 .882, 6 / 1,000 .881 with 47 more tokens a chat."""
PASSAGE_CHARS = 800
SHORT_ANSWER_WORDS = 6
"""An answer of at most this many words to a question of the assistant's is kept with it."""
QUESTION_CHARS = 300
"""Longest question kept beside a short answer (its end, where the question is)."""

_SENTENCE_END = re.compile(r"(?<=[.!?…])\s+|\n+")
_QUESTION = re.compile(r"[^.!?\n]*\?")


def episode_texts(context: Sequence[ModelMessage], new: Sequence[ModelMessage]) -> list[str]:
    """The episodes of the user turns in `new` (`context`: the turns before them, for the
    assistant's question a short answer replies to), in the order they were said."""
    texts: list[str] = []
    asked = _last_assistant(context)
    for message in new:
        if role_of(message) == "assistant":
            asked = text_of(message)
            continue
        said = own_words(text_of(message)).replace("\x00", "")  # PostgreSQL's text refuses it
        said = without_requests_to_forget(said)
        words = " ".join(said.split())
        if not words:
            continue
        short = len(words.split()) <= SHORT_ANSWER_WORDS and len(words) <= PASSAGE_CHARS
        question = _question(asked) if short else None
        if question:
            texts.append(f'{words} (answering "{question}")')
        else:
            texts.extend(passages(said))
        asked = ""
    return texts


_FORGETTING = re.compile(
    r"^[\s\"'“(*-]*(?:(?:ok|okay|so|and|also|now|hey|oh|actually|please|just)[,\s]+)*"
    r"(?:(?:can|could|would|will)\s+you\s+|i\s+(?:want|need|would\s+like|'d\s+like)\s+you\s+to\s+)?"
    r"(?:please\s+)?(?:forget|unlearn|stop\s+remembering|do(?:n[’']?t|\s+not)\s+remember"
    r"|(?:delete|erase|remove|wipe|drop)\b(?=.*\b(?:memor|remember|know|said|told|fact)))",
    re.IGNORECASE,
)
"""A sentence that asks to forget something: "Please forget that I am vegetarian", "Can you
delete what you know about my job?" (not "I always forget my keys", nor "Don't forget that...")."""


def without_requests_to_forget(text: str) -> str:
    """`text` without its sentences that ask to forget something (:data:`_FORGETTING`): such a
    request holds the very words being forgotten, and an episode of it would bring them back."""
    sentences = _SENTENCE_END.split(text)
    kept = [s for s in sentences if not _FORGETTING.match(s)]
    return text if len(kept) == len(sentences) else "\n".join(kept)


def passages(text: str) -> list[str]:
    """`text` in passages of whole sentences (:data:`SENTENCES`, :data:`PASSAGE_CHARS`)."""
    sentences = [" ".join(s.split()) for s in _SENTENCE_END.split(text)]
    pieces = [piece for s in sentences if s for piece in _cut(s)]
    out: list[str] = []
    current: list[str] = []
    for piece in pieces:
        joined = " ".join([*current, piece])
        if current and (len(current) >= SENTENCES or len(joined) > PASSAGE_CHARS):
            out.append(" ".join(current))
            current = []
        current.append(piece)
    if current:
        out.append(" ".join(current))
    return out


def _cut(sentence: str) -> list[str]:
    """A sentence longer than a passage, between words."""
    if len(sentence) <= PASSAGE_CHARS:
        return [sentence]
    out, current = [], ""
    for word in sentence.split(" "):
        if current and len(current) + 1 + len(word) > PASSAGE_CHARS:
            out.append(current)
            current = ""
        current = f"{current} {word}" if current else word[:PASSAGE_CHARS]
    return [*out, current] if current else out


def _last_assistant(context: Sequence[ModelMessage]) -> str:
    """What the assistant said last, when it spoke last (else the new turn answers nothing)."""
    if context and role_of(context[-1]) == "assistant":
        return text_of(context[-1])
    return ""


def _question(text: str) -> str | None:
    """The last question the assistant's message ends with, or None when it asks nothing."""
    stripped = text.rstrip()
    if not stripped.endswith("?"):
        return None
    found = _QUESTION.findall(stripped[-QUESTION_CHARS:])
    return " ".join(found[-1].split()) if found else None


def episode_row(
    user_id: str,
    text: str,
    embedded: Embedded,
    *,
    written: datetime,
    said: datetime,
    key: str | None = None,
) -> Memory:
    """The memory of kind ``episode`` that keeps `text`, said at `said`, found by `key` (its
    index key, :func:`index_keys`; `embedded` is the key's) when that is more than the text."""
    return Memory(
        id=str(uuid.uuid4()), user_id=user_id, content=text, type=MemoryType.EPISODE.value,
        meta={}, source=MemorySource.MANAGER.value, pinned=False, profile=False,
        created_at=written, updated_at=written, observed_at=said, recall_count=0,
        embedding=embedded.embedding, embedding_model=embedded.model,
        index_text=key if key and key != text else None,
    )  # fmt: skip


def index_keys(
    episodes: Sequence[str], facts: Sequence[str], earlier: Sequence[Sequence[str]] = ()
) -> list[str]:
    """Each episode's index key: its text, then the facts linked to it before (`earlier`, by
    position: a stored episode's), then those written from it now (those :func:`sources_of`
    gives it), each as a sentence of its own. LongMemEval's key expansion:
    a question that names what the fact says ("vegetarian") finds the words the user said it
    in ("I stopped eating meat years ago"), and the dense parts of the key
    (:mod:`app.memory.search.parts`) include each fact's sentence."""
    drawn: dict[int, list[str]] = {}
    for fact in facts:
        for at in sources_of(fact, [(str(i), text) for i, text in enumerate(episodes)]):
            drawn.setdefault(int(at), []).append(fact)
    before = [*earlier, *[()] * (len(episodes) - len(earlier))]
    return [
        index_key(text, list(dict.fromkeys([*before[i], *drawn.get(i, ())])))
        for i, text in enumerate(episodes)
    ]


def sources_of(fact: str, episodes: Sequence[tuple[str, str]]) -> list[str]:
    """The ids of the episodes (id, text) a fact was written from: those sharing the most of its
    content words with it; all of them when none shares one (it came from this exchange)."""
    words = _content_words(fact)
    shared = [(len(words & _content_words(text)), memory_id) for memory_id, text in episodes]
    best = max((count for count, _ in shared), default=0)
    return [memory_id for count, memory_id in shared if count == best]


def _content_words(text: str) -> set[str]:
    return {w for w in re.findall(r"\w+", text.lower()) if w not in STOP_WORDS and len(w) > 2}


def write_episodes(
    w: Writer,
    episodes: Sequence[tuple[str, str, Embedded]],
    facts: Sequence[tuple[str, str]],
    *,
    written: datetime,
    said: datetime,
    stored: Sequence[tuple[str, str]] = (),
) -> None:
    """Create a job's episodes (text, index key, the key's embedding) in its unit of work `w`,
    and link each of the job's facts (id, text) still there to the episodes it came from
    (:func:`sources_of`), among those and the `stored` ones (id, text: a parked job's, written
    as it parked and given their new keys by :func:`app.memory.store.links.rekey`)."""
    rows = [episode_row(w.user_id, t, e, written=written, said=said, key=k) for t, k, e in episodes]
    for row in rows:
        w.create(row)
    candidates = [*((row.id, row.content) for row in rows), *stored]
    for fact_id, content in facts if candidates else ():
        for episode_id in sources_of(content, candidates):
            w.link(fact_id, episode_id)  # a fact named twice (written, then updated): once


def is_episode(index: UserIndex, key: int) -> bool:
    """Whether the memory `key` of a user's index is an episode: the user's words, which a
    fact never duplicates (a fact a model missed, said again, must still be written)."""
    brief = index.briefs.get(key)
    return brief is not None and brief.type == MemoryType.EPISODE.value
