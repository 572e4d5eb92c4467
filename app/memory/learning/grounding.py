"""Whether a memory the Manager wrote comes from the user's own words.

A memory is what the user said about themselves. Small models write other things: the
assistant's words ("Lyon is a lovely city with plenty of vegetarian restaurants", from the reply
to "I live in Lyon"), an answer to the user's question ("Lives in Canberra" after "What is the
capital of Australia?"), or a fact from the instructions. :class:`Grounds` holds the words the
user said in the job's turns (the new ones and their context) and those of each memory shown;
a NEW or UPDATE is *grounded* when at least :data:`GROUNDED_AT` of its content's words are among
the user's words (or the words of the memory it updates), and fewer of them come from the
assistant's side alone than from the user's ("Lives in Canberra": "live" is the user's,
"Canberra" the assistant's). The user's questions are not their words here: what the user only
asks about is no memory ("Capital of Australia is Canberra" after "What is the capital of
Australia?" was stored); a question about themselves is. A relative date the user said counts
also as the date it stands for on the job's day ("yesterday" grounds "30 April 2024": the
Manager is told to write absolute dates, :mod:`app.memory.learning.dates`). A DELETE is
grounded when the memory it names shares a word with the user's, or the user asked to forget
everything: a 1.5B model
answered "Please forget that I am vegetarian" with a DELETE of the only memory shown, "Lives in
Paris". A stale memory is cheaper than a lost one: "I don't eat meat any more" does not delete
"Loves steak" (no shared word), nor "forget what I told you about my job" "Works as a nurse".

What the user explicitly asked to remember is not left to the model: :func:`with_requests` adds
it, in the user's words, when the answer leaves it out.

A name the memory gives (a capitalised word past its first) must have been said in the chat,
by either side, or be in the memory it updates: the 0.5B copied the instructions' made-up
"Moved to Madrid" with "last month" said, which half the words alone let through.

Words are compared as recall's lexical side indexes them (:class:`~app.memory.search.lexical.
Analyzer`: lower-cased, stop words dropped, Snowball-stemmed), so a memory in the third person
("Lives in Lyon", "Works as a nurse") is grounded in "I live in Lyon", "I'm a nurse". What this
cannot tell: a fact the user only confirms ("No" to "Do you eat honey?" gives "Does not eat
honey", whose words are the assistant's) is refused; a question the user asks, written as a
statement with the user's own words, passes.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse

from app.memory.learning.dates import absolute_dates
from app.memory.learning.decisions import Op, Operation
from app.memory.learning.extraction import FIRST_PERSON, is_document, requested
from app.memory.learning.own_words import asking_words, own_words, without_quotations
from app.memory.learning.prompt import Shown
from app.memory.learning.turns import text_of
from app.memory.search.lexical import Analyzer

GROUNDED_AT = 0.5
"""The share of a memory's words (stems, stop words left out) that must be the user's: the
third person rewrites a verb ("I'm a nurse" -> "Works as a nurse": 1 of 2), and an assistant's
sentence about the user's city shares the city and little else (2 of 6)."""


@dataclass(frozen=True, slots=True)
class Grounds:
    """The words a job's memories may be made of."""

    said: frozenset[str]
    """The stems of the user's words in the job's turns, questions left out."""
    heard: frozenset[str]
    """The stems of the assistant's words in the job's turns that the user did not say."""
    shown: dict[int, frozenset[str]]
    """The stems of each memory shown, by the number it was shown with."""
    analyzer: Analyzer
    texts: dict[int, str] = field(default_factory=dict)
    """The text of each memory shown, by its number."""
    erasing: bool = False
    """The user asked, in their own words, to forget everything (:func:`erases_everything`): any
    DELETE goes, as such a request names no memory's words."""

    @classmethod
    def of(
        cls,
        turns: Sequence[ModelMessage],
        shown: Sequence[Shown],
        new: Sequence[ModelMessage] | None = None,
        said_on: datetime | None = None,
    ) -> Grounds:
        """The grounds of a job: its turns (context and new; the user's are read) and the
        memories it showed the Manager. Only a `new` turn (all `turns` when not given) asks to
        forget everything: one in the context was applied by an earlier job. With `said_on`
        (the job's date), the user's relative dates are their words also as the dates they
        stand for ("yesterday" grounds "on 30 April 2024": the Manager is told to write so)."""
        analyzer = Analyzer()
        users = [own_words(text_of(t)) for t in turns if isinstance(t, ModelRequest)]
        if said_on is not None:
            users += [dated for u in users if (dated := absolute_dates(u, said_on)) != u]
        said = frozenset(analyzer.terms(" ".join(_statements(text) for text in users)))
        heard = analyzer.terms(" ".join(text_of(t) for t in turns if isinstance(t, ModelResponse)))
        return cls(
            said,
            frozenset(heard) - said,
            {m.alias: frozenset(analyzer.terms(m.content)) for m in shown},
            analyzer,
            {m.alias: m.content for m in shown},
            any(
                erases_everything(text_of(t))
                for t in (turns if new is None else new)
                if isinstance(t, ModelRequest)
            ),
        )

    def refusal(self, operation: Operation) -> str | None:
        """Why `operation` is not grounded in the user's words; None when it is."""
        if operation.op is Op.DELETE:
            named = self.shown.get(operation.id or 0)
            if named is None or self.erasing or named & self.said:
                return None  # an unknown number fails in the applier, saying so
            return "the memory it deletes shares no word with what the user said"
        if not operation.content:
            return None
        words = set(self.analyzer.terms(operation.content))
        if not words:
            return None  # nothing to weigh ("Is 7"): the applier's other rules decide
        allowed = self.said | self.shown.get(operation.id or 0, frozenset())
        found = len(words & allowed)
        borrowed = len((words - allowed) & self.heard)
        if found >= GROUNDED_AT * len(words) and borrowed < found:
            unsaid = self._unsaid_names(operation.content, allowed)
            if not unsaid:
                return None
            return f"it names what no one in the chat said: {', '.join(sorted(unsaid))}"
        others = ", ".join(sorted(words - allowed))
        return f"{found} of its {len(words)} words are the user's (not: {others})"

    def _unsaid_names(self, content: str, allowed: frozenset[str]) -> set[str]:
        """The names in `content` (capitalised words past its first, months and days aside)
        that neither side of the chat said, nor the memory it updates: a small model copies the
        instructions' made-up examples ("Moved to Madrid in May 2023", the 0.5B on LoCoMo)."""
        names = {w for w in _NAME.findall(content) if w.lower() not in CALENDAR}
        return {n for n in names if not set(self.analyzer.terms(n)) <= allowed | self.heard}


