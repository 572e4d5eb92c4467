"""The memory page and forgetting over a capacity (issue 27, point 4): the Stats & jobs view
lists the forgotten memories with their reason, and Put back brings one back to the list of
memories with its id; the idle job behind it shows as idle upkeep."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import Page, expect

from tests.browser.conftest import KEYS, _serve_memproxy
from tests.browser.test_memory_page import ANN_KEY, api, memories, sign_in


@pytest.fixture
def small_server() -> Iterator[str]:
    """memproxy whose users keep one fact (MEMPROXY_MAX_FACTS=1), with no idle work of its own."""
    yield from _serve_memproxy(**KEYS, max_facts=1, idle_seconds=0)


def test_a_forgotten_memory_is_listed_with_its_reason_and_put_back(
    page: Page, small_server: str
) -> None:
    old = api(small_server, ANN_KEY, "POST", "/v1/memories", json={"content": "Sails on Sundays"})
    api(small_server, ANN_KEY, "POST", "/v1/memories", json={"content": "Knits scarves"})
    forgot = api(small_server, ANN_KEY, "POST", "/v1/memories/forget").json()["forgotten"]
    assert [m["id"] for m in forgot] == [old.json()["id"]]

    sign_in(page, small_server, ANN_KEY)
    expect(memories(page)).to_have_text(["Knits scarves"])
    page.get_by_role("tab", name="Stats & jobs").click()
    gone = page.locator("#forgotten li.memory")
    expect(gone).to_have_count(1)
    expect(gone.locator(".content")).to_have_text("Sails on Sundays")
    expect(gone).to_contain_text("over the capacity of 1 facts (2 held)")
    gone.get_by_role("button", name="Put back").click()
    expect(page.locator("#toast")).to_contain_text("Put back")
    expect(page.locator("#forgotten")).to_contain_text("Nothing forgotten.")
    page.get_by_role("tab", name="Memories").click()
    expect(memories(page)).to_have_count(2)
    stored = api(small_server, ANN_KEY, "GET", f"/v1/memories/{old.json()['id']}")
    assert stored.status_code == 200 and stored.json()["content"] == "Sails on Sundays"
