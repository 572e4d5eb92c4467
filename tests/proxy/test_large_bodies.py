"""One big chat must not stall every other request (issue 11: a 50 MB chat kept `/healthz`
waiting 6 s). A large body's parsing, checking, recall query, re-serialisation and Manager
bookkeeping run in a worker thread, each cut into pieces so that no one call into C (which
keeps the GIL throughout) gets the whole of it; small chats keep the direct path.

These tests check the structure (which thread ran a step, how much one call was given), never
a duration: bench/loop_stall.py measures the stall itself. The upstream is respx.
"""

from __future__ import annotations

import base64
import hashlib
import re
import subprocess
import sys
import threading
from types import SimpleNamespace
from typing import Any

import httpx
import orjson
import pytest
import respx

import app.memory.chat.glue as memory_hooks
import app.memory.chat.query as context
import app.memory.learning.extraction as extraction
import app.memory.learning.turns as turns
import app.proxy.body as body
import app.proxy.history as history
import app.proxy.json_pieces as json_pieces
from app.memory.block import BLOCK_END, BLOCK_START, strip_block
from app.proxy.offload import LARGE_BODY_BYTES, PIECE_CHARS, PIECE_ITEMS
from app.schemas.openai import chat_request_adapter
from tests.conftest import AppClientFactory
from tests.helpers import completion_json
from tests.memory.learning.support import Remembering, manager_client, services

