"""TLS to the upstream and the Manager's server: which certificates are trusted.

Both clients keep their own default trust store (certifi for the upstream's transport, the
system's for the Manager's httpx2 client; ``SSL_CERT_FILE`` still replaces either), and trust
``MEMPROXY_UPSTREAM_CA_FILE`` beside it: a private CA is added, public servers stay reachable
(the Manager may run elsewhere). ``MEMPROXY_UPSTREAM_VERIFY=false`` checks nothing (warned at
start, :mod:`app.startup`).
"""

from __future__ import annotations

import ssl
from collections.abc import Callable

from app.config import Settings
from app.errors import causes


def ssl_context(settings: Settings, default: Callable[[], ssl.SSLContext]) -> ssl.SSLContext:
    """The context a client to the upstream or the Manager connects with; `default` makes the
    client's own default one (the file is known readable: :class:`Settings` checked it)."""
    if not settings.upstream_verify:
        unchecked = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        unchecked.check_hostname = False
        unchecked.verify_mode = ssl.CERT_NONE
        return unchecked
    context = default()
    if settings.upstream_ca_file:
        context.load_verify_locations(cafile=settings.upstream_ca_file)
    return context


def verification_failed(exc: BaseException) -> ssl.SSLCertVerificationError | None:
    """The certificate check that failed somewhere in `exc`'s chain of causes, if one did."""
    return next((e for e in causes(exc) if isinstance(e, ssl.SSLCertVerificationError)), None)


def verification_hint(error: ssl.SSLCertVerificationError) -> str:
    """What failed, and what to set: for a 502's message and the Manager's failure."""
    reason = error.verify_message or error.reason or "certificate rejected"
    return (
        f"TLS certificate verification failed ({reason}); if a private CA signed the "
        "server's certificate, set MEMPROXY_UPSTREAM_CA_FILE to that CA's PEM file"
    )
