"""What the logging tests share: the `log` fixture (what memproxy's handler writes, once an app
configures it), `capture` to point the handler at it, and an app on the respx upstream."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import respx

from app.log import memproxy_handler
from app.main import create_app
from tests.conftest import make_settings
from tests.fakes import FakeEmbedder


@pytest.fixture(name="log")
def log_fixture() -> Iterator[io.StringIO]:
    """What memproxy's handler writes, from the moment an app configures it (see `capture`)."""
    yield io.StringIO()
    logging.getLogger("memproxy").setLevel(logging.INFO)


def capture(stream: io.StringIO, monkeypatch: pytest.MonkeyPatch) -> None:
    handler = memproxy_handler()
    assert handler is not None
    monkeypatch.setattr(handler, "stream", stream)


def build(upstream: respx.Router, **settings: Any) -> Any:
    return create_app(
        make_settings(**settings),
        upstream_transport=httpx.MockTransport(upstream.async_handler),
        embedder=FakeEmbedder(),
    )
