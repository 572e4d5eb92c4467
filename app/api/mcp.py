"""The MCP server at ``/mcp``: the user's memories as tools for MCP clients (Open WebUI's External
Tools, Claude Desktop, any MCP client), on the official SDK's Streamable HTTP transport.

- Who: each HTTP request is authenticated and its user resolved as on chat, before the SDK sees
  it (:class:`McpEndpoint`): no or a bad key is a 401, an admin key a 403 ``admin_key`` (it
  belongs to no user), a key bound to a user acts as that user, else the identity headers name
  the user (Open WebUI's, signed when ``MEMPROXY_OPENWEBUI_JWT_SECRET`` is set). The tools read
  the user from the request's state.
- Stateless: the SDK's stateless mode, JSON responses, POST only; any replica answers any
  request. BodyGuard caps the bodies at ``MEMPROXY_MEMORY_MAX_BODY_BYTES``.
- Errors: a bad argument (an unknown type, a limit out of range, empty or too long content, an
  unknown id) is a tool result with ``isError`` and a message the model can act on; the SDK
  answers anything unexpected the same way, without the exception's text."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Annotated, Literal

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp.types import CallToolResult, TextContent
from pydantic import BaseModel, Field, ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from app import __version__
from app.config import Settings
from app.deps import Services, chat_user, client_key
from app.errors import MemproxyError, ServerBusy
from app.memory.store.records import Changes, MemoryRecord, NewMemory
from app.memory.store.tables import MemoryType
from app.schemas.mcp import Forgotten, Hit, Item, Page, Recalled, Remembered, Stats
from app.schemas.memories import MemoryCreate, MemorySearch, check_length

MCP_PATH = "/mcp"
TypeName = Literal["fact", "preference", "knowledge", "event", "correction", "feedback"]
"""The values of :class:`FactType` (what `remember` writes), spelt out so that the tools' schemas
list them inline."""
KindName = Literal["fact", "preference", "knowledge", "event", "correction", "feedback", "episode"]
"""The values of :class:`MemoryType` (what `recall` and `list_memories` filter by)."""
Limit = Annotated[int, Field(ge=1, le=100, description="How many memories at most (1-100).")]
Statement = Annotated[
    str, Field(description="One self-contained statement, e.g. 'The user's daughter is Mia'.")
]
Id = Annotated[str, Field(description="The memory's id, as recall or list_memories gave it.")]
UNKNOWN = "the user has no memory with id {!r}: find ids with recall or list_memories"
INSTRUCTIONS = (
    "Long-term memory of the user you are talking to, kept across conversations. Use recall "
    "before answering what depends on the user; remember lasting facts and preferences they "
    "share; update_memory or forget what changed or is wrong."
)


@dataclass(frozen=True, slots=True)
class _Caller:
    services: Services
    user_id: str


async def remember(
    ctx: Context,
    content: Statement,
    type: Annotated[TypeName, Field(description="What kind of memory it is.")] = "fact",
    pinned: Annotated[
        bool, Field(description="True: shown in every chat, never forgotten automatically.")
    ] = False,
    profile: Annotated[
        bool,
        Field(
            description="True: a standing fact about who the user is (household, health, "
            "diet, lasting preferences, how they want answers), shown in every chat."
        ),
    ] = False,
) -> Annotated[CallToolResult, Remembered]:
    """Store one statement about the user, kept for future conversations. Use it when the user
    asks you to remember something, or tells you a lasting fact or preference about themselves.
    Returns the memory (id, content, type, pinned, profile, observed_at); already_existed is
    true when the user had this very statement already, and nothing new was stored."""
    caller = _caller(ctx)
    text = _text(caller, content)
    new = NewMemory(content=text, type=MemoryType(type), pinned=pinned, profile=profile)
    # Looked for and stored in one write holding the user's lock: once, however many at once.
    written = await caller.services.memory.add(caller.user_id, [new], once=True)
    (record,), (created,) = written.records, written.created
    return _result(Remembered(**_item(record).model_dump(), already_existed=not created))


async def recall(
    ctx: Context,
    query: Annotated[str, Field(description="What to look for, in a few words or a question.")],
    limit: Limit = 5,
    types: Annotated[list[KindName] | None, Field(description="Only these types.")] = None,
) -> Annotated[CallToolResult, Recalled]:
    """Search the user's memories by meaning, as chat recall does. Use it before answering
    what depends on the user, or to find the id of a memory to update or forget. Returns the
    relevant memories (id, content, type, profile, observed_at, score), best first; none may
    be."""
    caller = _caller(ctx)
    text = _text(caller, query, "query")
    found = await caller.services.memory.search(
        caller.user_id,
        text,
        limit=limit,
        min_score=caller.services.settings.relevance_threshold,
        types=types or (),
    )
    hits = [Hit(**_item(f.memory).model_dump(), score=round(f.hit.score, 3)) for f in found]
    return _result(Recalled(memories=hits))


async def list_memories(
    ctx: Context,
    type: Annotated[KindName | None, Field(description="Only memories of this type.")] = None,
    limit: Limit = 20,
) -> Annotated[CallToolResult, Page]:
    """List the user's memories, newest first, all or of one type: to review what you know
    about the user (recall searches by topic). Returns the memories (id, content, type, pinned,
    profile, observed_at) and total, how many there are in all."""
    caller = _caller(ctx)
    types = [MemoryType(type)] if type is not None else []
    records, total = await caller.services.memory.page(caller.user_id, types=types, limit=limit)
    return _result(Page(memories=[_item(r) for r in records], total=total))


async def update_memory(
    ctx: Context,
    id: Id,
    content: Annotated[str | None, Field(description="The new text.")] = None,
    pinned: Annotated[
        bool | None, Field(description="True: shown in every chat; false: no longer pinned.")
    ] = None,
    profile: Annotated[
        bool | None,
        Field(description="True: a standing fact about the user, shown in every chat; false: not."),
    ] = None,
) -> Annotated[CallToolResult, Item]:
    """Change one of the user's memories: its text, when what it says has changed or was wrong,
    or whether it is pinned or a profile fact (shown in every chat). Give at least one of them;
    find the id with recall or list_memories first. Returns the memory as updated."""
    caller = _caller(ctx)
    changes: Changes = {}
    if content is not None:
        changes["content"] = _text(caller, content)
    if pinned is not None:
        changes["pinned"] = pinned
    if profile is not None:
        changes["profile"] = profile
    if not changes:
        raise ToolError("nothing to change: give content, pinned or profile")
    record = await caller.services.memory.update(caller.user_id, id, **changes)
    if record is None:
        raise ToolError(UNKNOWN.format(id))
    return _result(_item(record))


async def forget(ctx: Context, id: Id) -> Annotated[CallToolResult, Forgotten]:
    """Delete one of the user's memories for good, when the user asks you to forget it or it is
    wrong. Find the id with recall or list_memories first. A fact goes with the user's words it
    was learned from and the memories that say the same. Returns the memory deleted, and how
    many went with it."""
    caller = _caller(ctx)
    record = await caller.services.memory.get(caller.user_id, id)
    removed = await caller.services.memory.delete(caller.user_id, [id]) if record else None
    if record is None or removed is None or not removed.ids:
        raise ToolError(UNKNOWN.format(id))
    item = _item(record).model_dump()
    return _result(Forgotten.model_validate(item | {"also_deleted": len(removed.also)}))


async def memory_stats(ctx: Context) -> Annotated[CallToolResult, Stats]:
    """How much is remembered about the user: memories in all, by type, pinned, profile, times
    recalled, the oldest and newest; and the learning from chats still to do (jobs: awaiting,
    queued, running, pending = those three but idle jobs, failed, idle = the idle-time upkeep
    waiting or running)."""
    caller = _caller(ctx)
    stats = await caller.services.store.stats(caller.user_id)
    jobs = await caller.services.jobs.progress(caller.user_id)
    return _result(Stats.model_validate(stats | {"jobs": jobs}))  # the rest of `stats` ignored


def _caller(ctx: Context) -> _Caller:
    caller = getattr(getattr(ctx.request_context.request, "state", None), "mcp_caller", None)
    if not isinstance(caller, _Caller):  # only reachable without McpEndpoint in front
        raise ToolError("no user: this tool is served at /mcp only")
    return caller


def _text(caller: _Caller, text: str, param: str = "content") -> str:
    """`text` trimmed and checked as the memory API checks a memory's content (non-empty, valid
    Unicode, at most MEMPROXY_MEMORY_MAX_CHARS) or a search's query; a tool error otherwise."""
    try:
        if param == "query":
            return MemorySearch(query=text).query
        text = MemoryCreate(content=text).content
        check_length(text, caller.services.settings.memory_max_chars, param)
    except ValidationError as exc:
        why = str(exc.errors()[0]["msg"]).removeprefix("Value error, ").replace("content", param)
        raise ToolError(why if why.startswith(param) else f"{param}: {why}") from None
    except MemproxyError as exc:
        raise ToolError(exc.message) from None
    return text


