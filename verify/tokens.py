"""Challenge tokens: server-signed (HMAC-SHA256 with the site's signing key), expiring, one-time.

A token is ``v1.<base64url(canonical JSON payload)>.<base64url(HMAC-SHA256(key, "v1." + payload))>``
with payload ``{"cid": challenge id, "exp": expiry (unix seconds), "nonce": hex, "sub": user}``.
The signature proves the server issued it; the database row makes it one-time. The payload is
read, after the signature checks, with the project's bounded parser into :class:`TokenPayload`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from typing import Any

import attrs

from ale.core.canonical import canonical_json
from ale.core.parse import ParseError, parse_json, structure

#: The longest token read at all (an issued one is about 200 characters).
MAX_TOKEN = 2048


class TokenError(ValueError):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def issue(key: bytes, *, challenge_id: str, nonce: str, user_id: str, expires_at: float) -> str:
    payload = _b64(canonical_json({"cid": challenge_id, "exp": int(expires_at), "nonce": nonce, "sub": user_id}))
    sig = hmac.new(key, f"v1.{payload}".encode(), hashlib.sha256).digest()
    return f"v1.{payload}.{_b64(sig)}"


@attrs.frozen
class TokenPayload:
    cid: str  # the challenge's id
    exp: int  # expiry, unix seconds
    nonce: str  # hex
    sub: str  # the user it was issued to


def _signed_payload(key: bytes, token: Any) -> bytes:
    """The payload's bytes, once the token is well-formed and the signature is the server's."""
    if not isinstance(token, str) or len(token) > MAX_TOKEN or token.count(".") != 2:
        raise TokenError("token_invalid", "the challenge token is malformed")
    version, payload, sig = token.split(".")
    if version != "v1":
        raise TokenError("token_invalid", "unknown challenge token version")
    try:
        expected = hmac.new(key, f"v1.{payload}".encode(), hashlib.sha256).digest()
        if not hmac.compare_digest(expected, _unb64(sig)):
            raise TokenError("token_invalid", "the challenge token's signature is not the server's")
        return _unb64(payload)
    except (binascii.Error, ValueError, UnicodeError):
        raise TokenError("token_invalid", "the challenge token is malformed") from None


def decode(key: bytes, token: Any, *, now: float) -> TokenPayload:
    """The payload of a genuine, unexpired token; TokenError(token_invalid | token_expired) otherwise."""
    raw = _signed_payload(key, token)
    try:
        payload = structure(
            parse_json(raw, what="the token's payload", max_bytes=MAX_TOKEN), TokenPayload, what="the token's payload"
        )
    except ParseError:
        raise TokenError("token_invalid", "the challenge token's payload is malformed") from None
    if payload.exp < now:
        raise TokenError("token_expired", "the challenge token has expired")
    return payload


def verify(key: bytes, token: Any, *, now: float) -> dict[str, Any]:
    """:func:`decode`, as the dict ``{"cid", "exp", "nonce", "sub"}``."""
    return attrs.asdict(decode(key, token, now=now))
