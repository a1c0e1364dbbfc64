"""The verifier's own age decryptor (ale.core.age) against pyrage and the reference ``age`` CLI.

It must open exactly what they open, to the same bytes, and refuse what they refuse: valid files
of every chunking (empty, one byte, a chunk exactly, a chunk and a byte, ...), files to several
recipients, cut, altered and extended files, crafted STREAM payloads (an empty last chunk after a
full one, a missing last-chunk mark, a mark too early), crafted headers (a low-order share, an
scrypt stanza beside an X25519 one, a bad MAC), and hostile identities.
"""

from __future__ import annotations

import base64
import hmac
import os
import shutil
import subprocess
from pathlib import Path

import pyrage
import pytest
import sandbox_tools
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from fuzzing import fuzz_settings
from hypothesis import given
from hypothesis import strategies as st

from ale.core import age, bundle
from ale.core.reasons import Reason

IDENTITY = pyrage.x25519.Identity.generate()
SECRET_KEY, PUBLIC_KEY = str(IDENTITY), str(IDENTITY.to_public())
OTHERS = [str(pyrage.x25519.Identity.generate().to_public()) for _ in range(3)]
LIMITS = bundle.Limits()
SIZES = [0, 1, 100, age.CHUNK - 1, age.CHUNK, age.CHUNK + 1, 2 * age.CHUNK, 2 * age.CHUNK + 7, 5 * age.CHUNK - 3]


def _encrypt(plain: bytes, recipients: list[str]) -> bytes:
    return pyrage.encrypt(plain, [pyrage.x25519.Recipient.from_str(r) for r in recipients])


def _pyrage(data: bytes) -> bytes | None:
    try:
        return bytes(pyrage.decrypt(data, [IDENTITY]))
    except pyrage.DecryptError:
        return None


def _ours(data: bytes) -> bytes | None:
    try:
        return bundle.decrypt(data, SECRET_KEY, LIMITS)
    except bundle.BundleError as exc:
        reason = exc.reason
    assert reason in (Reason.DECRYPT_FAILED, Reason.BAD_AGE_HEADER, Reason.NOT_AGE)
    return None


def _plain(size: int) -> bytes:
    return os.urandom(size)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("place", [0, 2])
def test_what_pyrage_encrypts_decrypts_to_the_same_bytes(size: int, place: int) -> None:
    plain = _plain(size)
    recipients = [*OTHERS]
    recipients.insert(place, PUBLIC_KEY)
    data = _encrypt(plain, recipients)
    assert bundle.decrypt(data, SECRET_KEY, LIMITS) == plain
    assert b"".join(bundle.decrypt_chunks(data, SECRET_KEY, LIMITS)) == plain


@pytest.mark.parametrize("size", SIZES)
def test_what_the_age_cli_encrypts_decrypts_to_the_same_bytes(size: int, tmp_path: Path) -> None:
    if not shutil.which("age"):
        sandbox_tools.missing("needs the reference age CLI")
    plain = tmp_path / "plain"
    plain.write_bytes(_plain(size))
    out = subprocess.run(["age", "-r", PUBLIC_KEY, "-r", OTHERS[0], str(plain)], capture_output=True, check=True)
    assert bundle.decrypt(out.stdout, SECRET_KEY, LIMITS) == plain.read_bytes()


def test_what_the_age_cli_decrypts_is_what_we_decrypt(tmp_path: Path) -> None:
    if not shutil.which("age"):
        sandbox_tools.missing("needs the reference age CLI")
    key = tmp_path / "key.txt"
    key.write_text(SECRET_KEY + "\n")
    data = _encrypt(_plain(3 * age.CHUNK + 11), [PUBLIC_KEY])
    out = subprocess.run(["age", "-d", "-i", str(key)], input=data, capture_output=True, check=True)
    assert out.stdout == bundle.decrypt(data, SECRET_KEY, LIMITS)


def test_a_file_for_other_recipients_only_is_decrypt_failed() -> None:
    with pytest.raises(bundle.BundleError, match="no identity matched") as err:
        bundle.decrypt(_encrypt(b"x" * 10, OTHERS), SECRET_KEY, LIMITS)
    assert err.value.reason == Reason.DECRYPT_FAILED


# -- crafted files: a small encoder of our own, to write what no encoder writes -------------------


