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

A key bound to no user names users as above, unless ``MEMPROXY_UNBOUND_KEYS_NAME_USERS=false``:
then it is ``anonymous`` (401 with ``MEMPROXY_REQUIRE_USER``), an identity header sent with it is
refused (403 ``unbound_key``) and the body's ``user`` is only forwarded, as with a bound key.

Identity headers are read as UTF-8 (``X-User-Id: José`` names the same user as the body's
``"user": "José"``); bytes that are not UTF-8 are refused (400 naming the header). Every user id,
wherever it comes from, is put in NFC, and one with invisible characters or letters of scripts
that pass for each other is refused (400 ``invalid_user``): :mod:`app.proxy.user_ids`.

With ``MEMPROXY_OPENWEBUI_JWT_SECRET`` set, anyone who can reach memproxy can no longer name a
user: the user comes only from the HS256 token Open WebUI signs with the same secret
(``FORWARD_USER_INFO_HEADER_JWT_SECRET``) and sends in ``X-OpenWebUI-User-Jwt``. Then:

- a plain identity header (any of ``MEMPROXY_USER_ID_HEADERS``) is refused (401
  ``unsigned_user_header``): Open WebUI sends those instead of the token when it could not sign
  one, and anyone else could send them for any user;
- a token that is not valid (a bad signature, another issuer, expired, living beyond
  ``MEMPROXY_OPENWEBUI_JWT_MAX_LIFETIME_SECONDS``, no ``sub``...: :mod:`app.proxy.user_token`)
  is refused (401 ``invalid_user_token``);
- a bound key still acts as its user; a valid token naming someone else is refused (403), as a
  header would be;
- the body's ``user`` is never an identity claim (the client writes it); with no token and no
  bound key the request is ``anonymous``, or 401 with ``MEMPROXY_REQUIRE_USER=true``.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping, Sequence

from app.config import ApiKey, Settings
from app.errors import AuthenticationFailed, InvalidRequest, PermissionDenied, UserRequired
from app.proxy.user_ids import (
    MAX_USER_ID_LENGTH,
    UserIdRefused,
    normal_user_id,
    stored_user_id,
)
from app.proxy.user_token import (
    USER_TOKEN_HEADER,
    USER_TOKEN_MAX_LIFETIME_SECONDS,
    bad_token,
    token_subject,
)
from app.schemas.openai import EndUser

ANONYMOUS = "anonymous"


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


def token_secret(settings: Settings) -> str | None:
    """``MEMPROXY_OPENWEBUI_JWT_SECRET``, None when unset or empty (as Open WebUI reads its own)."""
    secret = settings.openwebui_jwt_secret
    value = secret.get_secret_value().strip() if secret is not None else ""
    return value or None


def resolve_user(
    headers: Mapping[str, str],
    header_names: Sequence[str],
    body_user: str | EndUser | None,
    key: ApiKey | None,
    *,
    require_user: bool,
    jwt_secret: str | None = None,
    jwt_max_lifetime: float = USER_TOKEN_MAX_LIFETIME_SECONDS,
    unbound_names_users: bool = True,
) -> str:
    """Apply the precedence in the module docstring. `headers` are Starlette's (latin-1 text of
    the bytes received)."""
    if jwt_secret is not None:
        return _signed_user(
            headers, header_names, key, jwt_secret,
            require_user=require_user, max_lifetime=jwt_max_lifetime,
        )  # fmt: skip
    header_user = named_by = None
    for name in header_names:
        header_user = clean_user_id(header_text(headers, name), name)
        if header_user:
            named_by = name
            break
    if key is not None and key.user_id is not None:
        _check_bound(key.user_id, header_user, "request headers")
        return key.user_id
    if key is not None and not unbound_names_users:
        if named_by is not None:
            raise PermissionDenied(
                f"this API key is bound to no user and may not name one in the {named_by} "
                "header (MEMPROXY_UNBOUND_KEYS_NAME_USERS is off): use a key bound to the user "
                "(key:user in MEMPROXY_API_KEYS)",
                param=named_by,
                code="unbound_key",
            )
        return _nobody(
            require_user,
            "no user given: this API key is bound to no user and may not name one "
            "(MEMPROXY_UNBOUND_KEYS_NAME_USERS is off, MEMPROXY_REQUIRE_USER is on)",
        )
    if header_user:
        return header_user
    raw_body_user = body_user.id if isinstance(body_user, EndUser) else body_user
    body_id = clean_user_id(raw_body_user, "user")
    if body_id:
        return body_id
    return _nobody(
        require_user,
        "no user given: send an X-User-Id header, a 'user' field, or use a key bound to a user "
        "(MEMPROXY_REQUIRE_USER is on)",
    )


