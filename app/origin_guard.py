"""What a web page can make the user's browser send memproxy: refused before any route.

Any page the user visits can make the browser send a "simple" request (a POST with a
text/plain, form or untyped body: no CORS preflight) to ``localhost:8000``, which an open server
answers without a key; and a page on a name its owner points at 127.0.0.1 by DNS (rebinding) is
treated by the browser as that name's origin, so it could read every answer. :class:`OriginGuard`,
a pure ASGI middleware, refuses in this order, without reading the body (``Connection: close``):

1. on an open server (no ``MEMPROXY_API_KEYS``), a ``Host`` that is none of memproxy's names:
   421 ``host_not_allowed``. Its names are ``localhost``, any IP address (an address is no name
   anyone can rebind), ``MEMPROXY_HOST``, and ``MEMPROXY_ALLOWED_HOSTS`` (``*``: any name). The
   probes (``/healthz``, ``/readyz``) answer under any name. With keys, a page cannot know one.
2. a write (POST, PUT, PATCH, DELETE; on every route, relayed ones and ``/mcp`` included) that a
   browser sends for a page of another origin: 403 ``cross_origin``, unless keys are set and it
   carries one (an ``Authorization`` header no page can add across origins without the
   preflight memproxy never answers: a browser extension's or a desktop app's). The browser
   says whose page it is in ``Sec-Fetch-Site`` (``same-origin``; ``none``: the user's own doing;
   ``same-site``, ``cross-site``: another page, another port of localhost too) and, in older
   browsers without it, in ``Origin``, compared with ``Host``. A request with neither comes from
   no browser (Open WebUI's backend, curl, the SDKs) and passes.
3. a body whose ``Content-Type`` is not JSON, on the routes that read JSON (chat, the memory API,
   ``/mcp``): 415 ``unsupported_media_type``; the import takes JSON Lines types too. A body
   without a type passes: SDKs and httpx's ``content=`` send none, and a browser sends an untyped
   body only from ``fetch``/``sendBeacon``, which carry ``Sec-Fetch-Site`` and ``Origin`` (2).
   Relayed routes keep the upstream's rules (audio and files are sent as forms).

memproxy serves no CORS headers: a page of another origin cannot send the JSON or the key it
would need anyway (the preflight fails), so no list of trusted origins is kept.
"""

from __future__ import annotations

import ipaddress

from starlette.types import ASGIApp, Receive, Scope, Send

from app.api.mcp import MCP_PATH
from app.config import Settings
from app.errors import (
    CrossOrigin,
    HostNotAllowed,
    MemproxyError,
    UnsupportedMediaType,
    send_refusal,
)
from app.schemas.checks import shown

_WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_PROBES = frozenset({"/healthz", "/readyz"})
_SAME_ORIGIN = frozenset({b"same-origin", b"none"})
_DEFAULT_PORTS = {"http": "80", "https": "443"}
IMPORT_PATH = "/v1/memories/import"
JSON = frozenset({"application/json"})
JSON_LINES = frozenset({
    "application/json", "application/x-ndjson", "application/ndjson", "application/jsonl",
    "application/x-jsonl", "application/jsonlines", "application/x-jsonlines",
})  # fmt: skip
"""What the import takes: an export's own type (``application/x-ndjson``) and its aliases."""
_JSON_PATHS = frozenset({"/v1/chat/completions", "/chat/completions", MCP_PATH})
_JSON_PREFIXES = ("/v1/memories", "/v1/users")