def _b64(raw: bytes) -> bytes:
    return base64.b64encode(raw).rstrip(b"=")


def _stanza(args: list[bytes], body: bytes) -> bytes:
    lines = b"-> " + b" ".join(args) + b"\n"
    encoded = _b64(body)
    pieces = [encoded[i : i + 64] for i in range(0, len(encoded), 64)]
    if not pieces or len(pieces[-1]) == 64:
        pieces.append(b"")
    return lines + b"\n".join(pieces) + b"\n"


def _x25519_stanza(file_key: bytes, recipient: bytes, share_key: X25519PrivateKey | None = None) -> bytes:
    ephemeral = share_key or X25519PrivateKey.generate()
    share = ephemeral.public_key().public_bytes_raw()
    secret = ephemeral.exchange(age.X25519PublicKey.from_public_bytes(recipient))
    wrap = age._hkdf(secret, share + recipient, b"age-encryption.org/v1/X25519")
    return _stanza([b"X25519", _b64(share)], ChaCha20Poly1305(wrap).encrypt(bytes(12), file_key, None))


def _seal(
    stanzas: list[bytes], file_key: bytes, chunks: list[tuple[bytes, bool]], *, mac_key: bytes | None = None
) -> bytes:
    """A file with these stanzas and these STREAM chunks (plaintext, marked last)."""
    header = b"age-encryption.org/v1\n" + b"".join(stanzas) + b"---"
    mac = hmac.digest(age._hkdf(mac_key or file_key, b"", b"header"), header, "sha256")
    nonce = os.urandom(16)
    aead = ChaCha20Poly1305(age._hkdf(file_key, nonce, b"payload"))
    body = b"".join(
        aead.encrypt(i.to_bytes(11, "big") + (b"\x01" if last else b"\x00"), plain, None)
        for i, (plain, last) in enumerate(chunks)
    )
    return header + b" " + _b64(mac) + b"\n" + nonce + body


def _recipient() -> bytes:
    return age.Identity.from_str(SECRET_KEY).recipient


FULL = b"f" * age.CHUNK
CRAFTED = {
    "one short last chunk": ([(b"abc", True)], b"abc"),
    "the empty payload": ([(b"", True)], b""),
    "one full last chunk": ([(FULL, True)], FULL),
    "a full chunk then a short last one": ([(FULL, False), (b"z", True)], FULL + b"z"),
    "an empty last chunk after a full one": ([(FULL, False), (b"", True)], None),
    "no chunk marked last": ([(FULL, False), (b"z", False)], None),
    "a full chunk marked last before another": ([(FULL, True), (b"z", True)], None),
    "a short chunk before the last": ([(b"ab", False), (b"z", True)], None),
}


@pytest.mark.parametrize("case", sorted(CRAFTED))
def test_crafted_stream_payloads_get_pyrages_verdict(case: str) -> None:
    chunks, expected = CRAFTED[case]
    key = os.urandom(16)
    data = _seal([_x25519_stanza(key, _recipient())], key, chunks)
    assert _pyrage(data) == expected
    assert _ours(data) == expected


def test_a_header_whose_mac_is_not_the_file_keys_is_decrypt_failed() -> None:
    key = os.urandom(16)
    data = _seal([_x25519_stanza(key, _recipient())], key, [(b"abc", True)], mac_key=os.urandom(16))
    assert _pyrage(data) is None
    with pytest.raises(bundle.BundleError, match="MAC does not verify"):
        bundle.decrypt(data, SECRET_KEY, LIMITS)


def test_an_x25519_share_of_low_order_is_decrypt_failed() -> None:
    key = os.urandom(16)
    low = _stanza([b"X25519", _b64(bytes(32))], os.urandom(32))  # the zero point: an all-zero secret
    data = _seal([low, _x25519_stanza(key, _recipient())], key, [(b"abc", True)])
    assert _pyrage(data) is None
    with pytest.raises(bundle.BundleError, match="low-order") as err:
        bundle.decrypt(data, SECRET_KEY, LIMITS)
    assert err.value.reason == Reason.DECRYPT_FAILED


def test_an_scrypt_stanza_beside_an_x25519_one_is_decrypt_failed() -> None:
    key = os.urandom(16)
    scrypt = _stanza([b"scrypt", _b64(os.urandom(16)), b"10"], os.urandom(32))
    data = _seal([_x25519_stanza(key, _recipient()), scrypt], key, [(b"abc", True)])
    assert _pyrage(data) is None
    assert _ours(data) is None


