"""Provenance on the memory page (issue 25, point 2): a fact written from the user's words says
so, an episode says how many facts came from it, a click shows the linked memories' texts, and
Undo after deleting the fact brings back the fact, its words and the link between them."""

from __future__ import annotations

import json
from typing import Any

from playwright.sync_api import Page, expect

from tests.browser.test_memory_page import ANN_KEY, api, sign_in

FACT = "Is vegetarian"
SAID = "I stopped eating meat years ago."


def item(page: Page, text: str) -> Any:
    """The memory whose own text is `text` (not one showing it among its linked memories)."""
    own = page.locator(".content").get_by_text(text, exact=True)
    return page.locator("#memory-list li.memory").filter(has=own)


def test_a_fact_shows_the_words_it_came_from_and_undo_keeps_the_link(
    page: Page, server: str
) -> None:
    lines = [
        {"id": "words-1", "type": "episode", "content": SAID},
        {"id": "fact-1", "content": FACT, "linked": ["words-1"]},
    ]
    raw = "".join(json.dumps(line) + "\n" for line in lines)
    assert api(server, ANN_KEY, "POST", "/v1/memories/import", content=raw).json()["imported"] == 2
    api(server, ANN_KEY, "POST", "/v1/memories", json={"content": "Plays the cello"})
    sign_in(page, server, ANN_KEY)
    expect(item(page, "Plays the cello").locator(".linked-toggle")).to_have_count(0)
    fact = item(page, FACT)
    toggle = fact.get_by_role("button", name="from your words")
    toggle.click()
    expect(toggle).to_have_attribute("aria-expanded", "true")
    expect(fact.locator(".linked li")).to_have_text([f"episode {SAID}"])
    toggle.click()  # and closed again
    expect(fact.locator(".linked")).to_have_count(0)
    words = item(page, SAID)
    words.get_by_role("button", name="1 fact from this").click()
    expect(words.locator(".linked li")).to_have_text([f"fact {FACT}"])

    # deleting the fact takes its words; Undo puts back both, still linked
    fact.get_by_role("button", name="Delete").click()
    expect(page.locator("#list-summary")).to_have_text("1 memory of ann")
    page.locator("#toast").get_by_role("button", name="Undo").click()
    expect(page.locator("#toast")).to_have_text("Restored to ann.")
    expect(page.locator("#list-summary")).to_have_text("3 memories of ann")
    item(page, FACT).get_by_role("button", name="from your words").click()
    expect(item(page, FACT).locator(".linked li")).to_have_text([f"episode {SAID}"])
