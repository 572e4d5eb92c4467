"""Operating memproxy: readiness with its degraded states, and Prometheus metrics."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import httpx
import pytest
import respx
from pydantic_ai import models

from tests.fakes import LEARN_AT_ONCE, unusable_manager
from tests.helpers import assert_openai_error, completion_json


def services(client: httpx.AsyncClient) -> Any:
    return client._transport.app.state.services  # type: ignore[attr-defined]


async def test_ready_when_database_schema_and_embedder_are(client: httpx.AsyncClient) -> None:
    response = await client.get("/readyz")
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "ready"
    assert body["checks"]["database"] == "ok" and body["checks"]["migrations"] == "ok"
    assert body["checks"]["embedder"].startswith("ok (fake-bow-64")
    assert (await client.get("/healthz")).json() == {"status": "ok"}


@pytest.mark.sqlite_only  # reads or breaks the SQLite file directly
async def test_not_ready_when_the_schema_is_behind(
    client: httpx.AsyncClient, tmp_path: Path
) -> None:
    database = sqlite3.connect(tmp_path / "memproxy.db")
    database.execute("UPDATE alembic_version SET version_num = '0001'")
    database.commit()
    database.close()
    response = await client.get("/readyz")
    assert response.status_code == 503
    assert (
        "migrations" in response.json()["reason"]
        and "memproxy db upgrade" in response.json()["reason"]
    )


async def test_not_ready_when_the_database_is_unreachable(
    client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = services(client).engine

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise OSError("disk gone")

    monkeypatch.setattr(type(engine), "connect", broken)
    response = await client.get("/readyz")
    assert (
        response.status_code == 503
        and "database: unreachable: OSError: disk gone" in response.json()["reason"]
    )
    monkeypatch.undo()
    assert (await client.get("/readyz")).status_code == 200  # and it recovers


async def test_metrics_count_requests_recall_and_cache(
    client: httpx.AsyncClient, upstream: respx.Router
) -> None:
    upstream.post("/chat/completions").respond(json=completion_json())
    headers = {"X-User-Id": "ann"}
    await client.post("/v1/memories", json={"content": "Lives in Oslo"}, headers=headers)
    chat = {"model": "m", "messages": [{"role": "user", "content": "Where do I live, in Oslo?"}]}
    for _ in range(2):
        assert (
            await client.post("/v1/chat/completions", json=chat, headers=headers)
        ).status_code == 200
    await client.get("/v1/memories/no-such-id", headers=headers)
    response = await client.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    text = response.text
    assert (
        'memproxy_requests_total{kind="chat",route="/v1/chat/completions",status="200"} 2.0' in text
    )
    assert (
        'memproxy_requests_total{kind="-",route="/v1/memories/{memory_id}",status="404"} 1.0'
        in text
    )
    assert "memproxy_recall_seconds_count 2.0" in text
    assert "memproxy_memories_injected_sum 2.0" in text
    assert "memproxy_embedding_cache_hits_total" in text
    assert 'memproxy_upstream_seconds_count{endpoint="chat",result="2xx"} 2.0' in text
    assert "Lives in Oslo" not in text and "ann" not in text  # no content, no user ids


async def test_upstream_latency_is_measured_by_endpoint_and_result(
    client: httpx.AsyncClient, upstream: respx.Router
) -> None:
    upstream.get("/models").respond(503, json={"error": "loading"})
    upstream.post("/embeddings").mock(side_effect=httpx.ConnectError("refused"))
    await client.get("/v1/models")
    await client.post("/v1/embeddings", json={"model": "e", "input": "x"})
    text = (await client.get("/metrics")).text
    assert 'memproxy_upstream_seconds_count{endpoint="models",result="5xx"} 1.0' in text
    assert 'memproxy_upstream_seconds_count{endpoint="other",result="unreachable"} 1.0' in text


async def test_manager_answers_that_stay_malformed_park_the_job_and_are_counted(
    make_client: Any, upstream: respx.Router, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(models, "ALLOW_MODEL_REQUESTS", False)
    manager, calls = unusable_manager()
    upstream.post("/chat/completions").respond(json=completion_json("Noted."))
    client = await make_client(manager_model=manager, manager_max_retries=1, **LEARN_AT_ONCE)
    chat = {"model": "m", "messages": [{"role": "user", "content": "Remember I like tea"}]}
    await client.post("/v1/chat/completions", json=chat, headers={"X-User-Id": "ann"})
    text = ""
    for _ in range(500):
        text = (await client.get("/metrics")).text
        if "memproxy_manager_jobs_failed_total 1.0" in text:  # counted once parked
            break
        await asyncio.sleep(0.01)
    assert "memproxy_manager_answers_unusable_total 1.0" in text
    assert "memproxy_manager_jobs_applied_total 0.0" in text
    assert len(calls) == 6  # three output modes, each answer sent back once
    stats = (await client.get("/v1/memories/stats", headers={"X-User-Id": "ann"})).json()
    (failure,) = stats["jobs"]["failures"]  # parked with what the Manager said, never dropped
    assert stats["jobs"]["failed"] == 1 and failure["answer"] == "sure! I will remember that"


OPERATOR_PAGES = ("/metrics", "/openapi.json", "/docs", "/redoc")


async def test_with_keys_metrics_and_docs_need_a_key(make_client: Any) -> None:
    """They answered anyone: the docs list every route and field, the metrics the traffic. A
    client key or an admin key opens them; the probes stay open for orchestrators."""
    client = await make_client(api_keys=["sk-a:ann"], admin_keys=["sk-admin"])
    for path in OPERATOR_PAGES:
        assert_openai_error(await client.get(path), 401)
        assert_openai_error(await client.get(path, headers={"authorization": "Bearer no"}), 401)
        for key in ("sk-a", "sk-admin"):
            response = await client.get(path, headers={"authorization": f"Bearer {key}"})
            assert response.status_code == 200, (path, key)
    assert (await client.get("/healthz")).status_code == 200
    assert (await client.get("/readyz")).status_code == 200
    described = await client.get("/openapi.json", headers={"authorization": "Bearer sk-a"})
    assert "/v1/chat/completions" in described.json()["paths"]
    assert "/docs" not in described.json()["paths"]
    page = await client.get("/docs", headers={"authorization": "Bearer sk-a"})
    assert "swagger" in page.text.lower() and "/openapi.json" in page.text


async def test_admin_keys_alone_guard_metrics_and_docs(make_client: Any) -> None:
    client = await make_client(admin_keys=["sk-admin"])
    for path in OPERATOR_PAGES:
        assert_openai_error(await client.get(path), 401)
        response = await client.get(path, headers={"authorization": "Bearer sk-admin"})
        assert response.status_code == 200, path


async def test_metrics_and_docs_can_be_left_open_or_docs_turned_off(make_client: Any) -> None:
    client = await make_client(api_keys=["sk-a"], metrics_require_key=False, docs_require_key=False)
    for path in OPERATOR_PAGES:
        assert (await client.get(path)).status_code == 200, path
    client = await make_client(api_keys=["sk-a"], docs_enabled=False)
    for path in OPERATOR_PAGES[1:]:
        response = await client.get(path, headers={"authorization": "Bearer sk-a"})
        assert_openai_error(response, 404)
    assert (
        await client.get("/metrics", headers={"authorization": "Bearer sk-a"})
    ).status_code == 200


async def test_an_open_server_shows_metrics_and_docs_to_anyone(client: httpx.AsyncClient) -> None:
    for path in OPERATOR_PAGES:
        assert (await client.get(path)).status_code == 200, path
