"""The images' provenance on a site: ``ale-verify check-provenance`` (statements checked against a
lock), ``ale-verify register-provenance`` (the operator registers the statements of the images a
release locks) and, for each upload that ran on an OCI runtime, :func:`settle_images` (the
registered statements of the images that ran, checked against the release's lock: what the
level may be and what the submission page shows).

The lock (``ale images lock``) says which image digests a release runs; ``ale images attest``
writes one in-toto Statement per image beside its layout (``NAME.intoto.json``), signed by a
runner key in a DSSE envelope. Each locked image must have its statement, for its own digest,
definition and layers, signed by a registered, active runner key of this site (or one given on
the command line); ``--allow-unsigned`` accepts bare statements (a local check of one's own
build). The checks are :func:`ale.core.provenance.check_lock`'s; docs/images.md, "Provenance",
and docs/verifier.md, "Image provenance".
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import logging
import os
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs

from ale.core import provenance
from ale.core.documents import Runtime
from ale.core.reasons import Level
from ale.core.release import ReleaseManifest
from ale.core.signing import key_id
from ale.core.verify import Documents, RunnerKey
from ale_verify.config import Settings

log = logging.getLogger(__name__)


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


# --- the site's registered statements ----------------------------------------------------------


def statement_file(folder: Path, digest: str) -> Path:
    """Where the registered statement of the image ``digest`` (``sha256:<hex>``) is kept."""
    return folder / f"{digest.removeprefix('sha256:')}.intoto.json"


def _registered(folder: Path | None, digest: str) -> bytes | None:
    """The statement registered for ``digest`` (at most one byte past the limit, which the check
    refuses), or None: none is registered, or it cannot be read (logged)."""
    if folder is None:
        return None
    path = statement_file(folder, digest)
    try:
        with open(path, "rb") as f:
            return f.read(provenance.MAX_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.warning("cannot read the provenance statement %s: %s", path, exc.strerror)
        return None


@attrs.frozen
class Registered:
    """A statement registration accepted: the image, the release whose lock holds it, the signer."""

    name: str
    digest: str
    release: str
    signer: RunnerKey
    path: Path


def register(
    raw: bytes, folder: Path, releases: Iterable[ReleaseManifest], trusted: provenance.KeyLookup
) -> Registered:
    """Register one statement (as ``ale images attest --key`` wrote it): signed by a ``trusted``
    (registered, active) runner key, for an image some installed release's lock holds, and holding
    against that lock entry (:func:`ale.core.provenance.check`); then kept in ``folder`` under its
    digest, replacing an earlier one. A :class:`ale.core.provenance.ProvenanceError` otherwise."""
    subject = provenance.read(raw, trusted=trusted).provenance
    locks = {r.release: r.lock for r in releases if r.lock is not None and subject.name in r.lock.images}
    if not locks:
        raise provenance.ProvenanceError("subject_mismatch", f"no installed release's images lock holds {subject.name}")
    holding = [name for name, lock in sorted(locks.items()) if lock.images[subject.name].digest == subject.digest]
    if not holding:
        locked = ", ".join(f"release {n} locks {lock.images[subject.name].digest}" for n, lock in sorted(locks.items()))
        raise provenance.ProvenanceError(
            "subject_mismatch", f"the statement is for {subject.name} {subject.digest}, but {locked}"
        )
    lock = locks[holding[0]]
    checked = provenance.check(raw, subject.name, provenance.lock_entries(lock)[subject.name], trusted=trusted)
    assert checked.signer is not None  # trusted and not allow_unsigned: a signature verified
    folder.mkdir(parents=True, exist_ok=True)
    path = statement_file(folder, subject.digest)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".register-")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(raw)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return Registered(subject.name, subject.digest, holding[0], checked.signer, path)


def read_statement(path: Path) -> bytes:
    """A statement file given on the command line, at most :data:`ale.core.provenance.MAX_BYTES`."""
    return _read(path, "the statement")


# --- an upload ----------------------------------------------------------------------------------


def image_proofs(
    runtime: Runtime, release: ReleaseManifest, settings: Settings, trusted: provenance.KeyLookup | None
) -> tuple[provenance.ImageProof, ...] | None:
    """The provenance of each image the run ran, from the site's registered statements checked
    against the release's lock; None for a run that ran no image (the local runtime)."""
    if runtime.images is None:
        return None
    ran = {name: entry.digest for name, entry in runtime.images.images.items()}
    statements = {name: _registered(settings.provenance_dir, digest) for name, digest in ran.items()}
    return provenance.prove_images(ran, release.lock, statements, trusted=trusted)


def settle_images(
    level: Level,
    notes: list[dict[str, str]],
    summary: Mapping[str, Any],
    docs: Documents,
    release: ReleaseManifest,
    settings: Settings,
) -> tuple[Level, list[dict[str, str]], dict[str, Any]]:
    """The upload's level, notes and audit summary with its images' provenance: the summary's
    ``image_provenance`` (None for a local run), a note for each image not proven, and
    ``officially_verified`` only when every image that ran is (docs/verifier.md, "Image provenance")."""
    from ale_verify.pipeline import registered_runner  # the pipeline calls this: imported when called

    proofs = image_proofs(docs.manifest.runtime, release, settings, registered_runner(settings))
    if proofs is None:
        return level, notes, {**summary, "image_provenance": None}
    shown = {p.name: p.summary() for p in proofs}
    return (
        provenance.credited_level(level, proofs),
        [*notes, *provenance.proof_notes(proofs)],
        {**summary, "image_provenance": shown},
    )
