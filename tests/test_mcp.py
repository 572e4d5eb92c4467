"""The MCP server at /mcp, driven by the official SDK's own client against a real server: the six
tools and their effect seen through the memory API, one user's memories out of another's reach,
bad arguments as tool errors, chat's keys and user resolution."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from app.memory.store.tables import FactType, MemoryType
from tests.helpers import assert_openai_error
from tests.servers import Stack, serve_stack

TOOLS = {"remember", "recall", "list_memories", "update_memory", "forget", "memory_stats"}
MAX_CHARS = 200
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "test", "version": "1"},
    },
}
JSON_RPC = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


@pytest.fixture(scope="module")
def keyed() -> Iterator[Stack]:
    with serve_stack(
        api_keys=["sk-ann:ann", "sk-bob:bob", "sk-cy:cy", "sk-di:di", "sk-open"],
        admin_keys=["sk-admin"],
        memory_max_chars=MAX_CHARS,
        memory_max_body_bytes=4096,
    ) as stack:
        yield stack


@asynccontextmanager
async def connect(stack: Stack, mode: str = "auto", **headers: str) -> AsyncIterator[Client]:
    async with (
        httpx2.AsyncClient(headers=headers) as http,
        Client(streamable_http_client(f"{stack.proxy_url}/mcp", http_client=http), mode=mode) as c,
    ):
        yield c


def key(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer sk-{name}"}


async def call(client: Client, tool: str, **arguments: Any) -> Any:
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, result.content
    return result.structured_content


async def failure(client: Client, tool: str, **arguments: Any) -> str:
    result = await client.call_tool(tool, arguments)
    assert result.is_error, result.structured_content
    text: str = result.content[0].text  # type: ignore[union-attr]
    return text


async def http(
    stack: Stack, method: str, path: str, headers: dict[str, str], body: Any = None
) -> httpx.Response:
    async with httpx.AsyncClient(base_url=stack.proxy_url) as client:
        return await client.request(method, path, headers=headers, json=body)


async def memories(stack: Stack, **headers: str) -> dict[str, Any]:
    response = await http(stack, "GET", "/v1/memories", headers)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def test_six_tools_each_described_with_schemas(keyed: Stack) -> None:
    async with connect(keyed, **key("ann")) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    assert set(tools) == TOOLS
    for tool in tools.values():
        assert tool.description and len(tool.description) > 60, tool.name
        assert tool.input_schema["type"] == "object"
        assert tool.output_schema is not None, tool.name
    remember = tools["remember"].input_schema["properties"]
    assert remember["type"]["enum"] == [t.value for t in FactType]  # inline, in step with memory
    assert (remember["profile"]["type"], remember["profile"]["default"]) == ("boolean", False)
    kinds = tools["list_memories"].input_schema["properties"]["type"]["anyOf"][0]["enum"]
    assert kinds == [t.value for t in MemoryType]  # episodes may be listed, never remembered
    assert tools["recall"].input_schema["properties"]["limit"]["maximum"] == 100
    assert tools["forget"].input_schema["required"] == ["id"]


async def test_remember_stores_for_the_key_s_user_once(keyed: Stack) -> None:
    async with connect(keyed, **key("ann")) as client:
        first = await call(
            client, "remember", content="  The user plays chess ", type="preference", pinned=True
        )
        again = await call(client, "remember", content="the USER  plays\tchess")
    assert first["content"] == "The user plays chess"  # trimmed, as the API stores it
    assert (first["type"], first["pinned"], first["already_existed"]) == ("preference", True, False)
    assert again == first | {"already_existed": True}
    stored = await memories(keyed, **key("ann"))
    assert stored["total"] == 1
    (memory,) = stored["data"]
    assert (memory["id"], memory["user_id"], memory["pinned"]) == (first["id"], "ann", True)


async def test_recall_list_update_forget_and_stats(keyed: Stack) -> None:
    async with connect(keyed, **key("cy")) as client:
        chess = await call(client, "remember", content="The user plays chess on Sundays")
        await call(client, "remember", content="The user likes green tea", type="preference")
        found = (await call(client, "recall", query="chess"))["memories"]
        assert [hit["id"] for hit in found][:1] == [chess["id"]]
        assert 0 < found[0]["score"] <= 1 and found[0]["created_at"]
        assert (await call(client, "recall", query="chess", types=["event"]))["memories"] == []

        page = await call(client, "list_memories")
        assert page["total"] == 2
        assert page["memories"][0]["content"] == "The user likes green tea"  # newest first
        prefs = await call(client, "list_memories", type="preference", limit=1)
        assert [m["type"] for m in prefs["memories"]] == ["preference"] and prefs["total"] == 1

        updated = await call(client, "update_memory", id=chess["id"], content="The user plays go")
        assert (updated["id"], updated["content"]) == (chess["id"], "The user plays go")
        got = await http(keyed, "GET", f"/v1/memories/{chess['id']}", key("cy"))
        assert got.json()["content"] == "The user plays go"

        forgotten = await call(client, "forget", id=chess["id"])
        assert (forgotten["id"], forgotten["content"]) == (chess["id"], "The user plays go")
        gone = await http(keyed, "GET", f"/v1/memories/{chess['id']}", key("cy"))
        assert gone.status_code == 404

        stats = await call(client, "memory_stats")
    assert (stats["total"], stats["by_type"], stats["pinned"]) == (1, {"preference": 1}, 0)
    assert stats["jobs"] == {
        "awaiting": 0, "queued": 0, "running": 0, "failed": 0, "pending": 0, "idle": 0
    }  # fmt: skip


async def test_profile_facts_and_episodes_with_the_time_they_were_said(keyed: Stack) -> None:
    fay = key("open") | {"X-User-Id": "fay"}
    said = {"content": "I'm vegetarian, no meat", "type": "episode",
            "observed_at": "2024-05-01T09:30:00+02:00"}  # fmt: skip
    episode = (await http(keyed, "POST", "/v1/memories", fay, said)).json()
    async with connect(keyed, **fay) as client:
        fact = await call(client, "remember", content="The user is vegetarian", profile=True)
        assert (fact["profile"], fact["already_existed"]) == (True, False)
        assert fact["observed_at"] == fact["created_at"]  # said now
        (listed,) = (await call(client, "list_memories", type="episode"))["memories"]
        assert (listed["id"], listed["observed_at"]) == (episode["id"], "2024-05-01T07:30:00Z")
        assert listed["profile"] is False
        (hit,) = (await call(client, "recall", query="vegetarian", types=["episode"]))["memories"]
        assert (hit["id"], hit["observed_at"]) == (episode["id"], "2024-05-01T07:30:00Z")
        stats = await call(client, "memory_stats")
    assert (stats["profile"], stats["by_type"]) == (1, {"episode": 1, "fact": 1})
    stored = (await http(keyed, "GET", f"/v1/memories/{fact['id']}", fay)).json()
    assert stored["profile"] is True


async def test_update_memory_changes_the_profile_mark_and_pin_of_a_memory(keyed: Stack) -> None:
    ivy = key("open") | {"X-User-Id": "ivy"}
    async with connect(keyed, **ivy) as client:
        fact = await call(client, "remember", content="The user is allergic to nuts")
        marked = await call(client, "update_memory", id=fact["id"], profile=True)
        assert (marked["content"], marked["profile"], marked["pinned"]) == (
            "The user is allergic to nuts", True, False)  # fmt: skip
        pinned = await call(client, "update_memory", id=fact["id"], pinned=True, profile=False)
        assert (pinned["profile"], pinned["pinned"]) == (False, True)
        assert "nothing to change" in await failure(client, "update_memory", id=fact["id"])
    stored = (await http(keyed, "GET", f"/v1/memories/{fact['id']}", ivy)).json()
    assert (stored["content"], stored["profile"], stored["pinned"]) == (
        "The user is allergic to nuts", False, True)  # fmt: skip
    history = (await http(keyed, "GET", f"/v1/memories/{fact['id']}/history", ivy)).json()
    assert len(history["data"]) == 3  # created, then the two changes


async def test_one_user_cannot_reach_another_s_memories(keyed: Stack) -> None:
    async with connect(keyed, **key("di")) as di:
        secret = await call(di, "remember", content="The user's PIN is 4711")
    async with connect(keyed, **key("bob")) as bob:
        assert (await call(bob, "recall", query="PIN 4711"))["memories"] == []
        assert (await call(bob, "list_memories"))["total"] == 0
        assert secret["id"] in await failure(
            bob, "update_memory", id=secret["id"], content="hijacked"
        )
        assert secret["id"] in await failure(bob, "forget", id=secret["id"])
        assert (await call(bob, "memory_stats"))["total"] == 0
    (kept,) = (await memories(keyed, **key("di")))["data"]
    assert (kept["id"], kept["content"]) == (secret["id"], "The user's PIN is 4711")


@pytest.mark.parametrize(
    ("tool", "arguments", "says"),
    [
        ("remember", {"content": "The user hikes", "type": "opinion"}, "'fact', 'preference'"),
        ("remember", {"content": "The user hikes", "type": "episode"}, "'fact', 'preference'"),
        ("remember", {"content": "   "}, "content must not be empty"),
        ("remember", {"content": "x" * (MAX_CHARS + 1)}, "MEMPROXY_MEMORY_MAX_CHARS"),
        ("update_memory", {"id": "no-such-id", "content": "x"}, "no memory with id 'no-such-id'"),
        ("update_memory", {"id": "no-such-id", "content": ""}, "content must not be empty"),
        ("update_memory", {"id": "no-such-id", "profile": True}, "no memory with id 'no-such-id'"),
        ("update_memory", {"id": "no-such-id", "profile": "maybe"}, "valid boolean"),
        ("forget", {"id": "no-such-id"}, "no memory with id 'no-such-id'"),
        ("recall", {"query": "tea", "limit": 0}, "greater than or equal to 1"),
        ("recall", {"query": "tea", "limit": 101}, "less than or equal to 100"),
        ("recall", {"query": " "}, "query must not be empty"),
        ("list_memories", {"type": "facts"}, "'fact', 'preference'"),
        ("list_memories", {"limit": 1000}, "less than or equal to 100"),
    ],
)
async def test_bad_arguments_are_tool_errors_and_the_server_serves_on(
    keyed: Stack, tool: str, arguments: dict[str, Any], says: str
) -> None:
    async with connect(keyed, **key("bob")) as client:
        assert says in await failure(client, tool, **arguments)
        assert (await call(client, "list_memories"))["total"] == 0  # the next call is served
    assert (await memories(keyed, **key("bob")))["total"] == 0  # and nothing was written


async def test_keys_are_checked_as_on_chat(keyed: Stack) -> None:
    for headers in ({}, {"Authorization": "Bearer nope"}):
        response = await http(keyed, "POST", "/mcp", JSON_RPC | headers, INITIALIZE)
        assert assert_openai_error(response, 401)["type"] == "authentication_error"
    # An admin key belongs to no user: told so, not called invalid.
    admin = {"Authorization": "Bearer sk-admin"}
    error = assert_openai_error(
        await http(keyed, "POST", "/mcp", JSON_RPC | admin, INITIALIZE), 403
    )
    assert error["code"] == "admin_key" and "client key" in error["message"]
    with pytest.raises(BaseExceptionGroup) as told:
        async with connect(keyed, **admin) as client:
            await client.list_tools()
    assert told.group_contains(MCPError, depth=2)
    with pytest.raises(BaseExceptionGroup) as refused:
        async with connect(keyed, Authorization="Bearer nope") as client:
            await client.list_tools()
    assert refused.group_contains(MCPError, depth=2)
    # A bound key acts as its user and no other; an unbound key names users as on chat.
    named = await http(
        keyed, "POST", "/mcp", JSON_RPC | key("ann") | {"X-User-Id": "bob"}, INITIALIZE
    )
    assert assert_openai_error(named, 403)["code"] == "user_mismatch"
    async with connect(keyed, **key("open"), **{"X-OpenWebUI-User-Id": "eve"}) as client:
        await call(client, "remember", content="The user is Eve")
    assert (await memories(keyed, **key("open"), **{"X-User-Id": "eve"}))["total"] == 1
    # Small JSON-RPC bodies: the memory API's limit; and no GET stream on a stateless server.
    big = await http(keyed, "POST", "/mcp", JSON_RPC | key("ann"), INITIALIZE | {"pad": "x" * 5000})
    assert assert_openai_error(big, 413)["code"] == "body_too_large"
    get = await http(keyed, "GET", "/mcp", key("ann"))
    assert assert_openai_error(get, 405)["code"] == "method_not_allowed"


async def test_open_server_takes_the_user_from_open_webui_s_header() -> None:
    # What Open WebUI does: the handshake of the 2025 protocol, the user in its header.
    with serve_stack() as stack:
        async with connect(stack, "legacy", **{"X-OpenWebUI-User-Id": "carol"}) as carol:
            await call(carol, "remember", content="The user lives in Oslo")
        async with connect(stack, "legacy", **{"X-OpenWebUI-User-Id": "dave"}) as dave:
            assert (await call(dave, "list_memories"))["total"] == 0
            assert (await call(dave, "recall", query="Oslo"))["memories"] == []
        (memory,) = (await memories(stack, **{"X-User-Id": "carol"}))["data"]
        assert (memory["user_id"], memory["content"]) == ("carol", "The user lives in Oslo")


async def test_forget_takes_what_says_the_same_and_says_how_many(keyed: Stack) -> None:
    gus = key("open") | {"X-User-Id": "gus"}
    for content, kind in (("I am vegetarian.", "episode"), ("User is vegetarian", "fact"),
                          ("Is vegan", "fact")):  # fmt: skip
        response = await http(
            keyed, "POST", "/v1/memories", gus, {"content": content, "type": kind}
        )
        assert response.status_code == 201, response.text
    async with connect(keyed, **gus) as client:
        fact = await call(client, "remember", content="Is vegetarian")
        forgotten = await call(client, "forget", id=fact["id"])
        assert (forgotten["id"], forgotten["also_deleted"]) == (fact["id"], 2)
        left = await call(client, "list_memories")
    assert [m["content"] for m in left["memories"]] == ["Is vegan"]
