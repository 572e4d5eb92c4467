"""When an exchange becomes a Manager job, and which of its turns are new.

- Only `chat` requests with memory writes allowed (not `task`, not `tool_continuation`, not
  ``X-Memory: off`` or ``read-only``), and only exchanges the client received in full.
- Clients resend the whole conversation every time. Each user turn has a fingerprint (a hash of
  it and the turn before it; never the text) recorded when a job takes it, so a turn is given to
  the Manager once, however often it is resent; the turns before the new ones go along as
  context only.
- Routine exchanges wait until the conversation has ``MEMPROXY_CONVERSATION_THRESHOLD`` user
  messages (until then nothing is fingerprinted, so the first job takes them all). An explicit
  request to remember or forget (:func:`is_explicit`) always makes a job.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from pydantic_ai.messages import ModelMessage, ModelRequest

from app.memory.learning.own_words import asking_words
from app.memory.learning.turns import fingerprints_of, text_of

EXPLICIT = re.compile(
    r"\b(?:"
    r"(?:please\s+)?remember\s+(?:that|this|my|me|i\b|i'm|i've)"
    r"|don'?t\s+forget|do\s+not\s+forget|keep\s+in\s+mind|make\s+a\s+note|take\s+note|note\s+that"
    r"|please\s+note|for\s+future\s+reference|from\s+now\s+on"
    r"|forget\s+(?:that|this|about|what|my|everything)"
    r"|(?:that|this|it)(?:'s|\s+is)\s+no\s+longer\s+(?:true|the\s+case|correct)"
    r"|(?:that|this)\s+(?:isn'?t|is\s+not)\s+true\s+any\s*more|not\s+true\s+any\s*more"
    r"|i\s+no\s+longer|i\s+don'?t\s+\w+\s+any\s*more"
    r")",
    re.IGNORECASE,
)
"""Phrases by which a user asks to remember or forget, or corrects what is known of them."""


REQUEST = re.compile(
    r"^[\s\"'“(*-]*(?:(?:also|and|oh|ok|okay|so|btw|but|hey|please)[,\s]+)*"
    r"(?:(?:can|could|would|will)\s+you\s+(?:please\s+)?)?"
    r"(?:remember|don[’']?t\s+forget|do\s+not\s+forget|keep\s+in\s+mind|note)"
    r"(?:\s*[:,])?\s+(?!(?:what|when|where|how|why|who|which|if|whether)\b)"
    r"(?:that\s+)?(?P<what>.+)",
    re.IGNORECASE | re.DOTALL,
)
"""A sentence that asks to remember something, and what: "Remember that my daughter Mia turns 7
on 3 May", "Please note: I'm allergic to nuts", "Could you remember that I'm vegan?". What it
asks must be about the user (a first-person word in it, :data:`FIRST_PERSON`): "Note that the
function returns None" in a coding chat is no request to remember."""
FIRST_PERSON = re.compile(r"\b(?:i|i'm|i've|i'd|i'll|me|my|mine|we|our|us)\b", re.IGNORECASE)
REQUEST_CHARS = 500
"""A longer request is no single fact: the Manager's reading of it stands."""
_SENTENCES = re.compile(
    r"(?<!\bDr\.)(?<!\bMr\.)(?<!\bMs\.)(?<!\bMrs\.)(?<!\bSt\.)(?<!\bProf\.)"
    r"(?<=[.!?])\s+|\n+"
)


def requested(text: str) -> list[str]:
    """What the text's sentences explicitly ask to remember about the user, as the user put it
    ("My daughter Mia turns 7 on 3 May"), each under :data:`REQUEST_CHARS`. Only the user's own
    words ask (:func:`~app.memory.learning.own_words.own_words`): a request inside code, a
    quotation, a pasted email or document, or Open WebUI's retrieved context is none, and a
    message that carries a text to work on has none
    (:func:`~app.memory.learning.own_words.asking_words`). A question
    is a request only when it asks "can you / could you remember..."."""
    if is_document(text):
        return []
    own = asking_words(text)
    found = []
    for start, end in _sentence_spans(own):
        sentence = own[start:end]
        lead = len(sentence) - len(sentence.lstrip())
        match = REQUEST.match(sentence.strip())
        if match is None:
            continue
        asking = sentence.rstrip().endswith("?")
        if asking and not re.search(r"\byou\s+(?:please\s+)?(?:remember|note)", sentence, re.I):
            continue  # "Remember that time we went to Paris?"
        if not FIRST_PERSON.search(match.group("what")):
            continue  # about someone or something else, or the user only quotes it
        # in the user's words as written, to the sentence's end: a quotation inside them stays
        what = text[start + lead + match.start("what") : end].strip(" .!?\n")
        if what and len(what) <= REQUEST_CHARS:
            found.append(what[0].upper() + what[1:])
    return found


