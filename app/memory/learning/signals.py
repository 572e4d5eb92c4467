"""How a sentence sounds: a fact of the user's own life, or a remark about life in general. The
rules that hold a small model's labels (:mod:`app.memory.learning.choosing`) to what the words
say.

On LoCoMo the 1.5B labelled "nothing" for "I ran a charity race for mental health last
Saturday", "It made me reflect on how far I've come since I started transitioning three years
ago" and "5 years already!" (answering "How long have you been married?"), and "identity" for
"Family is everything." and "We can tackle life's challenges together!". So:

- :func:`tells_of_the_user`: the user in the first person with something that happened, a plan,
  a date or a number, or a person of theirs ("my husband"); "we" with something that happened
  or a date; or an answer to the assistant's question that gives a date or a number. Such a
  sentence is kept whatever the model said.
- :func:`said_label`: a request to forget, or a change of what was true, is labelled so.
- :func:`says_nothing_of_the_user`: no "I", no name, no date or number, no answer to a
  question, and "we" only as people in general ("We all have unique paths"). Such a sentence
  gives no memory whatever the model said.
"""

from __future__ import annotations

import re

LASTING = re.compile(
    r"\b(?:i\s+am|i'm|i\s+was\s+born|i\s+work|i\s+live|i\s+study|i\s+have\s+(?:a|an|two|three|"
    r"\d+)\s+\w+|my\s+name|years\s+old|i'm\s+from|i\s+come\s+from|allergic|vegetarian|vegan|"
    r"diabet|pregnant|married|divorced|single|retired|my\s+(?:wife|husband|partner|son|daughter|"
    r"kids|children|mom|mum|mother|dad|father|sister|brother|dog|cat))\b",
    re.IGNORECASE,
)
"""What a lasting fact about a person sounds like: a sentence a small model labels ``identity``
is a profile fact (shown in every chat) only when it says one ("I'm a nurse", "I have two
kids", "I'm allergic to nuts"), not "I was so happy and thankful for all the support"."""
_I = re.compile(r"\b(?:i|i'm|i've|i'd|i'll|me|my|mine|myself)\b", re.IGNORECASE)
_WE = re.compile(r"\b(?:we|we're|we've|we'll|we'd|our|ours|us|ourselves)\b", re.IGNORECASE)
_PAST = re.compile(
    r"\b(?:i|we)\s+(?:\w+\s+)?(?:\w+ed|went|ran|got|made|took|saw|met|had|was|were|did|chose|"
    r"bought|found|gave|left|lost|put|told|said|wrote|came|felt|knew|won|began|built|brought|"
    r"became|taught|caught|drove|flew|grew|kept|sold|spent|swam|threw|wore|ate|hung)\b"
    r"|\b(?:i|we)['’]ve\b|\b(?:i|we)\s+have\s+(?:been|had|done|made|known)\b",
    re.IGNORECASE,
)
_PLAN = re.compile(
    r"\b(?:gonna|going\s+to|will|i['’]ll|we['’]ll|plan|plans|planning|want\s+to|hope\s+to|"
    r"thinking\s+(?:about|of)|looking\s+forward|about\s+to|dream\s+(?:of|is)|goal)\b",
    re.IGNORECASE,
)
_MONTHS = "january|february|march|april|may|june|july|august|september|october|november|december"
_DATE = re.compile(
    r"\d(?![\d.,]*\s*%)|\b(?:yesterday|today|tonight|tomorrow|ago|since|last\s+\w+|next\s+\w+|"
    r"this\s+(?:week|weekend|month|year|summer|winter|spring|fall|autumn)|years?|months?|weeks?|"
    r"two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|twenty|"
    rf"{_MONTHS}|monday|tuesday|wednesday|thursday|friday|saturday|sunday)\b",
    re.IGNORECASE,
)
_PEOPLE = re.compile(
    r"\bmy\s+(?:\w+\s+)?(?:wife|husband|partner|boyfriend|girlfriend|fianc[eé]e?|son|sons|"
    r"daughter|daughters|kid|kids|child|children|baby|mom|mum|mother|dad|father|parents|"
    r"sister|sisters|brother|brothers|family|friend|friends|grandma|grandpa|grandmother|"
    r"grandfather|aunt|uncle|cousin|niece|nephew|boss|team|colleague|colleagues|dog|dogs|cat|"
    r"cats|pet|pets|mentor|mentors|neighbou?r|roommate)\b",
    re.IGNORECASE,
)
_NAME = re.compile(r"(?<=\w[ ,])(?!I\b|I['’])[A-Z][\w'’-]+")


def tells_of_the_user(sentence: str, *, answering: bool) -> bool:
    """Whether the sentence tells something of the user's own life (the module says how)."""
    if LASTING.search(sentence):
        return True  # "I live in Lyon.": the 1.5B labelled it "nothing"
    if _I.search(sentence) and (
        _PAST.search(sentence) or _PLAN.search(sentence) or _DATE.search(sentence)
        or _PEOPLE.search(sentence)
    ):  # fmt: skip
        return True
    if _WE.search(sentence) and (_PAST.search(sentence) or _DATE.search(sentence)):
        return True
    return answering and _DATE.search(sentence) is not None


def says_nothing_of_the_user(sentence: str, *, answering: bool) -> bool:
    """Whether the sentence is a remark about life in general, or about nothing of theirs."""
    if answering or _I.search(sentence) or _NAME.search(sentence) or _DATE.search(sentence):
        return False
    return not (_WE.search(sentence) and (_PAST.search(sentence) or _PLAN.search(sentence)))


_FORGET = re.compile(
    r"^(?:(?:please|ok|okay|and|also|oh|so|actually)[,\s]+)*(?:(?:can|could|would)\s+you\s+)?"
    r"(?:please\s+)?(?:forget|delete|erase|remove)\s+(?:that|about|what|my|the\s+(?:fact|bit|"
    r"part|memory)|i\b|i'm|everything)",
    re.IGNORECASE,
)
_CHANGED = re.compile(
    r"\b(?:no\s+longer|any\s?more|instead\s+of|used\s+to|not\s+true|not\s+anymore|"
    r"(?:i|i've|we|we've)\s+(?:have\s+)?(?:moved|switched|changed|quit|stopped|left))\b",
    re.IGNORECASE,
)


def said_label(sentence: str) -> str | None:
    """The label the words give whatever the model said: a request to forget ("Please forget
    that I am vegetarian", labelled "nothing" by the 1.5B) is ``forget``; a change of what was
    true ("I have moved: I live in Paris now, not in Lyon any more", "I don't eat meat any
    more") is a ``correction``, which may replace the memory it changes."""
    if _FORGET.search(sentence.strip()) and not sentence.rstrip().endswith("?"):
        return "forget"
    if _CHANGED.search(sentence):
        return "correction"
    return None


def label_by_words(sentence: str) -> str:
    """The label a sentence the rules keep gets when the model said "nothing": who they are is
    an ``identity``, what happened an ``event``, what is to come a ``plan``, a person of theirs
    a ``relationship``."""
    if LASTING.search(sentence):
        return "identity"
    if _PAST.search(sentence):
        return "event"
    if _PLAN.search(sentence):
        return "plan"
    if _PEOPLE.search(sentence):
        return "relationship"
    return "event"
