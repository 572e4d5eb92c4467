"""Which paths the generic `/v1/*` relay may forward, judged on the bytes the client sent.

Starlette routes on the percent-decoded path, and httpx removes dot segments when it parses the
upstream URL: unchecked, `/v1/%2e%2e/admin` or `/v1/..%2f..%2fapi/pull` would reach the upstream
as `/admin` or `/api/pull` (Ollama's model management), with ``MEMPROXY_UPSTREAM_API_KEY``
attached, and `/v1/./chat/completions` would be a raw chat that skips validation and memory.

A relayed path, as sent on the wire (the ASGI ``raw_path``), must:

- start with `/v1/` and be made of non-empty segments of RFC 3986 path characters, `;` left
  out (a path parameter, stripped by some servers: `..;` would become `..`);
- have no dot segment (`.` or `..`, in any spelling) and no escape that decodes to `/`, `\\`,
  `?`, `#`, `%`, `;` or a control byte (`%00`-`%1f`, `%7f`): such a path means something else
  to whichever server decodes it next.

It is forwarded exactly as sent (still percent-encoded), so it stays under the upstream's `/v1`.
Anything else is refused with a 400 (``code: invalid_path``) before any byte goes upstream.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from urllib.parse import quote

from starlette.routing import BaseRoute, Route
from starlette.types import Scope

from app.errors import InvalidRequest

_PREFIX = b"/v1/"
# RFC 3986 path characters but `;`: servers of the Java family strip `;params` from a segment,
# which would turn `..;` into `..` and `completions;x` into the chat route, past our checks.
_SEGMENT = re.compile(rb"\A(?:[A-Za-z0-9\-._~!$&'()*+,=:@]|%[0-9A-Fa-f]{2})+\Z")
_ESCAPE = re.compile(rb"%([0-9A-Fa-f]{2})")
_FORBIDDEN = frozenset(
    {*range(0x20), 0x7F, ord("/"), ord("\\"), ord("?"), ord("#"), ord("%"), ord(";")}
)
_DOTS = frozenset({b".", b".."})


def relay_path(scope: Scope) -> str:
    """The path after `/v1/` to send upstream, still percent-encoded; raises :class:`InvalidPath`
    when it could leave the upstream's `/v1`, carry a query, or hide a control byte."""
    raw: bytes = scope.get("raw_path") or quote(scope["path"]).encode("ascii")
    if not raw.startswith(_PREFIX):
        raise InvalidPath(raw, "it must start with /v1/ as sent")
    for segment in raw[len(_PREFIX) :].split(b"/"):
        if not _SEGMENT.match(segment):
            reason = "an empty segment" if not segment else "a character not allowed in a path"
            raise InvalidPath(raw, f"it has {reason}")
        escapes = [int(code, 16) for code in _ESCAPE.findall(segment)]
        if any(byte in _FORBIDDEN for byte in escapes):
            raise InvalidPath(raw, "it encodes /, \\, ?, #, %, ; or a control character")
        if segment.replace(b"%2e", b".").replace(b"%2E", b".") in _DOTS:
            raise InvalidPath(raw, "it has a . or .. segment")
    return raw[len(_PREFIX) :].decode("ascii")


def served_methods(path: str, routes: Iterable[BaseRoute]) -> list[str]:
    """The methods `routes` serve at `path` (decoded, as Starlette routes it), sorted; a path one
    of them serves with other methods is answered 405 by the relay, never forwarded."""
    methods: set[str] = set()
    for route in routes:
        if isinstance(route, Route) and route.methods and route.path_regex.match(path):
            methods |= route.methods
    return sorted(methods)


class InvalidPath(InvalidRequest):
    """A path the relay will not forward (see the module docstring)."""

    default_code = "invalid_path"

    def __init__(self, raw: bytes, reason: str) -> None:
        # repr() escapes control bytes: the message is safe to show and to log.
        shown = repr(raw[:200].decode("latin-1"))
        super().__init__(f"the path {shown} cannot be relayed to the upstream: {reason}")
