"""Who is asking: the client's API key, and the user whose memories a request may touch.

User resolution, first match wins:

1. a key bound to a user (``key:user_id`` in ``MEMPROXY_API_KEYS``) always acts as that user; an
   identity header naming someone else is refused (403), so a bound key cannot borrow another
   user's memories. The body's ``user`` is not an identity claim then (SDKs send it as an opaque
   end-user tag) and is simply forwarded;
2. the first non-empty header of ``MEMPROXY_USER_ID_HEADERS`` (``X-OpenWebUI-User-Id``, then
   ``X-User-Id``);
3. the body's ``user``: a string, or an object with ``id`` (Open WebUI pipelines);
4. ``anonymous``, or 401 when ``MEMPROXY_REQUIRE_USER=true``.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping, Sequence

from app.config import ApiKey
from app.errors import AuthenticationFailed, InvalidRequest, PermissionDenied, UserRequired
from app.schemas.openai import EndUser

ANONYMOUS = "anonymous"
MAX_USER_ID_LENGTH = 256


class Authenticator:
    """Checks bearer keys against ``MEMPROXY_API_KEYS`` in constant time."""

    def __init__(self, keys: Sequence[ApiKey]):
        # Comparing fixed-length digests keeps the comparison time independent of the key's
        # length and content; every configured key is compared, so the match position leaks
        # nothing either.
        self._digests = [(hashlib.sha256(k.key.encode()).digest(), k) for k in keys]

    @property
    def enabled(self) -> bool:
        return bool(self._digests)

    def authenticate(self, authorization: str | None) -> ApiKey | None:
        """The matching key; None when no keys are configured; 401 otherwise."""
        if not self._digests:
            return None
        token = bearer_token(authorization)
        if not token:
            raise AuthenticationFailed("missing API key: send it as 'Authorization: Bearer <key>'")
        match = self.match(token)
        if match is None:
            raise AuthenticationFailed("invalid API key")
        return match

    def match(self, token: str) -> ApiKey | None:
        """The configured key equal to `token`, or None."""
        digest = hashlib.sha256(token.encode()).digest()
        match: ApiKey | None = None
        for candidate, key in self._digests:
            if hmac.compare_digest(candidate, digest):
                match = key
        return match


def bearer_token(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


def resolve_user(
    headers: Mapping[str, str],
    header_names: Sequence[str],
    body_user: str | EndUser | None,
    key: ApiKey | None,
    *,
    require_user: bool,
) -> str:
    """Apply the precedence in the module docstring."""
    header_user = None
    for name in header_names:
        header_user = clean_user_id(headers.get(name), name)
        if header_user:
            break
    if key is not None and key.user_id is not None:
        if header_user and header_user != key.user_id:
            raise PermissionDenied(
                "this API key is bound to another user and cannot act for the user named in the "
                "request headers",
                code="user_mismatch",
            )
        return key.user_id
    if header_user:
        return header_user
    raw_body_user = body_user.id if isinstance(body_user, EndUser) else body_user
    body_id = clean_user_id(raw_body_user, "user")
    if body_id:
        return body_id
    if require_user:
        raise UserRequired(
            "no user given: send an X-User-Id header, a 'user' field, or use a key bound to a user "
            "(MEMPROXY_REQUIRE_USER is on)"
        )
    return ANONYMOUS


def clean_user_id(value: str | None, where: str) -> str | None:
    if value is None:
        return None
    value = value.strip()
    if len(value) > MAX_USER_ID_LENGTH or any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise InvalidRequest(
            f"user id in {where} must be at most {MAX_USER_ID_LENGTH} printable characters",
            param=where,
            code="invalid_user",
        )
    return value or None