def _sentence_spans(text: str) -> list[tuple[int, int]]:
    bounds = [0, *(i for m in _SENTENCES.finditer(text) for i in m.span()), len(text)]
    return [(bounds[i], bounds[i + 1]) for i in range(0, len(bounds), 2)]


TURN_HEAD_CHARS = 6000
TURN_TAIL_CHARS = 2000
"""A turn longer than both together reaches the Manager as its start and its end: what a user
asks to remember sits around a pasted document, not inside its middle, and a 50 MB turn in a job
would stall the worker (its JSON, its prompt) and overflow any model's context."""


MAX_JOB_TURNS = 100
"""The most new turns one job gives the Manager (one call, one prompt). A conversation seen
for the first time with more (memproxy put in front of a long chat, or a chat imported) is
learned from its last turns; the earlier ones are recorded as taken, so that no later job
picks them up either. Routine jobs waiting together merge only within this bound."""
CONTEXT_TURNS = 6
"""Turns before the new ones that a job keeps as context (already processed)."""


def is_document(text: str) -> bool:
    """Whether a user turn is a document, in which nothing is asked by rule (to remember, to
    forget everything): longer than 20 x :data:`REQUEST_CHARS`, or a turn :func:`for_manager`
    cut (its note of what was left out), which was longer still."""
    return len(text) > 20 * REQUEST_CHARS or _CUT_NOTE.search(text, TURN_HEAD_CHARS) is not None


_CUT_NOTE = re.compile(r"\n\[\.\.\. [\d,]+ characters left out \.\.\.\]\n")


def for_manager(text: str) -> str:
    """`text` as a job stores it for the Manager: whole, or its start and end around a note of
    how much was left out."""
    if len(text) <= TURN_HEAD_CHARS + TURN_TAIL_CHARS:
        return text
    cut = len(text) - TURN_HEAD_CHARS - TURN_TAIL_CHARS
    note = f"[... {cut:,} characters left out ...]"
    return f"{text[:TURN_HEAD_CHARS]}\n{note}\n{text[-TURN_TAIL_CHARS:]}"


def is_explicit(text: str) -> bool:
    """True when the text asks to remember or forget something (see :data:`EXPLICIT`). Of a
    long text, only what a job gives the Manager is read (:func:`for_manager`: its start and
    end): a request sits around a pasted document, and the pattern is slow (~150 ns a
    character: a 50 MB turn took 7.5 s, past the chat's bound on writing its job)."""
    return EXPLICIT.search(for_manager(text)) is not None


@dataclass(frozen=True, slots=True)
class Exchange:
    """What a job will give the Manager."""

    context: list[ModelMessage]
    new: list[ModelMessage]
    fingerprints: list[str]
    """Of the new user turns: recorded with the job."""
    explicit: bool
    marks: list[tuple[int, str]] = field(default_factory=list)
    """(index in `context` + `new`, fingerprint) of every user turn: hashing a long turn again
    would cost as much as the first time."""


def exchange(
    turns: Sequence[ModelMessage],
    processed: set[str],
    *,
    threshold: int,
    marks: list[tuple[int, str]] | None = None,
) -> Exchange | None:
    """The exchange to queue, or None: nothing new, or a routine one below the threshold.
    At most :data:`MAX_JOB_TURNS` new turns and :data:`CONTEXT_TURNS` of context.

    `processed` holds the fingerprints of this user's turns already taken by a job; `marks`
    are :func:`fingerprints_of` `turns`, when the caller has them already.
    """
    marks = fingerprints_of(turns) if marks is None else marks
    fresh = [(i, f) for i, f in marks if f not in processed]
    if not fresh:
        return None
    begin = fresh[0][0]
    if len(turns) - begin > MAX_JOB_TURNS:  # the last fresh user turns that fit, from a user turn
        begin = next((i for i, _ in fresh if len(turns) - i <= MAX_JOB_TURNS), fresh[-1][0])
    new = list(turns[begin:])
    explicit = any(is_explicit(text_of(t)) for t in new if isinstance(t, ModelRequest))
    if not explicit and len(marks) < threshold:
        return None
    start = max(0, begin - CONTEXT_TURNS)
    kept = [(i - start, f) for i, f in marks if i >= start]
    # Every fresh fingerprint goes with the job: the turns left out are taken all the same.
    return Exchange(list(turns[start:begin]), new, [f for _, f in fresh], explicit, kept)
