"""MEMPROXY_COMPANION_THRESHOLD: once one memory reaches MEMPROXY_RELEVANCE_THRESHOLD, those
reaching the companion threshold are shown with it; without such a memory, none is.

The thresholds are set from the scores the search API reports for the question (the fake
embedder's scores are not the real model's), so each case sits on the side of a threshold it
names."""

from __future__ import annotations

import uuid
from typing import Any

import respx

from tests.conftest import AppClientFactory
from tests.helpers import completion_json

MEMORIES = [
    "Mia plays the violin in the school orchestra",
    "Mia started the violin when she was six",
    "Bought a new kettle for the office",
]
QUESTION = "Which orchestra does Mia play the violin in?"


async def injected(make_client: AppClientFactory, **settings: Any) -> tuple[int, dict[str, float]]:
    """The memories a chat with QUESTION is shown, and every memory's score for it (a user of
    its own: the clients of one test share a database)."""
    client = await make_client(**settings)
    user = {"X-User-Id": f"ann-{uuid.uuid4().hex}"}
    added = await client.post(
        "/v1/memories/batch", json={"memories": [{"content": c} for c in MEMORIES]}, headers=user
    )
    assert added.status_code == 201, added.text
    found = await client.post(
        "/v1/memories/search", json={"query": QUESTION, "min_score": 0}, headers=user
    )
    scores = {hit["content"]: hit["score"] for hit in found.json()["data"]}
    response = await client.post(
        "/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": QUESTION}]},
        headers=user,
    )
    assert response.status_code == 200, response.text
    return int(response.headers["x-memories-injected"]), scores


async def test_memories_beside_the_best_need_only_the_companion_threshold(
    make_client: AppClientFactory, upstream: respx.Router
) -> None:
    upstream.post("/chat/completions").respond(json=completion_json())
    _, scores = await injected(make_client)
    best, second = (scores[m] for m in MEMORIES[:2])
    assert best > second > scores.get(MEMORIES[2], 0.0) + 0.02  # the case this test needs
    between = (best + second) / 2
    below_second = second - 0.01

    shown, _ = await injected(
        make_client, relevance_threshold=between, companion_threshold=below_second
    )
    assert shown == 2  # the best reaches the threshold, the second comes with it
    shown, _ = await injected(make_client, relevance_threshold=between, companion_threshold=0.9)
    assert shown == 1  # a companion threshold above the relevance threshold is that threshold
    shown, _ = await injected(
        make_client, relevance_threshold=best + 0.01, companion_threshold=below_second
    )
    assert shown == 0  # nothing reaches the threshold: nothing comes beside it either
