"""Small talk by rule (issue 26): what never reaches the two-step Manager's model, and what a model
wrote that is not stored. The sentences are LoCoMo's users' and made-up ones; a sentence that
says anything of the user stays for the model."""

from __future__ import annotations

import pytest

from app.memory.learning.small_talk import idle_memory, small_talk


@pytest.mark.parametrize(("sentence", "why"), [
    ("Hey Mel!", "greeting"), ("Hi Caroline, how are you?", "greeting"),
    ("Good morning!", "greeting"), ("Thanks, Mel!", "thanks"), ("Thank you so much!", "thanks"),
    ("Bye! Take care.", "thanks"), ("Talk soon!", "thanks"), ("Wow, that's so cool!", "filler"),
    ("That's awesome, Caroline!", "filler"), ("I'm so happy for you!", "filler"),
    ("Sounds fun!", "filler"), ("Yeah, I know right", "filler"), ("Me too!", "filler"), ("Good to see you!", "filler"),
    ("How about you?", "question"), ("What did you do this weekend?", "question"),
    ("Is Lyon nice in May?", "question"), ("You're doing an awesome job looking after yourself!",
                                           "other"),
    ("Great that you're prioritizing self-care.", "other"), ("Gotcha!", "short"),
])  # fmt: skip
def test_small_talk_never_reaches_the_model(sentence: str, why: str) -> None:
    assert small_talk(sentence) == why


@pytest.mark.parametrize("sentence", [
    "I'm vegan.", "I moved to Paris.", "Good to see you, I just got back from Paris!",
    "Hey, my daughter Mia turns 7 on 3 May.", "Thanks, my sister loved the cake you suggested.",
    "Did I tell you I moved to Berlin?", "Researching adoption agencies for the summer.",
    "Can you keep your answers short?", "Please answer in French.",
    "Caroline, I moved to Paris.", "Went to Oslo in 2019.", "The support group made me feel accepted.",
    "Later I moved to Berlin.", "Morning runs keep me sane.",
])  # fmt: skip
def test_what_says_anything_of_the_user_reaches_the_model(sentence: str) -> None:
    assert small_talk(sentence) is None


@pytest.mark.parametrize("memory", [
    "Hey Mel!", "Says hi to Mel", "Greets Mel", "Thanked Caroline.", "Is doing great",
    "Asks how Mel is doing", "Was fine today.", "Sounds fun!", "Sure Sam, they'd be glad to help.",
])  # fmt: skip
def test_a_written_greeting_or_filler_is_not_a_memory(memory: str) -> None:
    assert idle_memory(memory) is not None


@pytest.mark.parametrize("memory", [
    "Is vegan", "Has a dog", "Loves pottery", "Is a nurse", "Greets customers at the bakery",
    "Thanks her mentor Ana for the support", "Is doing a PhD in biology", "Moved to Oslo",
])  # fmt: skip
def test_a_short_fact_is_a_memory(memory: str) -> None:
    assert idle_memory(memory) is None
