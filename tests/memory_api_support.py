"""What the memory API tests share: two users and the calls most of them make."""

from __future__ import annotations

from typing import Any

import httpx

ANN = {"X-User-Id": "ann"}
BOB = {"X-User-Id": "bob"}


async def add(
    client: httpx.AsyncClient, content: str, headers: dict[str, str] = ANN, **extra: Any
) -> dict[str, Any]:
    response = await client.post(
        "/v1/memories", json={"content": content, **extra}, headers=headers
    )
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


async def count(client: httpx.AsyncClient, headers: dict[str, str] = ANN) -> int:
    response = await client.get("/v1/memories", headers=headers)
    assert response.status_code == 200, response.text
    return int(response.json()["total"])
