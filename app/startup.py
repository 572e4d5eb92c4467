"""What memproxy says when it starts: where it listens, what it forwards to, where it keeps its
memories, which model embeds them, and what an operator should fix (an open server, an upstream
that does not answer). Nothing here can fail the start: a problem is a warning, and the server
serves anyway (an upstream that comes up later is used as soon as it answers).
"""

from __future__ import annotations

import logging

import httpx
import orjson

from app import __version__
from app.config import Settings
from app.errors import MemproxyError, UpstreamStatusError
from app.log import mask_url, new_request_id
from app.proxy.identity import token_secret
from app.proxy.upstream import Upstream

logger = logging.getLogger("memproxy")

CHECK_TIMEOUT_SECONDS = 5.0
MIN_SECRET_BYTES = 32
"""Shorter ``MEMPROXY_OPENWEBUI_JWT_SECRET``s are warned about (RFC 7518: an HS256 key has at
least 256 bits)."""


def summary(settings: Settings, *, embedding_model: str, keys: int) -> list[str]:
    """The start-up lines (no secrets: passwords and query values in URLs and every key are
    left out)."""
    listen = f"http://{settings.host}:{settings.port}"
    if settings.upstream_api_key is not None:
        upstream_key = "MEMPROXY_UPSTREAM_API_KEY"
    else:
        upstream_key = "the client's own" if keys == 0 else "none"
    if settings.manager_enabled:
        model = settings.manager_model or "the chat's own model"
        where = mask_url(settings.manager_base_url) or "the upstream"
        manager = f"on ({model} at {where}, {settings.manager_provider} style)"
    else:
        manager = "off (memories come from the API only)"
    return [
        f"memproxy {__version__} listening on {listen} (OpenAI base URL: {listen}/v1)",
        f"upstream: {mask_url(settings.upstream_base_url)} (key sent: {upstream_key})",
        f"database: {mask_url(settings.database_url)}",
        f"embedding model: {settings.embedding_model or 'all-MiniLM-L6-v2 (bundled)'} "
        f"(vectors {embedding_model}; int8 embeds: {settings.embedding_quantize}, "
        f"exports in {settings.embedding_cache_dir})",
        f"manager: {manager}",
        f"client keys: {keys}" + ("" if keys else " (open server)"),
    ]


def report(settings: Settings, *, embedding_model: str, keys: int) -> None:
    """Log :func:`summary`, then warn about an open server, about keys that may name any user,
    about a short Open WebUI secret and about upstream certificates left unchecked."""
    for line in summary(settings, embedding_model=embedding_model, keys=keys):
        logger.info("%s", line)
    if keys == 0:
        # With the secret set, only Open WebUI's signed token can name a user.
        who = "" if token_secret(settings) else " and name any user"
        logger.warning(
            "MEMPROXY_API_KEYS is empty: anyone who can reach this server can use it%s; set "
            "keys before exposing it beyond this machine",
            who,
        )
    secret = token_secret(settings)
    if secret is not None and len(secret.encode()) < MIN_SECRET_BYTES:
        # HS256: one token captured is enough to guess a short secret offline, and then to sign
        # tokens for any user.
        logger.warning(
            "MEMPROXY_OPENWEBUI_JWT_SECRET is %d bytes: a secret under %d bytes can be guessed "
            "from one token, and then anyone can sign tokens for any user; use 32 or more random "
            "bytes (openssl rand -hex 32), the same as Open WebUI's "
            "FORWARD_USER_INFO_HEADER_JWT_SECRET",
            len(secret.encode()),
            MIN_SECRET_BYTES,
        )
    if not settings.upstream_verify:
        logger.warning(
            "MEMPROXY_UPSTREAM_VERIFY=false: the TLS certificates of the upstream and the Manager "
            "are not checked; anyone on the network path can read and change the chats and the "
            "keys sent to them (trust a private CA with MEMPROXY_UPSTREAM_CA_FILE instead)"
        )
    unbound = sum(1 for key in settings.parsed_api_keys if key.user_id is None)
    if unbound and settings.unbound_keys_name_users and not token_secret(settings):
        # Whoever holds such a key can read and delete every user's memories: said at WARNING.
        logger.warning(
            "%d of the %d MEMPROXY_API_KEYS %s bound to no user: whoever holds one can name any "
            "user (%s, or the body's 'user') and read, export and delete that user's memories. "
            "Bind each key to its user (key:user), set MEMPROXY_OPENWEBUI_JWT_SECRET so that "
            "only Open WebUI's signed token names users, or set "
            "MEMPROXY_UNBOUND_KEYS_NAME_USERS=false",
            unbound,
            len(settings.parsed_api_keys),
            "is" if unbound == 1 else "are",
            ", ".join(settings.user_id_headers) or "no user header",
        )


async def check_upstream(upstream: Upstream) -> bool:
    """Ask the upstream for its model list once; log what it said. True when it answered 2xx.

    Sent with memproxy's own upstream key, if any; a 401/403 without one is expected when the
    clients' keys are passed through, so it is reported as such, not as a failure.
    """
    # An id like the ones chats carry: "startup-check" was refused by llama-cpp-python's server.
    headers = upstream.headers([], new_request_id())
    request = upstream.build("GET", "/models", headers=headers, content=b"")
    request.extensions["timeout"] = httpx.Timeout(CHECK_TIMEOUT_SECONDS).as_dict()
    try:
        response = await upstream.open(request)
        body = await response.aread()
        await response.aclose()
    except UpstreamStatusError as exc:
        if exc.upstream_status in (401, 403):
            logger.warning(
                "upstream %s refused the model list (%d): set MEMPROXY_UPSTREAM_API_KEY, or "
                "have clients send a key it accepts",
                upstream.shown_url,
                exc.upstream_status,
            )
        else:
            logger.warning(
                "upstream %s answered %d to GET /models; chats may fail until it is fixed",
                upstream.shown_url,
                exc.upstream_status,
            )
        return False
    except (MemproxyError, httpx.HTTPError) as exc:
        logger.warning(
            "upstream not reachable at start: %s; memproxy serves anyway, and chats answer 502 "
            "until it is up",
            exc,
        )
        return False
    logger.info("upstream %s answered: %s", upstream.shown_url, _models(body))
    return True


def _models(body: bytes) -> str:
    try:
        data = orjson.loads(body).get("data") or []
        names = [str(m.get("id")) for m in data if isinstance(m, dict)]
    except Exception:
        return "a model list memproxy could not read"
    if not names:
        return "no models (pull one, e.g. `ollama pull llama3.2`)"
    shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    return f"{len(names)} model(s): {shown}"