def header_text(headers: Mapping[str, str], name: str) -> str | None:
    """Header `name` as the client wrote it. HTTP carries bytes, which Starlette hands over
    decoded as latin-1 (``José`` in UTF-8 would read ``JosÃ©``); identity headers are read as
    UTF-8, what curl, browsers' fetch and Open WebUI send. 400 naming the header when the bytes
    are not UTF-8."""
    value = headers.get(name)
    if value is None:
        return None
    text = as_written(value)
    if text is None:
        raise InvalidRequest(
            f"the {name} header is not valid UTF-8", param=name, code="invalid_user"
        )
    return text


def as_written(value: str) -> str | None:
    """A header's value (Starlette's latin-1 text of its bytes) read as UTF-8; None when the
    bytes are not UTF-8 (or the text never came from the wire)."""
    if value.isascii():
        return value
    try:
        return value.encode("latin-1").decode("utf-8")
    except UnicodeError:
        return None


def _signed_user(
    headers: Mapping[str, str],
    header_names: Sequence[str],
    key: ApiKey | None,
    secret: str,
    *,
    require_user: bool,
    max_lifetime: float,
) -> str:
    for name in header_names:
        if (headers.get(name) or "").strip():
            raise AuthenticationFailed(
                f"the {name} header is not accepted: memproxy takes the user only from Open "
                f"WebUI's signed {USER_TOKEN_HEADER} (MEMPROXY_OPENWEBUI_JWT_SECRET is set); set "
                "FORWARD_USER_INFO_HEADER_JWT_SECRET on Open WebUI to the same value",
                param=name,
                code="unsigned_user_header",
            )
    token = (headers.get(USER_TOKEN_HEADER) or "").strip()
    token_user = verify_user_token(token, secret, max_lifetime=max_lifetime) if token else None
    if key is not None and key.user_id is not None:
        _check_bound(key.user_id, token_user, USER_TOKEN_HEADER)
        return key.user_id
    if token_user:
        return token_user
    return _nobody(
        require_user,
        f"no user given: send Open WebUI's signed {USER_TOKEN_HEADER}, or use a key bound to a "
        "user (MEMPROXY_REQUIRE_USER is on)",
    )


def verify_user_token(
    token: str, secret: str, *, max_lifetime: float = USER_TOKEN_MAX_LIFETIME_SECONDS
) -> str:
    """The user id of a valid Open WebUI user token (:mod:`app.proxy.user_token`); 401
    ``invalid_user_token`` else."""
    subject = token_subject(token, secret, max_lifetime=max_lifetime)
    user = clean_user_id(subject, USER_TOKEN_HEADER)
    if not user:
        raise bad_token("its 'sub' claim names no user")
    return user


def _check_bound(bound: str, named: str | None, where: str) -> None:
    if named and named != bound:
        raise PermissionDenied(
            f"this API key is bound to another user and cannot act for the user named in the "
            f"{where}",
            code="user_mismatch",
        )


def _nobody(require_user: bool, message: str) -> str:
    if require_user:
        raise UserRequired(message)
    return ANONYMOUS


def clean_user_id(value: str | None, where: str, *, as_stored: bool = False) -> str | None:
    """The user id `value` names, in the one form two ids that look alike share
    (:func:`app.proxy.user_ids.normal_user_id`; `as_stored`: exactly as given, to reach a user
    stored before ids were normalised, :func:`~app.proxy.user_ids.stored_user_id`); None when
    it is empty; 400 ``invalid_user`` naming `where` and why when it cannot be one."""
    if value is None:
        return None
    try:
        return (stored_user_id if as_stored else normal_user_id)(value) or None
    except UserIdRefused as exc:
        raise InvalidRequest(
            f"the user id in {where} {exc}: user ids are at most {MAX_USER_ID_LENGTH} "
            "printable characters, with no invisible ones, in one script",
            param=where,
            code="invalid_user",
        ) from None