def _item(record: MemoryRecord) -> Item:
    return Item.model_validate(record, from_attributes=True)


def _result(model: BaseModel) -> CallToolResult:
    """`model` as structured content, and as compact JSON text for clients that read only that
    (Open WebUI does); the SDK would indent it."""
    return CallToolResult(
        content=[TextContent(type="text", text=model.model_dump_json())],
        structured_content=model.model_dump(mode="json"),
    )


def build_server() -> MCPServer:
    """The tools on a server of their own (one per app: tests build many in one process).

    ``MCPServer()`` calls ``logging.basicConfig``, which would give the root logger a handler
    and the INFO level (every library's INFO lines printed): undone, app.log configures logging.
    """
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        server: MCPServer = MCPServer("memproxy", version=__version__, instructions=INSTRUCTIONS)
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
    for tool in (remember, recall, list_memories, update_memory, forget, memory_stats):
        server.add_tool(tool)
    return server


class McpEndpoint:
    """The ASGI app at :data:`MCP_PATH`: chat's authentication and user, then the SDK."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._server = build_server()
        self._manager: StreamableHTTPSessionManager | None = None
        self.route = Route(MCP_PATH, self)

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The SDK's session manager, for one run of the app's lifespan (a fresh one each time:
        the SDK's runs once), in a task of its own: its task group must be left by the task that
        entered it, and a lifespan may be left by another (a test's fixture). Stateless, JSON;
        the SDK's Host and Origin checks off: app/origin_guard.py makes memproxy's own, on every
        route (names from MEMPROXY_ALLOWED_HOSTS, as memproxy runs behind proxies)."""
        self._server.streamable_http_app(
            stateless_http=True,
            json_response=True,
            max_request_body_size=self._settings.memory_max_body_bytes,
            transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        )
        manager, ready, stop = self._server.session_manager, asyncio.Event(), asyncio.Event()

        async def run() -> None:
            try:
                async with manager.run():
                    self._manager = manager
                    ready.set()
                    await stop.wait()
            finally:
                self._manager = None
                ready.set()  # also when it could not start

        task = asyncio.create_task(run(), name="mcp-session-manager")
        await ready.wait()
        if task.done():
            task.result()  # it could not start: its error
        try:
            yield
        finally:
            stop.set()
            await task

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope)
        services: Services = request.app.state.services
        key = client_key(services, request.headers.get("authorization"))
        user_id = chat_user(services, request, key)
        state = scope.setdefault("state", {})
        state["user_id"] = user_id  # for the access log line
        state["mcp_caller"] = _Caller(services, user_id)
        if scope["method"] != "POST":  # a GET stream would be held open, for nothing to send
            raise HTTPException(405, "the MCP server is stateless: POST only", {"Allow": "POST"})
        if self._manager is None:
            raise ServerBusy("the MCP server is not running (memproxy is starting or stopping)")
        await self._manager.handle_request(scope, receive, send)
