"""The upstream model server: URLs, headers, and errors, over one shared ``httpx.AsyncClient``.

Header policy (what goes upstream):

- the client's headers, except hop-by-hop ones, ``Host``, ``Content-Length``, ``Cookie``,
  ``Accept-Encoding`` (we ask for identity so relayed bytes are the bytes the upstream wrote),
  ``X-Memory``, and the headers that identify the person (the configured user id and name
  headers and every ``X-OpenWebUI-User-*``): the upstream may be a third party, and who the
  user is stays here;
- ``Authorization``: ``Bearer MEMPROXY_UPSTREAM_API_KEY`` when set; else the client's own, but
  only when memproxy has no keys of its own (``MEMPROXY_API_KEYS`` empty), so a memproxy key
  never leaves memproxy;
- ``X-Request-Id``: this request's id, so upstream logs can be matched with ours.

Header policy (what comes back): the upstream's headers, except hop-by-hop ones,
``Content-Length``, ``Content-Encoding``, ``Date`` and ``Server``; with an error status only
``Retry-After`` and the rate-limit headers (``X-RateLimit-*``, ``RateLimit*``), which tell the
client when to try again. Whatever the upstream sent is served on memproxy's origin, the memory
page's: every relayed answer carries :data:`RELAYED_HEADERS` (``nosniff`` and a CSP allowing
nothing, so an HTML answer cannot run as a page there), and an event stream
:data:`STREAM_HEADERS` (never cached, nor buffered by a reverse proxy), in place of the
upstream's own.

Errors: refused connection or unresolvable host, or an answer that is not valid HTTP (a response
head over 64 KiB included) -> :class:`UpstreamUnreachable` (502); any timeout ->
:class:`UpstreamTimeout` (504); both name the URL (its password and query values masked: every
message uses :attr:`Upstream.shown_url`) and the setting to change. An HTTP error status ->
:class:`UpstreamStatusError` carrying the upstream's status, body and retry headers.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import httpx

from app.config import Settings
from app.errors import UpstreamError, UpstreamStatusError, UpstreamTimeout, UpstreamUnreachable
from app.log import mask_url
from app.metrics import Metrics
from app.proxy.tls import ssl_context, verification_failed, verification_hint
from app.proxy.transport import LeanTransport, Piece, Pieces

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
    }
)
_DROP_REQUEST = HOP_BY_HOP | {
    "host",
    "content-length",
    "authorization",
    "accept-encoding",
    "cookie",
    "expect",
    "x-memory",
    "x-request-id",
}
RELAYED_HEADERS = (
    (b"x-content-type-options", b"nosniff"),
    (b"content-security-policy", b"default-src 'none'; frame-ancestors 'none'; sandbox"),
)
"""On every answer relayed from the upstream, replacing the upstream's own."""
STREAM_HEADERS = ((b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no"))
"""On an event stream besides, replacing the upstream's own: buffering reverse proxies (nginx)
pass the events through as they come."""
_DROP_RESPONSE = frozenset(
    name.encode() for name in HOP_BY_HOP | {"content-length", "content-encoding", "date", "server"}
)
_IDENTITY_PREFIX = "x-openwebui-user-"
_RATE_LIMIT_PREFIXES = ("x-ratelimit-", "ratelimit")
MAX_ERROR_BODY = 1024 * 1024


def build_transport(settings: Settings) -> httpx.AsyncBaseTransport:
    """The pooled HTTP/1.1 transport to the upstream (see `app.proxy.transport`), trusting
    what `app.proxy.tls` says."""
    limits = httpx.Limits(
        max_connections=settings.upstream_max_connections,
        max_keepalive_connections=settings.upstream_max_connections,
        # Under the 5 s idle timeout of uvicorn-based upstreams (vLLM): reusing a connection
        # the server is about to close would fail a request.
        keepalive_expiry=4,
    )
    return LeanTransport(limits=limits, verify=ssl_context(settings, httpx.create_ssl_context))


def build_client(settings: Settings, transport: httpx.AsyncBaseTransport) -> httpx.AsyncClient:
    """The one client the app shares: owns `transport`, carries the timeouts; no redirects."""
    connect = settings.upstream_connect_timeout_seconds
    read = settings.upstream_read_timeout_seconds
    return httpx.AsyncClient(
        transport=transport,
        timeout=httpx.Timeout(connect=connect, read=read, write=read, pool=connect),
        follow_redirects=False,
        # Environment proxies (HTTP_PROXY...) would silently reroute a LAN Ollama.
        trust_env=False,
    )


class Upstream:
    """Opens requests to the upstream and maps transport failures to memproxy errors."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        transport: httpx.AsyncBaseTransport,
        settings: Settings,
        *,
        proxy_keys_enabled: bool,
        metrics: Metrics | None = None,
    ):
        self.client = client
        self._metrics = metrics
        # Requests go straight to the client's transport: the client's auth, redirect and
        # cookie layers do nothing here and cost ~14 % of the proxy's CPU. The client owns the
        # transport (closing it closes the pool); each request carries the client's timeouts.
        self._transport = transport
        self.base_url = settings.upstream_base_url
        self.shown_url = mask_url(self.base_url)
        """The base URL as messages and logs show it: its password and query values masked."""
        self._api_key = (
            settings.upstream_api_key.get_secret_value() if settings.upstream_api_key else None
        )
        self._pass_client_auth = self._api_key is None and not proxy_keys_enabled
        self._connect_timeout = settings.upstream_connect_timeout_seconds
        self._read_timeout = settings.upstream_read_timeout_seconds
        named = [*settings.user_id_headers, *settings.user_name_headers]
        self._drop = _DROP_REQUEST | {name.lower() for name in named}
        self._timeouts = client.timeout.as_dict()
        self._urls: dict[str, httpx.URL] = {}

    def url(self, path: str, query: str = "") -> str:
        """`path` is relative to the base URL (`/chat/completions`), never with `/v1`."""
        return f"{self.base_url}{path}" + (f"?{query}" if query else "")

    def headers(
        self, incoming: Sequence[tuple[str, str]], request_id: str
    ) -> list[tuple[str, str]]:
        """Upstream headers from the client's (lower-case names), per the module's policy."""
        out = [
            (name, value)
            for name, value in incoming
            if name not in self._drop and not name.startswith(_IDENTITY_PREFIX)
        ]
        authorization = next((v for n, v in incoming if n == "authorization"), None)
        if self._api_key is not None:
            out.append(("authorization", f"Bearer {self._api_key}"))
        elif self._pass_client_auth and authorization:
            out.append(("authorization", authorization))
        out.append(("accept-encoding", "identity"))
        out.append(("x-request-id", request_id))
        return out

    def build(
        self,
        method: str,
        path: str,
        *,
        headers: list[tuple[str, str]],
        content: bytes | list[Piece],
        query: str = "",
    ) -> httpx.Request:
        """The request to the upstream's `path`; `content` the body, or its pieces (sent as they
        are: :class:`~app.proxy.transport.Pieces`)."""
        # Built directly (not `client.build_request`): the client has no defaults to merge, and
        # the hot paths reuse one parsed URL instead of parsing the string on every request.
        url = None if query else self._urls.get(path)
        if url is None:
            url = httpx.URL(self.url(path, query))
            if not query and len(self._urls) < 64:
                self._urls[path] = url
        # latin-1: header values go on as the client's bytes (Starlette reads them as latin-1;
        # httpx's default, ascii, refused a UTF-8 `X-Title: Zoë` with a 500).
        return httpx.Request(
            method,
            url,
            headers=httpx.Headers(headers, encoding="latin-1"),
            content=content if isinstance(content, bytes) else None,
            stream=None if isinstance(content, bytes) else Pieces(content),
            extensions={"timeout": self._timeouts},
        )

    async def open(self, request: httpx.Request) -> httpx.Response:
        """Send and return the response with its body unread; error statuses raise, body read.
        The wait for the response headers is observed in ``memproxy_upstream_seconds``."""
        started = time.perf_counter()
        try:
            response = await self._transport.handle_async_request(request)
            response.request = request
        except httpx.TimeoutException as exc:
            self._observe(request, "timeout", started)
            raise self._timeout(exc) from None
        except httpx.LocalProtocolError as exc:  # nothing was sent: a header memproxy refuses
            self._observe(request, "unreachable", started)
            raise UpstreamUnreachable(
                f"memproxy did not send the request to the upstream at {self.shown_url}: {exc}"
            ) from None
        except httpx.TransportError as exc:
            self._observe(request, "unreachable", started)
            if (failed := verification_failed(exc)) is not None:
                raise UpstreamUnreachable(
                    f"cannot reach the upstream at {self.shown_url}: {verification_hint(failed)}"
                ) from None
            reason = f"{type(exc).__name__}: {exc or 'no detail'}"
            what = (
                "no valid answer from" if isinstance(exc, httpx.RemoteProtocolError)
                else "cannot reach"
            )  # fmt: skip
            raise UpstreamUnreachable(
                f"{what} the upstream at {self.shown_url} ({reason}); check that it is "
                "running and that MEMPROXY_UPSTREAM_BASE_URL points at it"
            ) from None
        self._observe(request, f"{response.status_code // 100}xx", started)
        if response.status_code >= 400:
            body = await _read_capped(response, MAX_ERROR_BODY)
            retry = {
                name: value
                for name, value in response.headers.items()
                if name == "retry-after" or name.startswith(_RATE_LIMIT_PREFIXES)
            }
            raise UpstreamStatusError(response.status_code, body, headers=retry)
        return response

    def body_error(self, exc: httpx.HTTPError) -> UpstreamError:
        """The error for a body that failed before any of it reached the client."""
        if isinstance(exc, httpx.TimeoutException):
            return self._timeout(exc)
        return UpstreamUnreachable(
            f"the upstream at {self.shown_url} broke off before sending its answer "
            f"({type(exc).__name__}: {exc or 'no detail'})",
            code="upstream_disconnected",
        )

    def _observe(self, request: httpx.Request, result: str, started: float) -> None:
        if self._metrics is None:
            return
        path = request.url.path
        endpoint = (
            "chat" if path.endswith("/chat/completions")
            else "models" if path.endswith("/models") else "other"
        )  # fmt: skip
        self._metrics.upstream_seconds.labels(endpoint, result).observe(
            time.perf_counter() - started
        )

    def _timeout(self, exc: httpx.TimeoutException) -> UpstreamTimeout:
        if isinstance(exc, httpx.ConnectTimeout | httpx.PoolTimeout):
            what, seconds, setting = (
                "connect",
                self._connect_timeout,
                "MEMPROXY_UPSTREAM_CONNECT_TIMEOUT_SECONDS",
            )
        else:
            what, seconds, setting = (
                "answer",
                self._read_timeout,
                "MEMPROXY_UPSTREAM_READ_TIMEOUT_SECONDS",
            )
        return UpstreamTimeout(
            f"the upstream at {self.shown_url} did not {what} within {seconds:g} s; "
            f"check it, or raise {setting}"
        )

    @staticmethod
    def response_headers(response: httpx.Response) -> list[tuple[bytes, bytes]]:
        """The upstream's headers to relay, per the module's policy, :data:`RELAYED_HEADERS`
        (and :data:`STREAM_HEADERS` for an event stream) included, each once."""
        own: tuple[tuple[bytes, bytes], ...] = RELAYED_HEADERS
        if response.headers.get("content-type", "").startswith("text/event-stream"):
            own += STREAM_HEADERS
        drop = _DROP_RESPONSE.union(name for name, _ in own)
        kept = [(name, value) for name, value in response.headers.raw if name.lower() not in drop]
        return [*kept, *own]


async def _read_capped(response: httpx.Response, cap: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in response.aiter_bytes():
            chunks.append(chunk)
            size += len(chunk)
            if size >= cap:
                break
    except httpx.HTTPError:
        pass  # what arrived is enough to report
    finally:
        await response.aclose()
    return b"".join(chunks)[:cap]
