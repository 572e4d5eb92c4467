"""The browser suite (marker ``browser``, ``make browser``): the memory page in Debian's Chromium,
driven by Playwright, against memproxy on a real uvicorn server (fake upstream, fake embedder, a
scripted Manager that fails, so that the jobs view has a job to show).

Chromium is the system's (``apt-get install -y chromium``: ``/usr/bin/chromium``, or
``MEMPROXY_TEST_CHROMIUM``); Playwright never downloads a browser here. Without it the suite is
skipped, saying so; in CI (``CI`` set) it fails instead (``.ci/run`` installs it first).
Screenshots of each main view are saved to ``build/screenshots/`` (``MEMPROXY_SCREENSHOT_DIR``).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.config import Settings
from app.devtools.fake_upstream import FakeUpstream
from app.main import create_app
from tests import databases
from tests.fakes import LEARN_AT_ONCE, FakeEmbedder, unusable_manager
from tests.servers import serve

# The project's own variables are listed in app.settings_errors.PROJECT_VARIABLES (no warning).
CHROMIUM = os.environ.get("MEMPROXY_TEST_CHROMIUM", "/usr/bin/chromium")
KEYS: dict[str, Any] = {"api_keys": ["sk-ann:ann", "sk-bob:bob"], "admin_keys": ["sk-admin"]}
# As the machine's checks launch it: no sandbox as root, and no calls home on a closed network.
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]  # fmt: skip


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.path).startswith(here):
            item.add_marker(pytest.mark.browser)


def _unavailable(message: str) -> None:
    message += " (`apt-get install -y chromium`; `make browser` runs this suite)"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    try:
        from playwright.sync_api import Error, sync_playwright
    except ImportError:
        _unavailable("the playwright package is not installed")
    if not os.access(CHROMIUM, os.X_OK):
        _unavailable(f"no Chromium at {CHROMIUM}")
    with sync_playwright() as playwright:
        try:
            launched = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        except Error as exc:
            _unavailable(f"Chromium at {CHROMIUM} does not start: {str(exc).splitlines()[0]}")
        yield launched
        launched.close()


@pytest.fixture(scope="session")
def screenshots() -> Path:
    folder = Path(os.environ.get("MEMPROXY_SCREENSHOT_DIR", "build/screenshots"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _serve_memproxy(**settings: Any) -> Iterator[str]:
    with tempfile.TemporaryDirectory() as data, serve(FakeUpstream()) as upstream:
        app = create_app(
            Settings(
                upstream_base_url=f"{upstream}/v1",
                database_url=databases.url_in(data),
                upstream_check_at_start=False,
                manager_max_retries=0,
                **LEARN_AT_ONCE,
                **settings,
            ),
            embedder=FakeEmbedder(),
            manager_model=unusable_manager("Sure! I will remember that you like tea.")[0],
        )
        with serve(app) as url:
            yield url


@pytest.fixture
def server() -> Iterator[str]:
    """memproxy with a key for ann, one for bob, and an admin key."""
    yield from _serve_memproxy(**KEYS)


@pytest.fixture
def admin_only_server() -> Iterator[str]:
    """memproxy with an admin key and no client keys (chat is open to anyone)."""
    yield from _serve_memproxy(admin_keys=KEYS["admin_keys"])


@pytest.fixture
def open_server() -> Iterator[str]:
    """memproxy with no keys at all (local use)."""
    yield from _serve_memproxy()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1100, "height": 900}, accept_downloads=True)
    opened = context.new_page()
    errors: list[str] = []
    opened.on("pageerror", lambda exc: errors.append(str(exc)))
    yield opened
    context.close()
    assert not errors, f"the page raised: {errors}"
