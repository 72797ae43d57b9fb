"""The API token check every service shares (HTTP middleware, gRPC interceptor, dashboard).

A presented token is whatever a client sent: a header that is not UTF-8, a non-ASCII character,
an empty string. ``hmac.compare_digest`` raises TypeError on a ``str`` with non-ASCII
characters, so both sides are compared as bytes; anything that cannot be encoded simply does
not match (401 / UNAUTHENTICATED, never a 500).
"""

from __future__ import annotations

import hmac


def _as_bytes(value: str | bytes) -> bytes | None:
    if isinstance(value, bytes):
        return value
    try:
        return value.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return None


def token_matches(given: str | bytes | None, token: str) -> bool:
    """True only when ``given`` is exactly the configured token (constant-time compare)."""
    if given is None:
        return False
    presented, expected = _as_bytes(given), _as_bytes(token)
    if presented is None or expected is None:
        return False
    return hmac.compare_digest(presented, expected)


def bearer(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` value, None for any other scheme."""
    if authorization and authorization[:7].lower() == "bearer ":
        return authorization[7:].strip()
    return None
