"""What the user is called, when the client says: a name only shapes how memories are searched.

Clients that know the person send their name: Open WebUI with
``ENABLE_FORWARD_USER_INFO_HEADERS`` sends ``X-OpenWebUI-User-Name`` (percent-encoded since its
0.6 line: ``quote(user.name, safe=" ")``), and its signed token (``X-OpenWebUI-User-Jwt``) has a
``name`` claim; anything else may send ``X-User-Name``. Recall reads a question that names the
user ("What did Caroline say about her art?") as the user asking about themselves
(:mod:`app.memory.chat.voice`).

A name is never an identity claim and never a reason to refuse a chat: text that cannot be a
name (not UTF-8, control or invisible characters, longer than :data:`MAX_NAME_CHARS`) is no
name. With ``MEMPROXY_OPENWEBUI_JWT_SECRET`` set, the name comes only from the token, as the
user does: :func:`user_name` is called once :func:`app.proxy.identity.resolve_user` has checked
that token's signature.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping, Sequence
from contextlib import suppress
from urllib.parse import unquote

import jwt

from app.proxy.identity import as_written
from app.proxy.user_token import USER_TOKEN_HEADER

MAX_NAME_CHARS = 100
"""A longer header is not a person's name."""


def user_name(
    headers: Mapping[str, str], header_names: Sequence[str], *, signed: bool
) -> str | None:
    """The user's name: the signed token's ``name`` claim when `signed` (the token checked
    already), else the first of `header_names` that holds one; None when none does."""
    if signed:
        token = (headers.get(USER_TOKEN_HEADER) or "").strip()
        if not token:
            return None
        try:  # verified by resolve_user in this same request: only the claim is read here
            claims = jwt.decode(token, options={"verify_signature": False})
        except jwt.InvalidTokenError:
            return None
        name = claims.get("name")
        return clean_name(name) if isinstance(name, str) else None
    for header in header_names:
        raw = headers.get(header)
        if raw is not None and (name := clean_name(as_written(raw))):
            return name
    return None


def clean_name(value: str | None) -> str | None:
    """`value` as a name (percent-decoded, NFC, spaces collapsed), or None when it is not one."""
    if not value:
        return None
    if "%" in value:
        with suppress(UnicodeDecodeError):  # else not percent-encoding ("100% Ann"): as written
            value = unquote(value, errors="strict")
    value = " ".join(unicodedata.normalize("NFC", value).split())
    if not value or len(value) > MAX_NAME_CHARS:
        return None
    if any(unicodedata.category(c)[0] == "C" for c in value):
        return None
    return value
