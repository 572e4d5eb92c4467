"""What a user says that is never a memory, told by rule: greetings, thanks, farewells, filler,
and questions about the other person or the world.

Used twice by the two-step Manager (:mod:`app.memory.learning.staged`): before the model, so
that such sentences never reach it (:func:`small_talk`: a sentence of the user's), and after
it, so that what a model wrote of them is not stored (:func:`idle_memory`: "Says hi to Mel",
"Greets Mel", "Is doing great"). A sentence that tells anything of the user stays: a name, a
number, or a word outside the small-talk vocabulary makes it a candidate, and only the model
says whether it lasts. The rules miss small talk rather than drop a fact: "Good to see you!"
goes, "Good to see you, I just got back from Paris!" stays.
"""

from __future__ import annotations

import re

from app.memory.learning.extraction import FIRST_PERSON

_WORD = re.compile(r"[\w']+")
_GREETING = re.compile(
    r"^(?:hi|hey|hello|hiya|howdy|yo|heya|greetings|good\s+(?:morning|afternoon|evening|night)"
    r"|(?:morning|evening)(?=\s*(?:[!,.]|$))|welcome\s+back|long\s+time\s+no\s+see)\b",
    re.IGNORECASE,
)
_CLOSING = re.compile(
    r"^(?:thanks|thank\s+you|thx|ty|cheers|bye|goodbye|good\s+bye|see\s+(?:you|ya)|take\s+care"
    r"|talk\s+(?:to\s+you\s+)?(?:soon|later)|catch\s+you|have\s+a\s+(?:good|great|nice|lovely)"
    r"|bye\s+for\s+now|later(?=\s*(?:[!,.]|$))|gotta\s+go|got\s+to\s+go"
    r"|nice\s+(?:talking|chatting))\b",
    re.IGNORECASE,
)
FILLER = frozenset(
    """
    a absolutely agree agreed ah aha all also always amazing an and any anyway appreciate are as
    at aw aww awesome awww be been beautiful being best brilliant bye but can cheers congrats
    congratulations cool could cute dear definitely did do does doing done exactly excellent
    fab fabulous fantastic fine for from fun funny glad go going good gorgeous got great guess
    ha haha hahaha happy has have hear heard hello helpful hey hi hmm how i i'd i'll i'm i've
    idea incredible indeed inspiring interesting is it it's its just kind know lol look looks
    lovely love loved lucky man me mean meant much my nice no nope not now of oh ok okay omg
    on one oops or perfect pleasure pretty proud really right same say see seems so sorry sound
    sounds super sure sweet talk talking thank thanks that that's the there they this those
    thx to too totally true ty uh um understand very was way we well were what whoa wonderful
    wow yay yeah yep yes you you're your yours yup
    """.split()
)
"""Words that tell nothing of the user on their own: a sentence made only of these ("Wow,
that's so cool!", "I'm so happy for you!", "Yeah, I know right") is filler."""
_EXCLAIMING = re.compile(
    r"^(?:(?:wow|oh|ooh|aw+|omg)[,!.\s]+)*(?:what|such)\s+an?\s+(?:\w+\s+){0,3}\w+\s*!+$", re.I
)
"""An exclamation at what the other person shows: "Wow, what an amazing family pic!"."""
_VOCATIVE = re.compile(r",\s*[A-Z][\w'-]*(?=\s*[.!?]*$)|^[A-Z][\w'-]*,\s*(?=\S)")
_ASKING = re.compile(
    r"^(?:what|when|where|which|who|whom|whose|why|how|is|are|am|was|were|do|does|did|can|"
    r"could|should|would|will|shall|may|might|have|has|had|any|anything|so|and|but|what's|"
    r"how's|how're|where's|who's)\b",
    re.IGNORECASE,
)
_YOU = re.compile(r"^(?i:you|you're|your)\b|\b(?:you|you're|you've|your|yours|yourself|u|ur)\b")
""""you" in lower case, or at the start: "Your Lie in April" (a title) is no "you"."""
_ASKS_ASSISTANT = re.compile(
    r"\b(?:answer|answers|reply|replies|respond|explain|call\s+me|remember|forget|note|remind"
    r"|keep\s+(?:it|your|answers)|shorter|in\s+(?:english|french|german|spanish|bullet))\b",
    re.IGNORECASE,
)
"""What a sentence without "I" that asks the assistant something says: kept for the model
("Can you keep your answers short?", "Please answer in French")."""
SHORT_WORDS = 3
"""A sentence of fewer words with no digit, no name and no "I" tells nothing lasting ("Nah.",
"Gotcha!", "Congrats!"); "I'm vegan." reaches the model."""
GREETING_WORDS = 6
"""A greeting or a closing this long or shorter is only that ("Hey Mel, how are you?"); a longer
one goes on to say something ("Thanks, my daughter Mia loved the cake")."""


