"""Two replicas (real uvicorn servers, one database) taking the same writes at once: every answer
is an HTTP response (never a dropped connection, never a 5xx), and nothing is stored twice."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import ExitStack

import httpx
import orjson
import pytest

from app.main import create_app
from tests.conftest import make_settings
from tests.fakes import FakeEmbedder
from tests.memory_api_support import ANN
from tests.servers import serve


@pytest.fixture
def replicas() -> Iterator[list[str]]:
    with ExitStack() as stack:
        yield [
            stack.enter_context(serve(create_app(make_settings(), embedder=FakeEmbedder())))
            for _ in range(2)
        ]


def export_of(n: int, prefix: str) -> bytes:
    lines = [{"id": f"{prefix}-{i}", "content": f"Fact number {i} of {prefix}"} for i in range(n)]
    return b"\n".join(orjson.dumps(line) for line in lines) + b"\n"


async def test_the_same_import_sent_to_two_replicas_at_once_is_stored_once(
    replicas: list[str],
) -> None:
    for attempt in range(3):
        body = export_of(300, f"run{attempt}")
        async with httpx.AsyncClient(timeout=60) as client:
            answers = await asyncio.gather(*(
                client.post(f"{url}/v1/memories/import", content=body, headers=ANN)
                for url in replicas
            ))  # fmt: skip
            listed = await client.get(f"{replicas[0]}/v1/memories/stats", headers=ANN)
        # Both answered 200 (an import is idempotent on id, issue 10's promise): on PostgreSQL
        # the second waited for the first's rows, then skipped them all.
        assert [a.status_code for a in answers] == [200, 200], [a.text for a in answers]
        assert sorted(a.json()["imported"] for a in answers) == [0, 300]
        assert all(a.json()["imported"] + a.json()["skipped"] == 300 for a in answers)
        assert listed.json()["total"] == 300 * (attempt + 1)
