"""The memory page and a memory's profile mark and date (issue 25, points 5 and 6): a memory says
when it was said; the Profile button marks and unmarks it (as Pin does), the list filters by the
mark, and what the page shows is what the API stores."""

from __future__ import annotations

from playwright.sync_api import Page, expect

from tests.browser.test_memory_page import ANN_KEY, api, item, memories, sign_in


def test_a_user_marks_a_profile_fact_and_sees_when_it_was_said(page: Page, server: str) -> None:
    api(server, ANN_KEY, "POST", "/v1/memories",
        json={"content": "Is vegetarian", "observed_at": "2024-05-01T12:00:00Z"})  # fmt: skip
    sign_in(page, server, ANN_KEY)
    veg = item(page, "Is vegetarian")
    expect(veg.locator(".said")).to_contain_text("said ")
    expect(veg.locator(".said")).to_contain_text("2024")
    expect(veg.locator(".badge.profile")).to_have_count(0)

    veg.get_by_role("button", name="Profile", exact=True).click()
    expect(item(page, "Is vegetarian").locator(".badge.profile")).to_have_text("profile")
    page.get_by_label("New memory").fill("Asked about trains")
    page.get_by_role("button", name="Add", exact=True).click()
    expect(item(page, "Asked about trains")).to_have_count(1)
    page.locator("#filter-profile").select_option("true")
    expect(memories(page)).to_have_text(["Is vegetarian"])
    (stored,) = api(server, ANN_KEY, "GET", "/v1/memories", params={"profile": "true"}).json()[
        "data"
    ]
    assert (stored["content"], stored["observed_at"]) == ("Is vegetarian", "2024-05-01T12:00:00Z")

    item(page, "Is vegetarian").get_by_role("button", name="Not profile").click()
    expect(item(page, "Is vegetarian").locator(".badge.profile")).to_have_count(0)
    page.locator("#filter-profile").select_option("")
    expect(memories(page)).to_have_count(2)
    assert (
        api(server, ANN_KEY, "GET", "/v1/memories", params={"profile": "true"}).json()["total"] == 0
    )
