"""Open WebUI's signed user token: what makes it valid, and the user it names.

With ``MEMPROXY_OPENWEBUI_JWT_SECRET`` set, the user comes only from the HS256 token Open WebUI
signs with the same secret (``FORWARD_USER_INFO_HEADER_JWT_SECRET``) and sends in
``X-OpenWebUI-User-Jwt`` (:mod:`app.proxy.identity` says what else is refused then). Its claims
are ``sub`` (the user id), ``email``, ``name``, ``role``, ``iss`` = ``open-webui``, ``iat`` and
``exp``. A token is refused (401 ``invalid_user_token``, naming why) when:

- its signature does not match the secret, or it is signed with anything but HS256 (whatever
  algorithm the token names);
- its issuer is not ``open-webui``;
- it has no ``exp``, ``iss`` or ``sub``, or its ``exp`` is past (30 s leeway for clock skew),
  or its ``iat`` or ``nbf`` is ahead;
- it lives longer than ``MEMPROXY_OPENWEBUI_JWT_MAX_LIFETIME_SECONDS`` (``exp`` - ``iat``, or
  ``exp`` - now without ``iat``; a day by default, Open WebUI's live 300 s): a token valid for
  years is a key, if it leaks;
- its ``sub`` names no user (the caller turns it into a user id: :func:`token_subject`).
"""

from __future__ import annotations

import time

import jwt

from app.errors import AuthenticationFailed

USER_TOKEN_HEADER = "X-OpenWebUI-User-Jwt"
"""Open WebUI's default FORWARD_USER_INFO_HEADER_JWT."""
USER_TOKEN_ISSUER = "open-webui"
USER_TOKEN_LEEWAY_SECONDS = 30
"""Clock skew allowed between Open WebUI and memproxy on ``exp`` and ``iat``."""
USER_TOKEN_MAX_LIFETIME_SECONDS = 86400
"""``MEMPROXY_OPENWEBUI_JWT_MAX_LIFETIME_SECONDS``'s default (Open WebUI's tokens live 300 s)."""


def token_subject(
    token: str, secret: str, *, max_lifetime: float = USER_TOKEN_MAX_LIFETIME_SECONDS
) -> str | None:
    """The ``sub`` claim of a valid token, as written (None when it is not text): the caller
    makes a user id of it, or refuses it with :func:`bad_token`. 401 ``invalid_user_token``
    when the token is not valid (see the module docstring)."""
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
        raise bad_token("it has expired") from None
    except jwt.ImmatureSignatureError:
        raise bad_token("it is not valid yet (check both machines' clocks)") from None
    except jwt.InvalidSignatureError:
        raise bad_token("its signature does not match MEMPROXY_OPENWEBUI_JWT_SECRET") from None
    except jwt.InvalidIssuerError:
        raise bad_token(f"its issuer is not {USER_TOKEN_ISSUER!r}") from None
    except jwt.MissingRequiredClaimError as exc:
        raise bad_token(f"it has no {exc.claim!r} claim") from None
    except jwt.InvalidTokenError as exc:
        raise bad_token(f"it is malformed ({exc})") from None
    issued = claims.get("iat")
    lifetime = claims["exp"] - (issued if isinstance(issued, int | float) else time.time())
    if lifetime > max_lifetime + USER_TOKEN_LEEWAY_SECONDS:
        raise bad_token(
            f"it lives {lifetime:.0f} s, longer than MEMPROXY_OPENWEBUI_JWT_MAX_LIFETIME_SECONDS "
            f"({max_lifetime:g}) allows; Open WebUI mints them for its "
            "FORWARD_USER_INFO_HEADER_JWT_EXPIRES_SECONDS (300 by default)"
        )
    subject = claims.get("sub")
    return subject if isinstance(subject, str) else None


def bad_token(why: str) -> AuthenticationFailed:
    """The 401 for a token that is not valid, saying `why`."""
    return AuthenticationFailed(
        f"the {USER_TOKEN_HEADER} user token is not valid: {why}",
        param=USER_TOKEN_HEADER,
        code="invalid_user_token",
    )
