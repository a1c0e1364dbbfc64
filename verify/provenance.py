"""``ale-verify check-provenance``: the images' provenance statements checked against a lock.

The lock (``ale images lock``) says which image digests a release runs; ``ale images attest``
writes one in-toto Statement per image beside its layout (``NAME.intoto.json``), signed by a
runner key in a DSSE envelope. Each locked image must have its statement, for its own digest,
definition and layers, signed by a registered, active runner key of this site (or one given on
the command line); ``--allow-unsigned`` accepts bare statements (a local check of one's own
build). The checks are :func:`ale.core.provenance.check_lock`'s; docs/images.md, "Provenance".
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ale.core import provenance
from ale.core.signing import key_id
from ale.core.verify import RunnerKey


class ProvenanceInputError(ValueError):
    """A lock, a statement or a key given on the command line that cannot be read."""


def given_keys(encoded: Iterable[str]) -> dict[str, RunnerKey]:
    """Runner public keys (base64 of the raw 32 bytes, as ``ale runner-key`` prints them) by key id."""
    keys = {}
    for text in encoded:
        try:
            raw = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raise ProvenanceInputError(f"--runner-public-key {text!r} is not base64") from None
        if len(raw) != 32:
            raise ProvenanceInputError(f"--runner-public-key {text!r} is not a 32-byte Ed25519 key")
        keys[key_id(raw)] = RunnerKey(key_id(raw), text, "given", "given on the command line")
    return keys


def lookup(given: dict[str, RunnerKey], registered: provenance.KeyLookup | None) -> provenance.KeyLookup:
    def find(keyid: str) -> RunnerKey | None:
        return given.get(keyid) or (registered(keyid) if registered is not None else None)

    return find


def _read(path: Path, what: str) -> bytes:
    try:
        if path.stat().st_size > provenance.MAX_BYTES:
            raise ProvenanceInputError(f"{what} {path} is larger than {provenance.MAX_BYTES} bytes")
        return path.read_bytes()
    except OSError as exc:
        raise ProvenanceInputError(f"cannot read {what} {path}: {exc.strerror}") from None


def check_files(
    lock_path: Path, statements: Path, trusted: provenance.KeyLookup, *, allow_unsigned: bool
) -> dict[str, Any]:
    """Each locked image's ``statements/NAME.intoto.json`` checked against ``lock_path``: a report
    (raises :class:`ale.core.provenance.ProvenanceError` for the first refusal)."""
    lock = provenance.parse_lock(_read(lock_path, "the lock"))
    found = {
        name: _read(statements / f"{name}.intoto.json", "the statement")
        for name in lock
        if (statements / f"{name}.intoto.json").exists()
    }
    checked = provenance.check_lock(lock, found, trusted=trusted, allow_unsigned=allow_unsigned)
    return {
        name: {
            "digest": c.provenance.digest,
            "definition_sha256": c.provenance.definition_sha256,
            "signed_by": None if c.signer is None else {"key_id": c.signer.key_id, "kind": c.signer.kind},
        }
        for name, c in checked.items()
    }
