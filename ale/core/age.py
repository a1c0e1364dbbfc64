"""age v1 decryption for X25519 identities (age-encryption.org/v1), on the ``cryptography`` package.

The verifier decrypts every upload, and the bundle's payload is most of its bytes: this decrypts
it with OpenSSL's ChaCha20-Poly1305 a 64 KiB chunk at a time (several GB/s), and can hand the
chunks on as they are authenticated (:func:`payload_chunks`), so that decompression may start
before the last one. Packing still goes through pyrage (:mod:`ale.core.bundle`); the tests hold
this decryptor to pyrage's verdict on valid, cut, altered and hostile files.

What is checked, in order (each failure is an :class:`AgeError`):

* the header, by :func:`ale.core.bundle.parse_age_header` (its grammar, canonical base64, at most
  64 KiB), before this module is called; an ``scrypt`` stanza anywhere is refused (the spec
  allows it only alone, and then no X25519 identity opens it);
* each ``X25519`` stanza in turn: its share 32 bytes of canonical unpadded base64, its body 32
  bytes; the shared secret X25519(identity, share) not all zero; the file key unwrapped with
  ChaCha20-Poly1305 under HKDF-SHA-256(secret, share || recipient, "age-encryption.org/v1/X25519").
  A stanza that does not unwrap is skipped; none unwrapping is "no identity matched";
* the header's MAC: HMAC-SHA-256 under HKDF-SHA-256(file key, "", "header") of the header up to
  and including its ``---``;
* the payload: a 16-byte nonce, then STREAM chunks of 64 KiB (+ a 16-byte tag), the last one
  marked, and not empty unless it is the only one; the payload key HKDF-SHA-256(file key, nonce,
  "payload"). A byte after the last chunk fails its tag, as a cut file does.
"""

from __future__ import annotations

import base64
import binascii
import hmac
from collections.abc import Iterator, Sequence

import attrs
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

CHUNK = 64 * 1024
TAG = 16
ENCRYPTED_CHUNK = CHUNK + TAG
NONCE = 16
_X25519_INFO = b"age-encryption.org/v1/X25519"
_ZERO_NONCE = bytes(12)
_BECH32 = "qpzry9x8gf2tvdw0s3jn54khce6mua7l"
_SECRET_HRP = "age-secret-key-"
_MAX_BECH32 = 128  # an age X25519 identity is 74 characters, a recipient 62


class AgeError(ValueError):
    """The file cannot be decrypted with this identity (what is wrong, in words)."""


# -- the identity (bech32, BIP 173) --------------------------------------------------------------


def _polymod(values: list[int]) -> int:
    generators = (0x3B6A57B2, 0x26508E6D, 0x1EA119FA, 0x3D4233DD, 0x2A1462B3)
    check = 1
    for value in values:
        top = check >> 25
        check = (check & 0x1FFFFFF) << 5 ^ value
        for i, generator in enumerate(generators):
            if (top >> i) & 1:
                check ^= generator
    return check


def _bech32_decode(text: str, hrp: str) -> bytes:
    """The bytes of a bech32 string with human-readable part ``hrp`` (one case only, checksum right)."""
    if len(text) > _MAX_BECH32:
        raise ValueError("longer than any age key")
    if text.lower() != text and text.upper() != text:
        raise ValueError("mixed case")
    text = text.lower()
    cut = text.rfind("1")
    if text[:cut] != hrp or len(text) - cut - 1 < 6:
        raise ValueError(f"not a {hrp!r} bech32 string")
    try:
        data = [_BECH32.index(c) for c in text[cut + 1 :]]
    except ValueError:
        raise ValueError("a character outside bech32's alphabet") from None
    expanded = [ord(c) >> 5 for c in hrp] + [0] + [ord(c) & 31 for c in hrp]
    if _polymod(expanded + data) != 1:
        raise ValueError("bad bech32 checksum")
    acc, bits, out = 0, 0, bytearray()
    for value in data[:-6]:  # 5-bit groups to bytes; at most 4 zero bits of padding
        acc, bits = (acc << 5) | value, bits + 5
        if bits >= 8:
            bits -= 8
            out.append((acc >> bits) & 0xFF)
    if bits >= 5 or acc & ((1 << bits) - 1):
        raise ValueError("bad bech32 padding")
    return bytes(out)