def test_a_grease_stanza_is_skipped_as_pyrage_skips_it() -> None:
    key = os.urandom(16)
    grease = _stanza([b"zz-grease", b"x"], os.urandom(40))
    data = _seal([grease, _x25519_stanza(key, _recipient())], key, [(b"abc", True)])
    assert _pyrage(data) == b"abc" == _ours(data)


@pytest.mark.parametrize("share", [b"AAAA", _b64(bytes(31)), _b64(b"\x01" * 32) + b"A", b"!" * 43])
def test_a_malformed_x25519_share_is_decrypt_failed(share: bytes) -> None:
    key = os.urandom(16)
    bad = _stanza([b"X25519", share], os.urandom(32))
    data = _seal([bad, _x25519_stanza(key, _recipient())], key, [(b"abc", True)])
    assert _pyrage(data) is None
    assert _ours(data) is None


# -- mutations of valid files: the same verdict as pyrage -------------------------------------------

SMALL = _encrypt(_plain(2 * age.CHUNK + 5), [PUBLIC_KEY, OTHERS[0]])


@pytest.mark.fuzz
@fuzz_settings
@given(data=st.data())
def test_a_mutated_file_gets_pyrages_verdict(data: st.DataObject) -> None:
    blob = bytearray(SMALL)
    op = data.draw(st.sampled_from(["flip", "cut", "append", "insert", "delete", "swap"]), label="op")
    pos = data.draw(st.integers(0, len(blob) - 1), label="position")
    if op == "flip":
        blob[pos] ^= data.draw(st.integers(1, 255), label="xor")
    elif op == "cut":
        del blob[pos:]
    elif op == "append":
        blob += data.draw(st.binary(min_size=1, max_size=age.ENCRYPTED_CHUNK + 1), label="tail")
    elif op == "insert":
        blob[pos:pos] = data.draw(st.binary(min_size=1, max_size=32), label="inserted")
    elif op == "delete":
        del blob[pos : pos + data.draw(st.integers(1, 64), label="length")]
    else:  # two whole chunks swapped
        start = SMALL.index(b"\n", SMALL.index(b"\n--- ") + 1) + 1 + age.NONCE
        a, b = start, start + age.ENCRYPTED_CHUNK
        blob[a:b], blob[b : b + age.ENCRYPTED_CHUNK] = blob[b : b + age.ENCRYPTED_CHUNK], blob[a:b]
    mutated = bytes(blob)
    try:
        bundle.check_age_header(mutated, LIMITS)
    except bundle.BundleError:
        return  # the header's grammar refuses it before any decryption (stricter than pyrage, on purpose)
    assert _ours(mutated) == _pyrage(mutated)


# -- identities -------------------------------------------------------------------------------


def test_the_identitys_recipient_is_pyrages() -> None:
    for _ in range(20):
        identity = pyrage.x25519.Identity.generate()
        ours = age.Identity.from_str(str(identity))
        public = str(identity.to_public())
        assert ours.recipient == age._bech32_decode(public, "age")


@pytest.mark.parametrize(
    "text",
    [
        "",
        "AGE-SECRET-KEY-1",
        SECRET_KEY.lower()[:-1] + ("q" if SECRET_KEY.lower()[-1] != "q" else "p"),  # checksum
        SECRET_KEY[:20] + SECRET_KEY[20:].lower(),  # mixed case
        SECRET_KEY.replace("AGE-SECRET-KEY-1", "AGE-SECRET-KEZ-1"),
        SECRET_KEY + "B",
        SECRET_KEY[:-8],
        "AGE-SECRET-KEY-1" + "Q" * 60,
        PUBLIC_KEY,
        "AGE-SECRET-KEY-1\x00" + SECRET_KEY[17:],
    ],
)
def test_a_malformed_identity_is_a_value_error(text: str) -> None:
    with pytest.raises(ValueError, match=r"bech32|age|case|32 bytes"):
        age.Identity.from_str(text)


def test_a_long_hostile_identity_fails_quickly() -> None:
    with pytest.raises(ValueError, match="longer than any age key"):
        age.Identity.from_str("AGE-SECRET-KEY-1" + "q" * 100_000)