def _words(text: str) -> list[str]:
    return _WORD.findall(text.replace("’", "'"))


def _has_name(text: str) -> bool:
    """A capitalised word after the first ("Went to Paris"), or a digit: something to keep."""
    words = _words(text)
    return any(ch.isdigit() for ch in text) or any(
        w[:1].isupper() and w not in ("I", "I'm", "I've", "I'd", "I'll") for w in words[1:]
    )


def small_talk(sentence: str) -> str | None:
    """Why a sentence of the user's is small talk that no memory comes from (``greeting``,
    ``thanks``, ``filler``, ``question``, ``other``: only about the other person, ``short``),
    or None when the model should read it."""
    text = sentence.strip().strip("*_\"'“”()- ")
    words = _words(text)
    if not words:
        return "filler"
    if _GREETING.match(text) and len(words) <= GREETING_WORDS:
        return "greeting"
    if _CLOSING.match(text) and len(words) <= GREETING_WORDS:
        return "thanks"
    # a name the user calls the other person by is no fact: "That's awesome, Caroline!"
    text = _VOCATIVE.sub("", text) or text
    words = _words(text)
    if all(w.lower() in FILLER for w in words) or _EXCLAIMING.match(text):
        return "filler"
    if FIRST_PERSON.search(text) is None and _ASKS_ASSISTANT.search(text) is None:
        if text.endswith("?") and _ASKING.match(text):
            return "question"  # about the other person or the world: "How about you?"
        if _YOU.search(text):
            return "other"  # about the other person: "You're doing an awesome job!"
    if len(words) < SHORT_WORDS and not _has_name(text) and FIRST_PERSON.search(text) is None:
        return "short"
    return None


_IDLE_MEMORY = re.compile(
    r"^(?:(?:says|said|exchanges|exchanged|sends|sent)\s+(?:hi|hello|hey|greetings|goodbye|bye"
    r"|thanks|thank\s+you)"
    r"|(?:greets|greeted|thanks|thanked|welcomes|welcomed|hugs|hugged)\s+(?:[A-Z][\w'-]*|the\s+"
    r"(?:assistant|other|friend))\s*[.!]?$"
    r"|(?:is|was|feels|felt)\s+(?:doing\s+)?(?:good|great|fine|okay|ok|well|alright|all\s+"
    r"right)(?:\s+(?:today|now|too))?\s*[.!]?$"
    r"|(?:asks|asked)\s+(?:how|what|if|whether|about)\b"
    r"|.*\b(?:glad|happy|here)\s+to\s+help\b)",
    re.IGNORECASE,
)


def asks(sentence: str) -> bool:
    """Whether a sentence begins as a question does ("How about you?", "Did you go?")."""
    return _ASKING.match(sentence.strip().strip("*_\"'“”()- ")) is not None


def idle_memory(content: str) -> str | None:
    """Why a memory a model wrote is small talk, not a fact of the user (``greeting``,
    ``thanks``, ``filler``, ...), or None. A greeting copied ("Hey Mel!") is one, and so is a
    greeting told ("Says hi to Mel", "Greets Mel", "Is doing great", "Asks how Mel is"), and an
    offer to help the other person ("Sure Sam, they'd be glad to help")."""
    if _IDLE_MEMORY.match(content.strip()):
        return "small talk"
    why = small_talk(content)
    if why == "short":
        return None  # "Is vegan" is short and a fact
    if why in ("other", "question") and _THEM.search(content):
        return None  # the user, in the third person: "Glad you asked, they went to the Rockies"
    return why


_THEM = re.compile(r"\b(?:they|they're|they've|their|theirs|them|themselves)\b", re.IGNORECASE)
_OPENING = re.compile(
    r"^(?:(?:hey|hi|hello|wow|oh|ooh|yeah|yes|well|so|haha+|lol|omg|aw+|ah|ok|okay|"
    r"by\s+the\s+way|btw|anyway|honestly|glad\s+you\s+asked)\b[\s,!.:;-]*)+"
    r"(?:(?-i:[A-Z][\w'-]*)\s*[,!.:;-]+\s*)?",
    re.IGNORECASE,
)


def without_opening(content: str) -> str:
    """`content` without an opening interjection or greeting and the name after it."""
    return _OPENING.sub("", content.strip()).strip() or content.strip()
