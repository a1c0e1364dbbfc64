"""Registered-runner signatures: Ed25519 over a bundle's integrity root.

The signed message is ``b"ale-bundle-integrity/v1\\n" + merkle_root`` (the root as 64 lowercase
hex ASCII). ``integrity.json`` carries ``{"algorithm": "ed25519", "key_id": hex(SHA-256(raw
public key)), "public_key": base64(raw 32 bytes), "value": base64(64-byte signature)}``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

DOMAIN = b"ale-bundle-integrity/v1\n"


class SignatureError(ValueError):
    """A signature block that is malformed or does not verify."""


def key_id(public_raw: bytes) -> str:
    return hashlib.sha256(public_raw).hexdigest()


def public_raw(key: Ed25519PrivateKey | Ed25519PublicKey) -> bytes:
    pub = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    return pub.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def sign_root(private_key: Ed25519PrivateKey, merkle_root: str) -> dict[str, Any]:
    raw = public_raw(private_key)
    return {
        "algorithm": "ed25519",
        "key_id": key_id(raw),
        "public_key": base64.b64encode(raw).decode(),
        "value": base64.b64encode(private_key.sign(DOMAIN + merkle_root.encode())).decode(),
    }


def verify_root(signature: Any, merkle_root: str) -> str:
    """Check a signature block against the root; return its key id (registration is the caller's job)."""
    if not isinstance(signature, dict) or set(signature) != {"algorithm", "key_id", "public_key", "value"}:
        raise SignatureError("the signature block must have exactly algorithm, key_id, public_key and value")
    if signature["algorithm"] != "ed25519":
        raise SignatureError(f"unsupported signature algorithm {signature['algorithm']!r}")
    try:
        raw = base64.b64decode(signature["public_key"], validate=True)
        value = base64.b64decode(signature["value"], validate=True)
        pub = Ed25519PublicKey.from_public_bytes(raw)
    except (binascii.Error, ValueError, TypeError):
        raise SignatureError("the public key or signature is not valid base64 Ed25519 material") from None
    if key_id(raw) != signature["key_id"]:
        raise SignatureError("key_id is not the SHA-256 of the public key")
    try:
        pub.verify(value, DOMAIN + merkle_root.encode())
    except InvalidSignature:
        raise SignatureError("the signature does not verify against the integrity root") from None
    return str(signature["key_id"])


def load_private_key(pem: bytes) -> Ed25519PrivateKey:
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError):
        raise SignatureError("not an unencrypted PEM private key") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise SignatureError("the runner key must be an Ed25519 key")
    return key


def new_private_key_pem() -> tuple[bytes, str, str]:
    """A new Ed25519 runner key: (PEM private key, base64 public key, key id)."""
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    raw = public_raw(key)
    return pem, base64.b64encode(raw).decode(), key_id(raw)
