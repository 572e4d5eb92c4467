"""The memory page (`/ui/`) in a real browser against a real server: what a user does with it
(add, search, edit, pin, history, delete and undo, import and export, delete everything), what
an admin does (the users, any user's views, the Manager's jobs), and what nobody may (a user key
reaching another user's memories; a memory's text running as markup)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import httpx
from playwright.sync_api import Page, expect

ANN_KEY, BOB_KEY, ADMIN_KEY = "sk-ann", "sk-bob", "sk-admin"


def sign_in(page: Page, server: str, key: str) -> None:
    page.goto(f"{server}/ui")
    page.get_by_label("API key").fill(key)
    page.get_by_role("button", name="Open").click()
    expect(page.locator("#app")).to_be_visible()


def memories(page: Page) -> Any:
    return page.locator("#memory-list .content")


def item(page: Page, text: str) -> Any:
    return page.locator("#memory-list li.memory").filter(has_text=text)


def add(page: Page, text: str, type_: str = "fact", *, pinned: bool = False) -> None:
    page.get_by_label("New memory").fill(text)
    page.locator("#add-type").select_option(type_)
    if pinned:
        page.get_by_label("Pinned").check()
    page.get_by_role("button", name="Add", exact=True).click()
    expect(item(page, text)).to_have_count(1)


def api(server: str, key: str, method: str, path: str, **kwargs: Any) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.request(method, f"{server}{path}", headers=headers, timeout=10, **kwargs)


def test_a_user_adds_searches_edits_pins_reads_history_and_deletes(
    page: Page, server: str, screenshots: Path
) -> None:
    sign_in(page, server, ANN_KEY)
    expect(page.locator("#who")).to_have_text("Signed in as ann")
    expect(page.get_by_role("tab", name="Users")).to_be_hidden()  # a user key picks no user
    add(page, "Lives in Lyon with a beagle called Rex")
    add(page, "Prefers short answers in French", "preference", pinned=True)
    add(page, "Allergic to peanuts")
    expect(page.locator("#list-summary")).to_have_text("3 memories of ann")
    expect(item(page, "Prefers short answers").locator(".badge.pinned")).to_have_text("pinned")
    page.screenshot(path=screenshots / "memories.png", full_page=True)

    # filters: text, then type
    page.get_by_label("Filter text").fill("lyon")
    page.get_by_role("button", name="Filter").click()
    expect(memories(page)).to_have_text(["Lives in Lyon with a beagle called Rex"])
    page.get_by_label("Filter text").fill("")
    page.locator("#filter-type").select_option("preference")
    expect(memories(page)).to_have_text(["Prefers short answers in French"])
    page.locator("#filter-type").select_option("")
    expect(memories(page)).to_have_count(3)

    # search ranks with the chat pipeline's scores
    page.get_by_role("tab", name="Search").click()
    page.get_by_label("Search as chat recall does").fill("what is my dog Rex?")
    page.get_by_role("button", name="Search").click()
    first = page.locator("#search-list li.memory").first
    expect(first.locator(".content")).to_have_text("Lives in Lyon with a beagle called Rex")
    expect(first.locator(".badge.score")).to_have_text(re.compile(r"score 0\.\d{3}"))
    page.screenshot(path=screenshots / "search.png", full_page=True)

    # edit inline (Escape cancels, Save writes), then pin and unpin
    page.get_by_role("tab", name="Memories").click()
    lyon = item(page, "Lives in Lyon")
    lyon.get_by_role("button", name="Edit").click()
    page.get_by_label("Memory text").fill("never saved")
    page.keyboard.press("Escape")
    expect(item(page, "never saved")).to_have_count(0)
    item(page, "Lives in Lyon").get_by_role("button", name="Edit").click()
    page.get_by_label("Memory text").fill("Lives in Paris with a beagle called Rex")
    page.get_by_role("button", name="Save").click()
    expect(item(page, "Lives in Paris")).to_have_count(1)
    item(page, "Lives in Paris").get_by_role("button", name="Pin").click()
    expect(item(page, "Lives in Paris").locator(".badge.pinned")).to_have_count(1)

    (paris,) = api(server, ANN_KEY, "GET", "/v1/memories", params={"q": "paris"}).json()["data"]
    assert paris["content"] == "Lives in Paris with a beagle called Rex" and paris["pinned"]

    # history: who changed what
    item(page, "Lives in Paris").get_by_role("button", name="History").click()
    dialog = page.get_by_role("dialog")
    expect(dialog).to_be_visible()
    expect(dialog.locator("li strong")).to_have_text(["created", "updated", "updated"])
    expect(dialog.locator(".before").first).to_have_text("Lives in Lyon with a beagle called Rex")
    expect(dialog.locator("li").last).to_contain_text("pinned")
    page.screenshot(path=screenshots / "history.png")
    page.keyboard.press("Escape")
    expect(dialog).to_be_hidden()

    # delete, undo (same id back), delete for good
    item(page, "Allergic to peanuts").get_by_role("button", name="Delete").click()
    expect(item(page, "Allergic to peanuts")).to_have_count(0)
    page.locator("#toast").get_by_role("button", name="Undo").click()
    expect(item(page, "Allergic to peanuts")).to_have_count(1)
    item(page, "Allergic to peanuts").get_by_role("button", name="Delete").click()
    expect(page.locator("#toast")).to_contain_text("Deleted")
    expect(item(page, "Allergic to peanuts")).to_have_count(0)
    left = api(server, ANN_KEY, "GET", "/v1/memories").json()
    assert sorted(m["content"] for m in left["data"]) == [
        "Lives in Paris with a beagle called Rex", "Prefers short answers in French",
    ]  # fmt: skip


def test_a_user_key_reaches_no_other_users_page_or_data(
    page: Page, server: str, screenshots: Path
) -> None:
    api(server, ANN_KEY, "POST", "/v1/memories", json={"content": "Ann's secret"})
    sign_in(page, server, BOB_KEY)
    expect(page.locator("#who")).to_have_text("Signed in as bob")
    expect(page.locator("#list-summary")).to_have_text("0 memories of bob")
    expect(page.locator("#user-form")).to_be_hidden()
    # what the page's own code would get if it tried: refused by the API
    status = page.evaluate(
        """async () => (await fetch("/v1/memories?user=ann",
                         {headers: {Authorization: "Bearer " + sessionStorage.getItem("memproxy.key")}})).status"""
    )
    assert status == 403
    assert page.evaluate("() => document.body.innerText").count("Ann's secret") == 0
    # the key is in the tab's session storage, never in the URL
    assert BOB_KEY not in page.url
    assert page.evaluate("() => sessionStorage.getItem('memproxy.key')") == BOB_KEY
    page.get_by_role("button", name="Forget key").click()
    expect(page.get_by_label("API key")).to_be_visible()
    assert page.evaluate("() => sessionStorage.getItem('memproxy.key')") is None

    page.get_by_label("API key").fill("sk-wrong")
    page.get_by_role("button", name="Open").click()
    expect(page.locator("#login-error")).to_have_text("The key was refused.")


def test_an_admin_sees_the_users_any_users_memories_and_their_manager_jobs(
    page: Page, server: str, screenshots: Path
) -> None:
    api(server, ANN_KEY, "POST", "/v1/memories", json={"content": "Has two cats"})
    api(server, BOB_KEY, "POST", "/v1/memories", json={"content": "Plays chess on Sundays"})
    chat = {"model": "m", "messages": [{"role": "user", "content": "Remember that I like tea"}]}
    assert api(server, ANN_KEY, "POST", "/v1/chat/completions", json=chat).status_code == 200
    for _ in range(200):  # its Manager job is parked (the scripted answer is unusable), with
        stats = api(server, ANN_KEY, "GET", "/v1/memories/stats").json()  # the words it keeps
        if stats["jobs"]["failed"] == 1:
            break
        time.sleep(0.05)
    sign_in(page, server, ADMIN_KEY)
    expect(page.locator("#who")).to_have_text("Admin key: any user")
    page.get_by_role("tab", name="Users").click()
    rows = page.locator("#users tr")
    expect(rows).to_have_count(2)
    expect(rows.filter(has_text="bob").locator("td").first).to_have_text("1")
    page.screenshot(path=screenshots / "users.png", full_page=True)

    rows.filter(has_text="ann").get_by_role("button", name="Open").click()
    expect(page.locator("#list-summary")).to_have_text("2 memories of ann")
    expect(memories(page)).to_have_text(["Remember that I like tea", "Has two cats"])

    # the chat above left a Manager job that failed (the scripted Manager's answer is unusable)
    page.get_by_role("tab", name="Stats & jobs").click()
    expect(page.locator("#stats")).to_contain_text("Memories")
    page.get_by_role("button", name="Refresh").first.click()
    job = page.locator("#jobs li.job")
    expect(job.locator(".badge").first).to_have_text("failed", timeout=10_000)
    job.locator("summary").click()
    expect(job.locator("pre")).to_have_text("Sure! I will remember that you like tea.")
    page.screenshot(path=screenshots / "stats-and-jobs.png", full_page=True)
    job.get_by_role("button", name="Re-queue").click()
    expect(page.locator("#toast")).to_contain_text("Queued again")

    # the user box switches to anyone
    page.get_by_label("User", exact=True).fill("bob")
    page.get_by_role("button", name="Show").click()
    expect(memories(page)).to_have_text(["Plays chess on Sundays"])


def test_export_import_with_new_ids_and_delete_everything(
    page: Page, server: str, screenshots: Path, tmp_path: Path
) -> None:
    for text in ("Lives in Oslo", "Works as a nurse"):
        api(server, ANN_KEY, "POST", "/v1/memories", json={"content": text})
    sign_in(page, server, ADMIN_KEY)
    page.get_by_label("User", exact=True).fill("ann")
    page.get_by_role("button", name="Show").click()
    page.get_by_role("tab", name="Import / export").click()
    with page.expect_download() as download:
        page.get_by_role("button", name="Download export").click()
    saved = tmp_path / "export.jsonl"
    download.value.save_as(saved)
    lines = [json.loads(line) for line in saved.read_text().splitlines()]
    assert sorted(m["content"] for m in lines) == ["Lives in Oslo", "Works as a nurse"]
    assert download.value.suggested_filename == "memories-ann.jsonl"
    page.screenshot(path=screenshots / "import-export.png", full_page=True)

    # into bob, as copies with new ids
    page.get_by_label("User", exact=True).fill("bob")
    page.get_by_role("button", name="Show").click()
    page.get_by_role("tab", name="Import / export").click()
    page.get_by_label("JSON Lines file").set_input_files(saved)
    page.get_by_role("radio", name=re.compile("^New")).check()
    page.get_by_role("button", name="Import", exact=True).click()
    expect(page.locator("#toast")).to_have_text("Imported 2, skipped 0 (already here).")
    bobs = api(server, ADMIN_KEY, "GET", "/v1/memories", params={"user": "bob"}).json()["data"]
    assert sorted(m["content"] for m in bobs) == ["Lives in Oslo", "Works as a nurse"]
    assert not {m["id"] for m in bobs} & {m["id"] for m in lines}

    # delete everything: only once the user id is typed
    wipe = page.get_by_role("button", name="Delete every memory")
    expect(wipe).to_be_disabled()
    page.locator("#wipe-confirm").fill("ann")  # another user's id does not confirm bob's
    expect(wipe).to_be_disabled()
    page.locator("#wipe-confirm").fill("bob")
    expect(wipe).to_be_enabled()
    wipe.click()
    expect(page.locator("#toast")).to_have_text("Deleted 2 memories of bob.")
    assert (
        api(server, ADMIN_KEY, "GET", "/v1/memories", params={"user": "bob"}).json()["total"] == 0
    )
    assert api(server, ANN_KEY, "GET", "/v1/memories").json()["total"] == 2


def test_markup_in_a_memory_is_shown_as_text_never_run(page: Page, server: str) -> None:
    hostile = '<img src=x onerror="window.pwned=1"><script>window.pwned=2</script>'
    api(server, ANN_KEY, "POST", "/v1/memories", json={"content": hostile})
    sign_in(page, server, ANN_KEY)
    expect(memories(page)).to_have_text([hostile])
    assert page.locator("#memory-list img, #memory-list script").count() == 0
    assert page.evaluate("() => window.pwned") is None
    csp = httpx.get(f"{server}/ui/").headers["content-security-policy"]
    assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp


def test_keyboard_and_a_400_pixel_screen(page: Page, server: str, screenshots: Path) -> None:
    api(server, ANN_KEY, "POST", "/v1/memories",
        json={"content": "Has a very long memory that must wrap rather than widen the page " * 3})  # fmt: skip
    page.set_viewport_size({"width": 400, "height": 800})
    page.goto(f"{server}/ui")
    expect(page.get_by_label("API key")).to_be_focused()  # ready to type into
    page.keyboard.type(ANN_KEY)
    page.keyboard.press("Enter")
    expect(page.locator("#list-summary")).to_have_text("1 memory of ann")
    assert page.evaluate("() => document.documentElement.scrollWidth") <= 400
    page.screenshot(path=screenshots / "narrow-400px.png", full_page=True)
    # tabs move with the arrow keys, as the ARIA pattern says
    page.get_by_role("tab", name="Memories").focus()
    page.keyboard.press("ArrowRight")
    expect(page.get_by_role("tab", name="Search")).to_have_attribute("aria-selected", "true")
    expect(page.locator("#view-search")).to_be_visible()
    # every control has a name a screen reader can say
    unnamed = page.evaluate(
        """() => [...document.querySelectorAll("input, select, textarea, button")]
              .filter((e) => e.offsetParent !== null)
              .filter((e) => !(e.labels && e.labels.length) && !e.getAttribute("aria-label")
                             && !e.textContent.trim()).map((e) => e.outerHTML)"""
    )
    assert unnamed == []


def test_with_no_keys_the_page_asks_for_the_user(page: Page, open_server: str) -> None:
    api(
        open_server,
        "",
        "POST",
        "/v1/memories",
        params={"user": "carol"},
        json={"content": "Likes jazz"},
    )
    page.goto(f"{open_server}/ui")
    expect(page.locator("#who")).to_have_text("Open server (no keys): any user")
    expect(page.locator("#login")).to_be_hidden()
    expect(page.get_by_role("button", name="Sign in with a key")).to_be_hidden()  # no keys here
    page.get_by_label("User", exact=True).fill("carol")
    page.get_by_role("button", name="Show").click()
    expect(memories(page)).to_have_text(["Likes jazz"])
    root = httpx.get(f"{open_server}/", headers={"accept": "text/html"})
    assert 'href="ui/"' in root.text


def test_undo_restores_to_the_user_it_was_deleted_from(page: Page, server: str) -> None:
    api(server, ANN_KEY, "POST", "/v1/memories", json={"content": "Ann's to undo"})
    sign_in(page, server, ADMIN_KEY)
    page.get_by_label("User", exact=True).fill("ann")
    page.get_by_role("button", name="Show").click()
    item(page, "Ann's to undo").get_by_role("button", name="Delete").click()
    expect(page.locator("#list-summary")).to_have_text("0 memories of ann")
    page.get_by_label("User", exact=True).fill("bob")  # another user, before pressing Undo
    page.get_by_role("button", name="Show").click()
    expect(page.locator("#list-summary")).to_have_text("0 memories of bob")
    page.locator("#toast").get_by_role("button", name="Undo").click()
    expect(page.locator("#toast")).to_have_text("Restored to ann.")
    assert [m["content"] for m in api(server, ANN_KEY, "GET", "/v1/memories").json()["data"]] == [
        "Ann's to undo"
    ]
    assert api(server, BOB_KEY, "GET", "/v1/memories").json()["total"] == 0


def test_on_a_server_with_admin_keys_only_a_visitor_can_still_sign_in(
    page: Page, admin_only_server: str
) -> None:
    api(admin_only_server, ADMIN_KEY, "POST", "/v1/memories", params={"user": "ann"},
        json={"content": "Ann's"})  # fmt: skip
    page.goto(f"{admin_only_server}/ui")
    expect(page.locator("#who")).to_have_text("Signed in as anonymous")  # chat's user, no key
    page.get_by_role("button", name="Sign in with a key").click()
    page.get_by_label("API key").fill(ADMIN_KEY)
    page.get_by_role("button", name="Open").click()
    expect(page.locator("#who")).to_have_text("Admin key: any user")
    page.get_by_role("tab", name="Users").click()
    expect(page.locator("#users tr")).to_have_count(1)