class OriginGuard:
    """See the module docstring; `settings` say whether the server is open and its names."""

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        self._check_host = not settings.api_keys
        names = {_name(h) for h in (*settings.allowed_hosts, settings.host, "localhost")}
        self._any_host = "*" in names
        self._names = frozenset(names)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            try:
                self._check(scope)
            except MemproxyError as exc:
                await send_refusal(send, exc)
                return
        await self.app(scope, receive, send)

    def _check(self, scope: Scope) -> None:
        headers: dict[bytes, bytes] = {}
        for name, value in scope["headers"]:
            headers.setdefault(name, value)
        host = headers.get(b"host", b"").decode("latin-1")
        path: str = scope["path"]
        if self._check_host and host and path not in _PROBES and not self._served(host):
            raise HostNotAllowed(
                f"this server does not answer to the name {shown(_name(host))!r}: an open server "
                "(no MEMPROXY_API_KEYS) answers to localhost, IP addresses and the names in "
                "MEMPROXY_ALLOWED_HOSTS (comma-separated)"
            )
        if scope["method"] not in _WRITES:
            return
        # A page cannot send a key to another origin without a preflight, which memproxy never
        # answers: a keyed request from a browser is an app's own (an extension, Electron).
        keyed = not self._check_host and b"authorization" in headers
        if not keyed and _cross_origin(headers, host):
            raise CrossOrigin(
                "memproxy takes no writes from a web page of another origin; call it from a "
                "server or an app (without the Origin and Sec-Fetch-Site a browser adds), or "
                "from its own page at /ui/"
            )
        accepted = _accepted_types(path)
        if accepted is None or not _has_body(headers):
            return
        given = headers.get(b"content-type")
        if given is not None and _media_type(given) not in accepted:
            send_as = (
                "JSON Lines with 'Content-Type: application/x-ndjson' (or application/json)"
                if accepted is JSON_LINES
                else "JSON with 'Content-Type: application/json'"
            )
            raise UnsupportedMediaType(
                f"a body of type {shown(given.decode('latin-1'))!r} is not taken here: "
                f"send {send_as}"
            )

    def _served(self, host: str) -> bool:
        name = _name(host)
        return self._any_host or name in self._names or _is_address(name)


def _name(host: str) -> str:
    """The name in a ``Host`` value (or an allowed host): lowercased, without the port or a
    final dot; an IPv6 address keeps its brackets."""
    host = host.strip().lower()
    if host.startswith("["):
        return host.partition("]")[0] + "]"
    return host.rpartition(":")[0].rstrip(".") if ":" in host else host.rstrip(".")


def _is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name.removeprefix("[").removesuffix("]"))
    except ValueError:
        return False
    return True


def _cross_origin(headers: dict[bytes, bytes], host: str) -> bool:
    site = headers.get(b"sec-fetch-site")
    if site is not None:
        return site.strip().lower() not in _SAME_ORIGIN
    origin = headers.get(b"origin")
    return origin is not None and not _same_authority(origin.decode("latin-1"), host)


def _same_authority(origin: str, host: str) -> bool:
    """Whether `origin` (``scheme://host[:port]``; ``null`` for a page of no origin) names the
    `host` the request was sent to; a port left out is the scheme's default."""
    scheme, sep, authority = origin.strip().lower().partition("://")
    default = _DEFAULT_PORTS.get(scheme)
    if not sep or default is None or not host:
        return False
    return _authority(authority, default) == _authority(host.strip().lower(), default)


def _authority(value: str, default_port: str) -> tuple[str, str]:
    if value.startswith("["):
        name, _, rest = value.partition("]")
        port = rest.removeprefix(":") if rest else default_port
        return name + "]", port
    name, sep, port = value.partition(":")
    return name, port if sep else default_port


def _accepted_types(path: str) -> frozenset[str] | None:
    """The body types a route reads (None: not checked here)."""
    if path == IMPORT_PATH:
        return JSON_LINES
    if path in _JSON_PATHS or any(path == p or path.startswith(p + "/") for p in _JSON_PREFIXES):
        return JSON
    return None


def _has_body(headers: dict[bytes, bytes]) -> bool:
    length = headers.get(b"content-length")
    return b"transfer-encoding" in headers or (length is not None and length.strip() != b"0")


def _media_type(content_type: bytes) -> str:
    return content_type.decode("latin-1").partition(";")[0].strip().lower()