CALENDAR = frozenset(
    "january february march april may june july august september october november december "
    "monday tuesday wednesday thursday friday saturday sunday".split()
)


def with_requests(
    operations: list[Operation], turns: Sequence[ModelMessage], grounds: Grounds
) -> list[Operation]:
    """`operations`, and a NEW for each thing a user turn explicitly asked to remember
    (:func:`~app.memory.learning.extraction.requested`) that no NEW or UPDATE, nor a memory
    shown, holds (half of its words or more, and every name it gives): what the user asked for
    is stored in their words rather than lost. A NEW of the answer made of the request's words
    alone (a fragment of it) then goes: the request says it whole.

    A 1.5B model answered "Remember that my daughter Mia turns 7 on 3 May" with no operation
    when the chat's model had replied "I'm sorry, but I can't assist with that", and once with
    "Turns 7 on 3 May": half the words, without whose birthday it is."""
    terms = grounds.analyzer.terms
    written: list[tuple[set[str], Operation | None]] = [
        (set(terms(o.content or "")), o) for o in operations if o.op is not Op.DELETE
    ]
    written += [(set(words), None) for words in grounds.shown.values()]  # known already
    kept, added = list(operations), []
    for turn in turns:
        if not isinstance(turn, ModelRequest):
            continue
        for what in requested(text_of(turn)):
            words, names = set(terms(what)), set(terms(" ".join(_NAME.findall(what))))
            if not words or any(
                len(words & w) >= GROUNDED_AT * len(words) and names <= w for w, _ in written
            ):
                continue
            fragments = [o for w, o in written if o is not None and o.op is Op.NEW and w <= words]
            kept = [o for o in kept if all(o is not f for f in fragments)]
            added.append(Operation(op=Op.NEW, content=what))
            written.append((words, None))
    return [*kept, *added]


_NAME = re.compile(r"(?<=\w )[A-Z][\w'-]*")
"""A capitalised word that does not begin the text: a name, a place, a month ("Mia", "May")."""
_ERASING = re.compile(
    r"^[\s*(\-—–]*(?:(?:ok|okay|so|and|now|also|hey|actually|please|just)[,\s—–-]+)*"
    r"(?:(?:can|could|would|will)\s+you\s+|i\s+(?:want|need)\s+you\s+to\s+)?(?:please\s+)?"
    r"(?:forget|erase|delete|remove|wipe|clear)\s+"
    r"(?:everything|all(?:\s+(?:of\s+)?(?:it|that|this|my\s+memories|your\s+memor(?:y|ies)))?"
    r"|(?:whatever|what|all)\s+you\s+(?:know|remember)|your\s+memor(?:y|ies))\b"
    r"(?!\s+(?:about|regarding|concerning|on|related|in|of|to\s+do|from\s+(?!before\b))\b"
    r"(?!\s+(?:me|myself|us)\b))"
    r"|^[\s*(\-—–]*(?:please\s+)?(?:reset|wipe|clear|erase)\s+your\s+memor(?:y|ies)\b",
    re.IGNORECASE,
)
"""A sentence that asks to forget everything: "Please forget everything you know about me",
"Can you erase all of it?". Not "... forget everything about our old plan" (that names what)."""


def erases_everything(text: str) -> bool:
    """True when a user turn asks, in the user's own words, to forget everything: a sentence
    of theirs that begins by asking it, in a message that carries no text to work on, outside
    any quotation ("the ticket says please forget everything", 'Customer wrote: "Forget
    everything."' and "Reply to this ticket: forget everything we discussed" do not)."""
    if is_document(text):
        return False
    asked = without_quotations(asking_words(text))
    return any(_ERASING.match(s) for s in _CLAUSE.split(asked))


_CLAUSE = re.compile(r"(?<=[.!?;])\s+|\n+")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_ASKING = re.compile(
    r"(?:what|when|where|which|who|whom|whose|why|how|is|are|am|was|were|do|does|did|can|could|"
    r"should|would|will|shall|may|might|have|has|had)\b",
    re.IGNORECASE,
)


def _statements(text: str) -> str:
    """A user turn's text without the questions that say nothing of the user: sentences that
    end with "?", begin as a question does and hold no first-person word ("What is the capital
    of Australia?" goes; "Did I tell you I moved to Berlin?" and "I live in Oslo, what about
    you?" stay)."""
    return " ".join(s for s in _SENTENCE_END.split(text) if not _asks_only(s))


def _asks_only(sentence: str) -> bool:
    return (
        sentence.rstrip().endswith("?")
        and _ASKING.match(sentence.lstrip()) is not None
        and FIRST_PERSON.search(sentence) is None
    )
