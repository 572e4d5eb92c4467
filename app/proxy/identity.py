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
``"user": "José"``); bytes that are not UTF-8 are refused (400 naming the header).

With ``MEMPROXY_OPENWEBUI_JWT_SECRET`` set, anyone who can reach memproxy can no longer name a
user: the user comes only from the HS256 token Open WebUI signs with the same secret
(``FORWARD_USER_INFO_HEADER_JWT_SECRET``) and sends in ``X-OpenWebUI-User-Jwt``, with claims
``sub`` (the user id), ``email``, ``name``, ``role``, ``iss`` = ``open-webui``, ``iat`` and
``exp``. Then:

- a plain identity header (any of ``MEMPROXY_USER_ID_HEADERS``) is refused (401
  ``unsigned_user_header``): Open WebUI sends those instead of the token when it could not sign
  one, and anyone else could send them for any user;
- a token with a bad signature, another issuer, no or a past ``exp`` (30 s leeway for clock
  skew), or no ``sub`` is refused (401 ``invalid_user_token``);
- a bound key still acts as its user; a valid token naming someone else is refused (403), as a
  header would be;
- the body's ``user`` is never an identity claim (the client writes it); with no token and no
  bound key the request is ``anonymous``, or 401 with ``MEMPROXY_REQUIRE_USER=true``.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping, Sequence

import jwt

from app.config import ApiKey, Settings
from app.errors import AuthenticationFailed, InvalidRequest, PermissionDenied, UserRequired
from app.schemas.openai import EndUser

ANONYMOUS = "anonymous"
MAX_USER_ID_LENGTH = 256
USER_TOKEN_HEADER = "X-OpenWebUI-User-Jwt"
"""Open WebUI's default FORWARD_USER_INFO_HEADER_JWT."""
USER_TOKEN_ISSUER = "open-webui"
USER_TOKEN_LEEWAY_SECONDS = 30
"""Clock skew allowed between Open WebUI and memproxy on ``exp`` and ``iat``."""


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
    unbound_names_users: bool = True,
) -> str:
    """Apply the precedence in the module docstring. `headers` are Starlette's (latin-1 text of
    the bytes received)."""
    if jwt_secret is not None:
        return _signed_user(headers, header_names, key, jwt_secret, require_user=require_user)
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
    if value is None or value.isascii():
        return value
    try:
        return value.encode("latin-1").decode("utf-8")
    except UnicodeError:  # not UTF-8 (or text that never came from the wire)
        raise InvalidRequest(
            f"the {name} header is not valid UTF-8", param=name, code="invalid_user"
        ) from None


def _signed_user(
    headers: Mapping[str, str],
    header_names: Sequence[str],
    key: ApiKey | None,
    secret: str,
    *,
    require_user: bool,
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
    token_user = verify_user_token(token, secret) if token else None
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


def verify_user_token(token: str, secret: str) -> str:
    """The user id (``sub``) of a valid Open WebUI user token; 401 ``invalid_user_token`` else."""
    try:
        claims = jwt.decode(
            token,
            secret,
            algorithms=["HS256"],  # what Open WebUI signs with; never what the token says
            issuer=USER_TOKEN_ISSUER,
            leeway=USER_TOKEN_LEEWAY_SECONDS,
            options={"require": ["exp", "iss", "sub"]},
        )
    except jwt.ExpiredSignatureError:
        raise _bad_token("it has expired") from None
    except jwt.ImmatureSignatureError:
        raise _bad_token("it is not valid yet (check both machines' clocks)") from None
    except jwt.InvalidSignatureError:
        raise _bad_token("its signature does not match MEMPROXY_OPENWEBUI_JWT_SECRET") from None
    except jwt.InvalidIssuerError:
        raise _bad_token(f"its issuer is not {USER_TOKEN_ISSUER!r}") from None
    except jwt.MissingRequiredClaimError as exc:
        raise _bad_token(f"it has no {exc.claim!r} claim") from None
    except jwt.InvalidTokenError as exc:
        raise _bad_token(f"it is malformed ({exc})") from None
    subject = claims.get("sub")
    user = clean_user_id(subject, USER_TOKEN_HEADER) if isinstance(subject, str) else None
    if not user:
        raise _bad_token("its 'sub' claim names no user")
    return user


def _bad_token(why: str) -> AuthenticationFailed:
    return AuthenticationFailed(
        f"the {USER_TOKEN_HEADER} user token is not valid: {why}",
        param=USER_TOKEN_HEADER,
        code="invalid_user_token",
    )


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
