"""Chats about nothing personal: what a memory proxy should add nothing to.

``bench/pipeline_eval.py`` sends each of :data:`PROMPTS` and :data:`HELD_OUT` to every user it
learned and counts the chats that were shown any memory found for the question (the profile,
shown in every chat by design, is not counted): the other side of a relevance threshold that lets
more memories through for the questions that are about the user. The prompts are coding,
science, geography and how-to questions that name nothing of the LoCoMo conversations' lives
(art, family, camping, adoption, cars, health...).
"""

from __future__ import annotations

from app.memory.block import FOUND_HEADING, PROFILE_HEADING

PROMPTS = (
    "Write a Python function that checks whether a string is a palindrome.",
    "What is the difference between TCP and UDP?",
    "Convert 72 degrees Fahrenheit to Celsius.",
    "Explain how a hash table handles collisions.",
    "What is the capital of Australia?",
    "Summarise the causes of the French Revolution in three sentences.",
    "How do I undo the last git commit but keep the changes?",
    "What does the HTTP status code 418 mean?",
    "Give me a SQL query that counts rows per day in a table of orders.",
    "How many bytes are in a kilobyte versus a kibibyte?",
    "Explain the Pythagorean theorem with an example.",
    "What is the boiling point of water at the top of Mount Everest?",
    "Write a regular expression that matches an email address.",
    "How does photosynthesis work?",
    "Translate 'where is the train station' into German.",
    "What is the worst-case time complexity of quicksort?",
    "Explain what a mutex is and when to use one.",
    "How do vaccines train the immune system?",
    "What is the speed of light in a vacuum?",
    "How do I center a div with CSS?",
    "What are the main differences between Rust and Go?",
    "Explain the difference between a list and a tuple in Python.",
    "Who wrote the novel War and Peace?",
    "What is compound interest? Give the formula.",
    "How does a refrigerator keep food cold?",
    "List the planets of the solar system in order from the sun.",
    "What is the difference between weather and climate?",
    "Explain big-O notation briefly.",
    "How do I read a CSV file with pandas?",
    "What causes the seasons on Earth?",
    "Define entropy in thermodynamics.",
    "How should I structure a REST API for a todo app?",
    "How do noise-cancelling headphones work?",
    "Explain the difference between RAM and disk storage.",
    "What is the largest ocean on Earth?",
    "How do I make a bash script exit on the first error?",
    "What is a prime number? List the first ten.",
    "Explain how DNS resolution works.",
    "What is the chemical formula of table salt?",
    "How do I convert a string to an integer in JavaScript?",
)


HELD_OUT = (
    "What is the difference between a virus and a bacterium?",
    "Write a function that merges two sorted arrays.",
    "How do I set up a Python virtual environment?",
    "What year did the Berlin Wall fall?",
    "Explain how public-key cryptography works.",
    "What does a load balancer do?",
    "How many continents are there, and which is the largest?",
    "What is the derivative of x squared?",
    "How do I rename a column in a pandas dataframe?",
    "Why is the sky blue?",
    "What is the difference between HTTP and HTTPS?",
    "Explain recursion with a short example.",
    "What is the population of Japan, roughly?",
    "How does garbage collection work in Java?",
    "What is the main function of red blood cells?",
    "Give me a shell command that finds the largest files in a folder.",
    "What is the difference between an array and a linked list?",
    "Who painted the ceiling of the Sistine Chapel?",
    "How do I format a date as ISO 8601 in Python?",
    "What is an API rate limit?",
)
"""Written after the lexical ceiling was changed on :data:`PROMPTS`' figures, and never used to
tune anything: the check that the change holds on questions it was not fitted to."""


def found_lines(block: str) -> list[str]:
    """The memory lines of an injected block that were found for the question: all of them, or
    those after the profile's section when the block has one."""
    if PROFILE_HEADING in block:
        block = block.split(FOUND_HEADING, 1)[1] if FOUND_HEADING in block else ""
    return [line for line in block.splitlines() if line.startswith("- [")]
