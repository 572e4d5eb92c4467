"""Schemathesis over memproxy's own OpenAPI: no request it generates gets a 5xx, and every error
is OpenAI-shaped.

The app runs in-process (httpx's ASGI transport) with the fake embedder, a respx upstream and
no keys; nothing leaves the process. The published schema is completed first with what the
routes read by hand: the chat body (``ChatCompletionRequest``) and the import's JSON Lines.
Each operation gets `FUZZ_EXAMPLES` (50) schema-conforming and as many schema-violating cases,
derandomized (the same cases on every run): ~1,700 requests, ~30 s on two busy cores. For a
longer hunt: ``FUZZ_EXAMPLES=1000 pytest tests/test_schemathesis.py``.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
from collections.abc import Iterator
from contextlib import AsyncExitStack
from typing import Any

import httpx
import pytest
import respx
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from app.config import Settings
from app.main import create_app
from app.schemas.memory_lines import MemoryImport
from app.schemas.openai import ChatCompletionRequest
from tests.fakes import FakeEmbedder
from tests.helpers import UPSTREAM, completion_json

FUZZ_EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "50"))
"""Cases per operation and generation mode (positive, negative)."""
REF = "#/components/schemas/{model}"


@schemathesis.serializer("application/x-ndjson")
def _json_lines(ctx: schemathesis.SerializationContext, value: Any) -> bytes:
    """The import body: one generated memory per line (a non-list is sent as one line)."""
    items = value if isinstance(value, list) else [value]
    return b"".join(json.dumps(item).encode() + b"\n" for item in items)


def _any_of(node: Any) -> Any:
    """`oneOf` as `anyOf`: a text part is also a valid "other" part, so `oneOf` has no valid
    value for hypothesis to find; what memproxy accepts is the union anyway."""
    if isinstance(node, dict):
        return {("anyOf" if k == "oneOf" else k): _any_of(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_any_of(v) for v in node]
    return node


def _body(model: type[Any], media_type: str, *, many: bool = False) -> dict[str, Any]:
    schema = model.model_json_schema(ref_template=REF)
    defs = schema.pop("$defs", {})
    return {
        "defs": defs,
        "requestBody": {
            "required": True,
            "content": {
                media_type: {"schema": {"type": "array", "items": schema} if many else schema}
            },
        },
    }


def completed_schema(published: dict[str, Any]) -> dict[str, Any]:
    """The published OpenAPI with the bodies the chat and import routes read themselves."""
    schema = copy.deepcopy(published)
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for path, method, body in (
        ("/v1/chat/completions", "post", _body(ChatCompletionRequest, "application/json")),
        ("/v1/memories/import", "post", _body(MemoryImport, "application/x-ndjson", many=True)),
    ):
        components.update(body["defs"])
        schema["paths"][path][method]["requestBody"] = body["requestBody"]
    return dict(_any_of(schema))


def fake_upstream() -> respx.Router:
    router = respx.Router(base_url=UPSTREAM, assert_all_called=False)
    router.post("/chat/completions").respond(json=completion_json("fuzzed"))
    router.get("/models").respond(json={"object": "list", "data": [{"id": "m", "object": "model"}]})
    router.route().respond(json={})
    return router


def request_of(case: schemathesis.Case) -> dict[str, Any]:
    """The case as httpx arguments; JSON written with ``\\uXXXX`` escapes (as the attack did):
    a generated lone surrogate reaches memproxy as ``"\\ud800"``."""
    sent = case.as_transport_kwargs(base_url="http://localhost")
    out: dict[str, Any] = {
        "method": sent["method"],
        "url": sent["url"],
        "headers": sent.get("headers") or {},
        "params": sent.get("params") or None,
        "cookies": sent.get("cookies") or None,
    }
    if "json" in sent:
        out["content"] = json.dumps(sent["json"]).encode()
        out["headers"] = {**out["headers"], "Content-Type": "application/json"}
    elif isinstance(sent.get("data"), bytes | str):
        out["content"] = sent["data"]
    elif sent.get("data") is not None:
        out["data"] = sent["data"]
    return out


def check(arguments: dict[str, Any], response: httpx.Response) -> None:
    """No 5xx; every error OpenAI-shaped. A failure shows the request that caused it."""
    sent = {k: v for k, v in arguments.items() if v}
    what = f"{response.status_code} {response.text[:300]}\n  for {str(sent)[:1500]}"
    assert response.status_code < 500, what
    if response.status_code >= 400:
        error = response.json().get("error") if "json" in response.headers["content-type"] else None
        assert isinstance(error, dict), what
        assert set(error) >= {"message", "type", "param", "code"}, what
        assert isinstance(error["message"], str) and isinstance(error["type"], str), what


@pytest.fixture
def served() -> Iterator[tuple[asyncio.Runner, httpx.AsyncClient, dict[str, Any]]]:
    """The app running on an event loop of this test's own (hypothesis calls a plain function)."""
    app = create_app(
        Settings(
            upstream_base_url=UPSTREAM,
            manager_enabled=False,
            upstream_check_at_start=False,
            relevance_threshold=0.0,  # every chat gets memories injected: the rewrite is fuzzed
        ),
        upstream_transport=httpx.MockTransport(fake_upstream().async_handler),
        embedder=FakeEmbedder(),
    )
    # A 500 is answered, not raised: every failing operation is reported, not just the first.
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    client = httpx.AsyncClient(transport=transport, base_url="http://localhost")
    with asyncio.Runner() as runner:
        stack = AsyncExitStack()
        runner.run(stack.enter_async_context(app.router.lifespan_context(app)))
        runner.run(stack.enter_async_context(client))
        try:
            yield runner, client, app.openapi()
        finally:
            runner.run(stack.aclose())


def test_no_generated_request_gets_a_5xx(
    served: tuple[asyncio.Runner, httpx.AsyncClient, dict[str, Any]],
) -> None:
    runner, client, published = served
    schema = schemathesis.openapi.from_dict(completed_schema(published))
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 15  # the schema was read: every route is fuzzed
    failures: list[str] = []
    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @settings(
                max_examples=FUZZ_EXAMPLES,
                derandomize=True,
                database=None,
                deadline=None,
                phases=[Phase.explicit, Phase.generate, Phase.shrink],
                suppress_health_check=list(HealthCheck),
            )
            @given(case=operation.as_strategy(generation_mode=mode))
            def fuzz(case: schemathesis.Case) -> None:
                arguments = request_of(case)
                try:
                    response = runner.run(client.request(**arguments))
                except (UnicodeEncodeError, httpx.InvalidURL, httpx.LocalProtocolError):
                    return  # httpx cannot send it (a non-ASCII header...): no request was made
                check(arguments, response)

            try:
                fuzz()
            except Unsatisfiable:
                assert mode is GenerationMode.NEGATIVE  # nothing to violate (no parameters)
            except AssertionError as exc:  # after shrinking: the simplest request that fails
                failures.append(f"{operation.label} ({mode.value}): {exc}")
    assert not failures, "\n".join(failures)
