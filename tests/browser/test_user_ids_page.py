"""The users an admin sees on the memory page never look alike (issue 23, point 10): ids that pass
for "alice" (stored before app/proxy/user_ids.py refused them, or of one script whose letters all
look Latin, which it keeps) show the characters that make them pass for another as code points;
names of one script that look like no Latin id are shown as they are."""

from __future__ import annotations

import asyncio
import tempfile
from concurrent.futures import ThreadPoolExecutor

from playwright.sync_api import Page, expect

from app.config import Settings
from app.devtools.fake_upstream import FakeUpstream
from app.main import create_app
from app.memory.store.db import create_engine, upgrade
from app.memory.store.memories import MemoryStore
from app.memory.store.records import NewMemory
from tests import databases
from tests.browser.test_memory_page import sign_in
from tests.fakes import FakeEmbedder
from tests.servers import serve

SHOWN = {
    "alice": "alice",
    "alice\u200b": "alice\\u{200B}",  # a character that shows nothing
    "al\u00adice": "al\\u{AD}ice",  # a soft hyphen
    "\u0430lice": "\\u{430}lice",  # a Cyrillic "а" beside Latin letters
    "\u0430\u04cf\u0456\u0441\u0435": "\\u{430}\\u{4CF}\\u{456}\\u{441}\\u{435}",  # аӏісе
    "\uff41\uff4c\uff49\uff43\uff45": "\\u{FF41}\\u{FF4C}\\u{FF49}\\u{FF43}\\u{FF45}",  # ａｌｉｃｅ
    "a\u217cice": "a\\u{217C}ice",  # a Roman numeral
    "\U0001d41alice": "\\u{1D41A}lice",  # a mathematical letter
    "Jose\u0301\u200b": "Jose\\u{301}\\u{200B}",  # NFD with a zero-width space: kept as stored
    "\u0414\u043c\u0438\u0442\u0440\u0438\u0439": "\u0414\u043c\u0438\u0442\u0440\u0438\u0439",
    "\u0395\u03bb\u03ad\u03bd\u03b7": "\u0395\u03bb\u03ad\u03bd\u03b7",  # Ελένη
    "\u0251lice": "\\u{251}lice",  # Latin alpha "ɑ", kept by the rule: shown escaped
    "a\u01c0ice": "a\\u{1C0}ice",  # Latin dental click "ǀ"
    "ali\u0307ce": "ali\\u{307}ce",  # a dot above the "i", in NFC (none precomposed)
    "o\u02bcbrien": "o\\u{2BC}brien",  # a modifier letter apostrophe
    "\u0570ello": "\\u{570}ello",  # Armenian "հ" beside Latin letters
    "Zo\u00eb Nu\u00f1ez-Bj\u00f6rk": "Zo\u00eb Nu\u00f1ez-Bj\u00f6rk",  # accents: as they are
    "david-\u05d3\u05d5\u05d3": "david-\u05d3\u05d5\u05d3",  # Latin with Hebrew
}


async def _older_users(url: str) -> None:
    engine = create_engine(url)
    try:
        await upgrade(engine)
        store = MemoryStore(engine)
        for user in SHOWN:
            await store.add(user, [NewMemory(f"A memory of {user!r}")])
    finally:
        await engine.dispose()


def test_ids_that_pass_for_others_are_shown_as_code_points(page: Page) -> None:
    with tempfile.TemporaryDirectory() as data, serve(FakeUpstream()) as upstream:
        url = databases.url_in(data)
        with ThreadPoolExecutor(1) as thread:  # Playwright's own loop runs in this one
            thread.submit(asyncio.run, _older_users(url)).result()
        settings = Settings(upstream_base_url=f"{upstream}/v1", database_url=url,
                            upstream_check_at_start=False, api_keys=["sk-ann:ann"],
                            admin_keys=["sk-admin"])  # fmt: skip
        with serve(create_app(settings, embedder=FakeEmbedder())) as server:
            sign_in(page, server, "sk-admin")
            page.get_by_role("tab", name="Users").click()
            ids = page.locator("#users tr th code")
            expect(ids).to_have_count(len(SHOWN))
            shown = sorted(ids.all_text_contents())
    assert shown == sorted(SHOWN.values())