ANN = {"X-User-Id": "ann"}
LARGE_TEXT = "tell me more about the sea " * (LARGE_BODY_BYTES // 20)
LONG_TEXT = "a few words of a long pasted document\n" * (3 * PIECE_CHARS // 38)
"""Three pieces' worth of text."""


@pytest.fixture
def upstream_ok(upstream: respx.Router) -> respx.Route:
    return upstream.post("/chat/completions").respond(json=completion_json("Noted."))


def chat(text: str) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": text}]}


async def test_a_large_chat_is_parsed_off_the_event_loop_a_small_one_on_it(
    client: httpx.AsyncClient, upstream_ok: respx.Route, monkeypatch: pytest.MonkeyPatch
) -> None:
    loop_thread = threading.get_ident()
    parsed: dict[bytes, tuple[str, int]] = {}

    def watched(name: str, real: Any) -> Any:
        def loads(data: Any, *args: Any) -> Any:
            for marker in (b"small question", b"tell me more"):
                if isinstance(data, bytes) and marker in data[:200]:
                    parsed[marker] = name, threading.get_ident()
            return real(data, *args)

        return loads

    monkeypatch.setattr(orjson, "loads", watched("orjson", orjson.loads))
    monkeypatch.setattr(
        json_pieces, "loads_with_spans", watched("pieces", json_pieces.loads_with_spans)
    )
    for text in ("small question", LARGE_TEXT):
        response = await client.post(
            "/v1/chat/completions", json=chat(text), headers={**ANN, "X-Memory": "off"}
        )
        assert response.status_code == 200, response.text
    assert parsed[b"small question"] == ("orjson", loop_thread)  # the fast path: no thread hop
    parser, thread = parsed[b"tell me more"]
    assert (parser, thread != loop_thread) == ("pieces", True)  # one message a call, off loop
    assert orjson.loads(upstream_ok.calls.last.request.content)["messages"][0]["content"] == (
        LARGE_TEXT
    )


async def test_recall_and_the_manager_job_of_a_large_chat_are_worked_out_off_the_loop(
    make_client: AppClientFactory, upstream_ok: respx.Route, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = await manager_client(make_client, Remembering())
    loop_thread = threading.get_ident()
    threads: dict[str, set[int]] = {"recall_query": set(), "fingerprint": set()}
    for module, name in ((memory_hooks, "recall_query"), (turns, "fingerprint")):
        real = getattr(module, name)

        def recording(*args: Any, _name: str = name, _real: Any = real) -> Any:
            threads[_name].add(threading.get_ident())
            return _real(*args)

        monkeypatch.setattr(module, name, recording)
    response = await client.post("/v1/chat/completions", json=chat(LARGE_TEXT), headers=ANN)
    assert response.status_code == 200, response.text
    await services(client).runner.drain(10)
    assert threads["recall_query"] and loop_thread not in threads["recall_query"]
    assert threads["fingerprint"] and loop_thread not in threads["fingerprint"]

    threads = {"recall_query": set(), "fingerprint": set()}
    response = await client.post("/v1/chat/completions", json=chat("I like tea"), headers=ANN)
    await services(client).runner.drain(10)
    assert threads == {"recall_query": {loop_thread}, "fingerprint": {loop_thread}}


class Recording:
    """Wraps pydantic's adapter: how many messages each call is given."""

    def __init__(self, sizes: list[int]) -> None:
        self.sizes = sizes

    def validate_python(self, data: Any) -> Any:
        self.sizes.append(len(data["messages"]))
        return chat_request_adapter.validate_python(data)


async def test_many_messages_are_checked_and_written_back_a_slice_at_a_time(
    client: httpx.AsyncClient, upstream_ok: respx.Route, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With memories injected, the rewritten body is still orjson's bytes, key order kept."""
    stored = await client.post(
        "/v1/memories", json={"content": "The user lives by the sea"}, headers=ANN
    )
    assert stored.status_code == 201, stored.text
    turns = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} about the sea"}
        for i in range(int(PIECE_ITEMS * 2.5))
    ]
    request = {"model": "m", "messages": [{"role": "system", "content": "Be brief."}, *turns]}
    request["temperature"] = 0.5  # after `messages`: key order must survive the slices
    checked: list[int] = []
    written: list[int] = []
    real_dumps = orjson.dumps

    def dumps(value: Any, *args: Any) -> bytes:
        if isinstance(value, list):
            written.append(len(value))
        elif isinstance(value, dict) and isinstance(value.get("messages"), list):
            written.append(len(value["messages"]))
        return real_dumps(value, *args)

    monkeypatch.setattr(body, "chat_request_adapter", Recording(checked))
    monkeypatch.setattr(orjson, "dumps", dumps)
    response = await client.post("/v1/chat/completions", json=request, headers=ANN, params={})
    monkeypatch.undo()
    assert response.status_code == 200, response.text
    assert response.headers["x-memories-injected"] == "1"
    assert checked and max(checked) <= PIECE_ITEMS
    assert written and max(written) <= PIECE_ITEMS
    sent = upstream_ok.calls.last.request.content
    forwarded = orjson.loads(sent)
    assert sent == orjson.dumps(forwarded)
    assert list(forwarded) == ["model", "messages", "temperature"]
    assert forwarded["messages"][1:] == turns
    assert BLOCK_START in forwarded["messages"][0]["content"]


async def test_a_bad_message_in_a_later_slice_is_named_exactly(
    client: httpx.AsyncClient, upstream_ok: respx.Route
) -> None:
    turns: list[dict[str, Any]] = [{"role": "user", "content": "hi"}] * (PIECE_ITEMS * 2)
    turns[PIECE_ITEMS + 7] = {"role": "user", "content": 42}
    response = await client.post(
        "/v1/chat/completions", json={"model": "m", "messages": turns}, headers=ANN
    )
    assert response.status_code == 422
    assert response.json()["error"]["param"] == f"messages[{PIECE_ITEMS + 7}].content"
    assert not upstream_ok.called


class Searching:
    """Wraps a compiled pattern: how many characters each call is given."""

    def __init__(self, pattern: re.Pattern[str], sizes: list[int]) -> None:
        self.pattern, self.sizes = pattern, sizes

    def search(self, text: str, pos: int = 0, endpos: int = sys.maxsize) -> Any:
        self.sizes.append(min(endpos, len(text)) - pos)
        return self.pattern.search(text, pos, endpos)

    def finditer(self, text: str, pos: int = 0, endpos: int = sys.maxsize) -> Any:
        self.sizes.append(min(endpos, len(text)) - pos)
        return self.pattern.finditer(text, pos, endpos)

    def findall(self, text: str) -> Any:
        self.sizes.append(len(text))
        return self.pattern.findall(text)


def test_a_long_text_is_searched_in_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    sizes: list[int] = []
    monkeypatch.setattr(context, "_WORDS", Searching(context._WORDS, sizes))
    query = context.recall_query([{"role": "user", "content": LONG_TEXT}])
    assert query == f"{LONG_TEXT.strip()[:1000]} {LONG_TEXT.strip()[-1000:]}"
    assert sizes and max(sizes) <= 2 * PIECE_CHARS


def test_a_long_text_asks_to_remember_only_at_its_start_or_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What the Manager is given of it; its middle is never searched (the pattern is slow: a
    50 MB turn's search outlasted the bound on writing its job, and the chat answered 503)."""
    sizes: list[int] = []
    monkeypatch.setattr(extraction, "EXPLICIT", Searching(extraction.EXPLICIT, sizes))
    ask = "Please remember that I am vegan. "
    assert len(LONG_TEXT) > 100 * (extraction.TURN_HEAD_CHARS + extraction.TURN_TAIL_CHARS)
    assert not extraction.is_explicit(LONG_TEXT)
    assert extraction.is_explicit(ask + LONG_TEXT)
    assert extraction.is_explicit(LONG_TEXT + ask)
    middle = len(LONG_TEXT) // 2
    assert not extraction.is_explicit(LONG_TEXT[:middle] + ask + LONG_TEXT[middle:])
    read = extraction.TURN_HEAD_CHARS + extraction.TURN_TAIL_CHARS + 64  # and the cut's note
    assert sizes and max(sizes) <= read
    assert extraction.is_explicit("x " * 20_000 + "remember that I am vegan")


def test_a_long_text_is_fingerprinted_in_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same fingerprint as normalising it whole, the hash fed a piece at a time."""
    fed: list[int] = []

    class Sha:
        def __init__(self, data: bytes = b"") -> None:
            self.real = hashlib.sha256(data)
            fed.append(len(data))

        def update(self, data: bytes) -> None:
            fed.append(len(data))
            self.real.update(data)

        def hexdigest(self) -> str:
            return self.real.hexdigest()

    text = "  first  \n" + LONG_TEXT + "\t last"
    whole = (" ".join("before".split()) + "\x00" + " ".join(text.split())).encode()
    monkeypatch.setattr(turns, "hashlib", SimpleNamespace(sha256=Sha))
    assert turns.fingerprint("before", text) == hashlib.sha256(whole).hexdigest()
    assert max(fed) <= 2 * PIECE_CHARS


def test_long_base64_is_decoded_in_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    audio = bytes(range(256)) * (3 * PIECE_CHARS // 256)
    data = base64.b64encode(audio).decode()
    decoded: list[int] = []

    def b64decode(text: str | bytes, validate: bool = False) -> bytes:
        decoded.append(len(text))
        return base64.b64decode(text, validate=validate)

    monkeypatch.setattr(history, "base64", SimpleNamespace(b64decode=b64decode))
    content = [
        {"type": "input_audio", "input_audio": {"data": data, "format": "wav"}},
        {"type": "file", "file": {"file_data": f"data:application/pdf;base64,{data}"}},
    ]
    request = chat_request_adapter.validate_python(
        {"model": "m", "messages": [{"role": "user", "content": content}]}
    )
    sound, pdf = history.convert(request.messages).prompt or []
    assert getattr(sound, "data", None) == audio and getattr(pdf, "data", None) == audio
    assert getattr(pdf, "media_type", None) == "application/pdf"
    assert max(decoded) <= PIECE_CHARS


OLD_BLOCK = re.compile(
    r"\n*" + re.escape(BLOCK_START) + r".*?" + re.escape(BLOCK_END) + r"\n*", re.S
)


@pytest.mark.parametrize(
    "text",
    [
        f"a\n\n{BLOCK_START}\nx\n{BLOCK_END}\n\nb",
        f"{BLOCK_START}x{BLOCK_END}{BLOCK_START}y{BLOCK_END}\n",
        f"\n\nkeep {BLOCK_START} unclosed\n",
        f"a{BLOCK_START}{BLOCK_START}x{BLOCK_END}{BLOCK_END}\n\n\nb",
        f"{BLOCK_END}a\n{BLOCK_START}\n",
    ],
)
def test_blocks_are_stripped_as_before(text: str) -> None:
    assert strip_block(text) == OLD_BLOCK.sub("\n\n", text).strip("\n")


def test_stripping_blocks_takes_linear_time() -> None:
    """Start tags without end tags, and a start tag after a run of newlines, made the old regex
    quadratic (300 KB: 30 s, the GIL held). Run apart so that a regression cannot hang the
    suite; the timeout is a guard (the old code needs hours for this), not a measurement."""
    code = (
        "from app.memory.block import strip_block, BLOCK_START\n"
        "from app.memory.foreign import strip_foreign, OPENWEBUI_MEMORY_START\n"
        "strip_block(BLOCK_START * 200_000)\n"
        "strip_block(BLOCK_START + '\\n' * 2_000_000 + 'x')\n"
        "strip_foreign(OPENWEBUI_MEMORY_START * 200_000)\n"
        "strip_foreign(OPENWEBUI_MEMORY_START + '\\n' * 2_000_000 + 'x')\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
