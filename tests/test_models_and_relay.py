"""`/v1/models` with its cache, the generic `/v1/*` relay, and health."""

from __future__ import annotations

import httpx
import respx

from tests.helpers import assert_openai_error

MODELS = {"object": "list", "data": [{"id": "llama3.2", "object": "model", "owned_by": "library"}]}


async def test_models_relayed_and_cached(client: httpx.AsyncClient, upstream: respx.Router) -> None:
    route = upstream.get("/models").respond(json=MODELS)
    first = await client.get("/v1/models")
    second = await client.get("/models")  # Open WebUI without /v1 in the base URL
    assert first.json() == second.json() == MODELS
    assert (first.headers["x-memproxy-cache"], second.headers["x-memproxy-cache"]) == (
        "miss",
        "hit",
    )
    assert route.call_count == 1


async def test_models_cache_is_per_credential_and_can_be_off(
    make_client, upstream: respx.Router
) -> None:
    route = upstream.get("/models").respond(json=MODELS)
    client = await make_client()
    await client.get("/v1/models", headers={"authorization": "Bearer a"})
    await client.get("/v1/models", headers={"authorization": "Bearer b"})
    assert route.call_count == 2
    uncached = await make_client(models_cache_seconds=0)
    await uncached.get("/v1/models")
    await uncached.get("/v1/models")
    assert route.call_count == 4


async def test_models_errors_are_not_cached(
    client: httpx.AsyncClient, upstream: respx.Router
) -> None:
    route = upstream.get("/models")
    route.side_effect = [
        httpx.Response(503, json={"error": "loading"}),
        httpx.Response(200, json=MODELS),
    ]
    assert_openai_error(await client.get("/v1/models"), 503)
    assert (await client.get("/v1/models")).json() == MODELS


async def test_other_paths_are_relayed_unchanged(
    client: httpx.AsyncClient, upstream: respx.Router
) -> None:
    route = upstream.post("/embeddings").respond(
        json={"data": [{"embedding": [0.1]}]}, headers={"x-up": "1"}
    )
    response = await client.post(
        "/v1/embeddings?dims=8",
        content=b'{"input": "x", "model": "e"}',
        headers={"content-type": "application/json", "x-user-id": "u"},
    )
    assert response.json() == {"data": [{"embedding": [0.1]}]} and response.headers["x-up"] == "1"
    sent = route.calls.last.request
    assert sent.content == b'{"input": "x", "model": "e"}' and sent.url.params["dims"] == "8"
    assert "x-user-id" not in sent.headers
    upstream.get("/models/llama3.2").respond(json={"id": "llama3.2"})
    assert (await client.get("/v1/models/llama3.2")).json() == {"id": "llama3.2"}
    upstream.delete("/files/f1").respond(404, json={"error": {"message": "no such file"}})
    assert (
        assert_openai_error(await client.delete("/v1/files/f1"), 404)["message"] == "no such file"
    )


async def test_binary_responses_are_relayed(
    client: httpx.AsyncClient, upstream: respx.Router
) -> None:
    audio = bytes(range(256)) * 100
    upstream.post("/audio/speech").respond(content=audio, headers={"content-type": "audio/mpeg"})
    response = await client.post("/v1/audio/speech", json={"input": "hello", "voice": "x"})
    assert response.content == audio and response.headers["content-type"] == "audio/mpeg"


async def test_healthz(client: httpx.AsyncClient) -> None:
    response = await client.get("/healthz")
    assert response.json() == {"status": "ok"} and "x-request-id" in response.headers
