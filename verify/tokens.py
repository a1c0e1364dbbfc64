"""Challenge tokens: server-signed (HMAC-SHA256 with the site's signing key), expiring, one-time.

A token is ``v1.<base64url(canonical JSON payload)>.<base64url(HMAC-SHA256(key, "v1." + payload))>``
with payload ``{"cid": challenge id, "exp": expiry (unix seconds), "nonce": hex, "sub": user}``.
The signature proves the server issued it; the database row makes it one-time.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from typing import Any

from ale.core.canonical import canonical_json


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


def verify(key: bytes, token: Any, *, now: float) -> dict[str, Any]:
    """The payload of a genuine, unexpired token; TokenError(token_invalid | token_expired) otherwise."""
    if not isinstance(token, str) or len(token) > 2048 or token.count(".") != 2:
        raise TokenError("token_invalid", "the challenge token is malformed")
    version, payload, sig = token.split(".")
    if version != "v1":
        raise TokenError("token_invalid", "unknown challenge token version")
    try:
        expected = hmac.new(key, f"v1.{payload}".encode(), hashlib.sha256).digest()
        if not hmac.compare_digest(expected, _unb64(sig)):
            raise TokenError("token_invalid", "the challenge token's signature is not the server's")
        data = json.loads(_unb64(payload))
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise TokenError("token_invalid", "the challenge token is malformed") from None
    if not isinstance(data, dict) or set(data) != {"cid", "exp", "nonce", "sub"}:
        raise TokenError("token_invalid", "the challenge token's payload is malformed")
    if not isinstance(data["exp"], int) or data["exp"] < now:
        raise TokenError("token_expired", "the challenge token has expired")
    return data