@attrs.frozen
class Identity:
    """An age X25519 identity: its secret scalar and its recipient (public key), raw."""

    key: X25519PrivateKey
    recipient: bytes

    @classmethod
    def from_str(cls, text: str) -> Identity:
        """From ``AGE-SECRET-KEY-1...`` (ValueError if it is not one)."""
        raw = _bech32_decode(text.strip(), _SECRET_HRP)
        if len(raw) != 32:
            raise ValueError("an age X25519 identity is 32 bytes")
        key = X25519PrivateKey.from_private_bytes(raw)
        return cls(key, key.public_key().public_bytes_raw())


# -- the header --------------------------------------------------------------------------------


def _hkdf(ikm: bytes, salt: bytes, info: bytes) -> bytes:
    """HKDF-SHA-256 (RFC 5869) to 32 bytes: one expansion block."""
    prk = hmac.digest(salt or bytes(32), ikm, "sha256")
    return hmac.digest(prk, info + b"\x01", "sha256")


def _share(text: str) -> bytes | None:
    try:
        raw = base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError):
        return None
    if len(raw) != 32 or base64.b64encode(raw).rstrip(b"=").decode("ascii") != text:
        return None
    return raw


def _unwrap(identity: Identity, args: tuple[str, ...], body: bytes) -> bytes | None:
    """The file key of an X25519 stanza if it is for ``identity``, else None (AgeError if malformed)."""
    share = _share(args[1]) if len(args) == 2 else None
    if share is None or len(body) != 32:
        raise AgeError("malformed X25519 stanza")
    try:  # (OpenSSL refuses an all-zero shared secret, as age requires)
        secret = identity.key.exchange(X25519PublicKey.from_public_bytes(share))
    except ValueError:
        raise AgeError("an X25519 stanza's share is a low-order point") from None
    if not any(secret):
        raise AgeError("an X25519 stanza's share is a low-order point")
    wrap_key = _hkdf(secret, share + identity.recipient, _X25519_INFO)
    try:
        return ChaCha20Poly1305(wrap_key).decrypt(_ZERO_NONCE, body, None)
    except InvalidTag:
        return None


def file_key(
    stanzas: Sequence[tuple[tuple[str, ...], bytes]], mac: bytes, mac_input: bytes | memoryview, identity: Identity
) -> bytes:
    """The file key that ``identity`` unwraps from the header's stanzas (their arguments and
    bodies), the header's ``mac`` checked over ``mac_input``: the header up to and including ``---``."""
    if any(args[0] == "scrypt" for args, _ in stanzas):
        raise AgeError("an scrypt stanza (a passphrase-encrypted file, or one mixing it with recipients)")
    key = None
    for args, body in stanzas:
        if args[0] == "X25519":
            key = _unwrap(identity, args, body)
            if key is not None:
                break
    if key is None:
        raise AgeError("no identity matched any of the recipients")
    if len(key) != 16:
        raise AgeError("the file key is not 16 bytes")
    if not hmac.compare_digest(hmac.digest(_hkdf(key, b"", b"header"), mac_input, "sha256"), mac):
        raise AgeError("the header's MAC does not verify")
    return key


# -- the payload (STREAM) ------------------------------------------------------------------------


def payload_chunks(data: bytes | memoryview, start: int, key: bytes) -> Iterator[bytes]:
    """The payload's plaintext chunks in order, each yielded once its tag verified; AgeError (after
    the chunks before it) at the first that does not, or if the payload is cut or misshapen."""
    view = memoryview(data)[start:]
    if len(view) < NONCE:
        raise AgeError("the payload is cut short in its nonce")
    aead = ChaCha20Poly1305(_hkdf(key, bytes(view[:NONCE]), b"payload"))
    body = view[NONCE:]
    size = len(body)
    if size < TAG:
        raise AgeError("the payload has no chunk")
    for counter, offset in enumerate(range(0, size, ENCRYPTED_CHUNK)):
        chunk = body[offset : offset + ENCRYPTED_CHUNK]
        last = offset + ENCRYPTED_CHUNK >= size
        if len(chunk) < TAG or (last and len(chunk) == TAG and counter):
            raise AgeError("the payload's last chunk is empty or cut short")
        nonce = counter.to_bytes(11, "big") + (b"\x01" if last else b"\x00")
        try:
            yield aead.decrypt(nonce, chunk, None)
        except InvalidTag:
            raise AgeError(f"chunk {counter} of the payload does not authenticate") from None
