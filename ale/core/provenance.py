"""Image provenance: an in-toto Statement v1 whose predicate is SLSA Provenance v1, optionally in a
DSSE envelope signed with a runner's Ed25519 key (docs/images.md, "Provenance").

``ale images attest`` makes one for each built image (:mod:`ale.images.provenance` gathers the
facts); the verifier checks one against the lock (:func:`check`). Pure: bytes and plain values
in, values out.

The check, in order; each failure a :class:`ProvenanceError` with a stable ``reason``:

1. ``malformed``: the bytes parse (the one bounded JSON parser) into a DSSE envelope or a bare
   Statement, of exactly the shape below (no member more, none less);
2. the envelope, if any: ``payloadType`` is in-toto's; at least one signature verifies over
   DSSE's pre-authentication encoding with a trusted key (``untrusted_signer`` when none names
   one, ``bad_signature`` when one names a trusted key and fails); a bare Statement is
   ``unsigned`` unless the caller allows it;
3. the Statement: in-toto's ``_type``, SLSA v1's ``predicateType``, this project's ``buildType``;
4. ``subject_mismatch``: exactly one subject, the locked image's name and manifest digest;
5. ``definition_mismatch``: the definition's SHA-256 is the lock's;
6. ``layers_mismatch``: the layer digests (byproducts) are the lock's, in order.

For an uploaded bundle that ran on an OCI runtime, :func:`prove_images` checks the statements
the site's operator registered for the digests that ran against the release's lock, and
:func:`credited_level` keeps a run whose images are not all proven from ``officially_verified``
(docs/verifier.md, "Image provenance").
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable, Mapping
from typing import Any

import attrs
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from ale.core import release
from ale.core.canonical import canonical_json
from ale.core.parse import ParseError, parse_json
from ale.core.reasons import Level, Reason
from ale.core.release import ImagesLock
from ale.core.signing import key_id, public_raw
from ale.core.verify import RunnerKey

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://slsa.dev/provenance/v1"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
#: What the predicate's buildDefinition means: an image built by `ale images build` from a
#: definition under images/ (docs/images.md). Opaque identifiers: the project has no URL of its own.
BUILD_TYPE = "urn:ale-robotics:buildtype:oci-image:v1"
BUILDER_ID = "urn:ale-robotics:builder:ale-images-build"
LAYER_MEDIA_TYPE = "application/vnd.oci.image.layer.v1.tar"
CONFIG_MEDIA_TYPE = "application/vnd.oci.image.config.v1+json"
MAX_BYTES = 4 * 1024 * 1024  # a statement lists every pin and project file: tens of KiB
KINDS = ("deb", "wheel", "project", "source")
_HEX64 = re.compile(r"[0-9a-f]{64}")
_HEX40 = re.compile(r"[0-9a-f]{40}")
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_NAME = re.compile(r"[a-z][a-z0-9-]{0,62}")

KeyLookup = Callable[[str], RunnerKey | None]


class ProvenanceError(ValueError):
    """A statement the verifier refuses; ``reason`` is stable, the message says what."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason, self.message = reason, message


# --- the model ----------------------------------------------------------------------------------


@attrs.frozen
class Dependency:
    """A resolvedDependencies entry: what went into the image, by SHA-256."""

    kind: str  # one of KINDS
    name: str  # a package's name; a project file's checkout path; "checkout" for the source
    digest: Mapping[str, str]  # {"sha256": hex}, or {"gitCommit": hex} for the source
    uri: str | None = None  # where a deb or wheel is downloaded from
    version: str | None = None  # a deb's or wheel's version
    path: str | None = None  # where a project file lands in the image


@attrs.frozen
class Provenance:
    """What a Statement says about one image."""

    name: str  # the image's name in images/ and in the lock
    digest: str  # "sha256:<hex>": its manifest digest
    definition_path: str  # "images/NAME.toml"
    definition_sha256: str
    epoch: int  # every entry's modification time
    dependencies: tuple[Dependency, ...]
    config: str  # "sha256:<hex>"
    layers: tuple[str, ...]  # "sha256:<hex>", lowest first
    builder_version: Mapping[str, str]


@attrs.frozen
class Checked:
    """A statement that passed :func:`check`: what it says and who signed it (None: unsigned)."""

    provenance: Provenance
    signer: RunnerKey | None


# --- writing ------------------------------------------------------------------------------------


def _descriptor(dep: Dependency) -> dict[str, Any]:
    out: dict[str, Any] = {"name": dep.name, "digest": dict(dep.digest)}
    if dep.uri is not None:
        out["uri"] = dep.uri
    notes = {"kind": dep.kind}
    if dep.version is not None:
        notes["version"] = dep.version
    if dep.path is not None:
        notes["path"] = dep.path
    out["annotations"] = notes
    return out


def statement(p: Provenance) -> dict[str, Any]:
    """The in-toto Statement v1 (SLSA Provenance v1 predicate) of ``p``."""
    byproducts = [{"name": "config", "digest": {"sha256": p.config[7:]}, "mediaType": CONFIG_MEDIA_TYPE}]
    byproducts += [
        {"name": f"layer-{i}", "digest": {"sha256": layer[7:]}, "mediaType": LAYER_MEDIA_TYPE}
        for i, layer in enumerate(p.layers)
    ]
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": p.name, "digest": {"sha256": p.digest[7:]}}],
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": {
                    "image": p.name,
                    "definition": {"path": p.definition_path, "sha256": p.definition_sha256},
                    "epoch": p.epoch,
                },
                "resolvedDependencies": [_descriptor(d) for d in p.dependencies],
            },
            "runDetails": {
                "builder": {"id": BUILDER_ID, "version": dict(p.builder_version)},
                "byproducts": byproducts,
            },
        },
    }


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE v1's pre-authentication encoding: what a signature covers (the type included)."""
    kind = payload_type.encode("utf-8")
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(payload), payload)


def envelope(document: Mapping[str, Any], key: Ed25519PrivateKey) -> dict[str, Any]:
    """The DSSE envelope of the Statement ``document`` (its canonical JSON), signed with ``key``."""
    payload = canonical_json(document)
    return {
        "payload": base64.b64encode(payload).decode("ascii"),
        "payloadType": PAYLOAD_TYPE,
        "signatures": [
            {"keyid": key_id(public_raw(key)), "sig": base64.b64encode(key.sign(pae(PAYLOAD_TYPE, payload))).decode()}
        ],
    }


# --- reading ------------------------------------------------------------------------------------


def _fail(where: str, why: str) -> ProvenanceError:
    return ProvenanceError("malformed", f"{where}: {why}")


def _object(value: Any, where: str, keys: set[str], optional: frozenset[str] = frozenset()) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _fail(where, "must be an object")
    missing, extra = keys - set(value), set(value) - keys - optional
    if missing or extra:
        raise _fail(
            where, f"needs exactly {sorted(keys)}" + (f" (and may have {sorted(optional)})" if optional else "")
        )
    return value


def _text(value: Any, where: str, pattern: re.Pattern[str] | None = None) -> str:
    if not isinstance(value, str) or not value or len(value) > 4096 or (pattern and not pattern.fullmatch(value)):
        raise _fail(
            where, "must be a string" + (f" matching {pattern.pattern}" if pattern else " (1 to 4096 characters)")
        )
    return value


def _const(value: Any, where: str, expected: str) -> None:
    if value != expected:
        raise _fail(where, f"must be {expected!r}")


def _sha256(value: Any, where: str) -> str:
    return _text(_object(value, where, {"sha256"})["sha256"], f"{where}.sha256", _HEX64)


def _dependency(value: Any, where: str) -> Dependency:
    d = _object(value, where, {"name", "digest", "annotations"}, frozenset({"uri"}))
    notes = _object(d["annotations"], f"{where}.annotations", {"kind"}, frozenset({"version", "path"}))
    kind = notes["kind"]
    if kind not in KINDS:
        raise _fail(f"{where}.annotations.kind", f"must be one of {', '.join(KINDS)}")
    if kind == "source":
        digest = {"gitCommit": _text(_object(d["digest"], f"{where}.digest", {"gitCommit"})["gitCommit"],
                                     f"{where}.digest.gitCommit", _HEX40)}  # fmt: skip
    else:
        digest = {"sha256": _sha256(d["digest"], f"{where}.digest")}
    wanted = {"deb": {"uri", "version"}, "wheel": {"uri", "version"}, "project": {"path"}, "source": set()}[kind]
    given = ({"uri"} & set(d)) | ({"version", "path"} & set(notes))
    if given != wanted:
        raise _fail(where, f"a {kind} has exactly {sorted(wanted) or 'no uri, version or path'}")
    return Dependency(
        kind=kind,
        name=_text(d["name"], f"{where}.name"),
        digest=digest,
        uri=_text(d["uri"], f"{where}.uri") if "uri" in d else None,
        version=_text(notes["version"], f"{where}.annotations.version") if "version" in notes else None,
        path=_text(notes["path"], f"{where}.annotations.path") if "path" in notes else None,
    )


def _byproducts(value: Any) -> tuple[str, tuple[str, ...]]:
    where = "predicate.runDetails.byproducts"
    if not isinstance(value, list) or not value:
        raise _fail(where, "must be a non-empty list")
    digests = []
    for i, item in enumerate(value):
        entry = _object(item, f"{where}[{i}]", {"name", "digest", "mediaType"})
        name, media = ("config", CONFIG_MEDIA_TYPE) if i == 0 else (f"layer-{i - 1}", LAYER_MEDIA_TYPE)
        _const(entry["name"], f"{where}[{i}].name", name)
        _const(entry["mediaType"], f"{where}[{i}].mediaType", media)
        digests.append("sha256:" + _sha256(entry["digest"], f"{where}[{i}].digest"))
    return digests[0], tuple(digests[1:])


def _builder_version(value: Any) -> dict[str, str]:
    where = "predicate.runDetails.builder.version"
    if not isinstance(value, dict) or not value or len(value) > 16:
        raise _fail(where, "must be an object of 1 to 16 strings")
    return {_text(k, where): _text(v, f"{where}.{k}") for k, v in value.items()}


def parse_statement(doc: Any) -> Provenance:
    """The Statement ``doc`` (parsed JSON) as a :class:`Provenance`, or ``malformed``."""
    s = _object(doc, "statement", {"_type", "subject", "predicateType", "predicate"})
    _const(s["_type"], "_type", STATEMENT_TYPE)
    _const(s["predicateType"], "predicateType", PREDICATE_TYPE)
    subjects = s["subject"]
    if not isinstance(subjects, list) or len(subjects) != 1:
        raise ProvenanceError("subject_mismatch", "a statement names exactly one image")
    subject = _object(subjects[0], "subject[0]", {"name", "digest"})
    predicate = _object(s["predicate"], "predicate", {"buildDefinition", "runDetails"})
    build = _object(predicate["buildDefinition"], "predicate.buildDefinition",
                    {"buildType", "externalParameters", "resolvedDependencies"})  # fmt: skip
    _const(build["buildType"], "predicate.buildDefinition.buildType", BUILD_TYPE)
    params = _object(build["externalParameters"], "externalParameters", {"image", "definition", "epoch"})
    definition = _object(params["definition"], "externalParameters.definition", {"path", "sha256"})
    epoch = params["epoch"]
    if type(epoch) is not int or not 0 <= epoch < 8**11:
        raise _fail("externalParameters.epoch", "must be a time in seconds")
    deps = build["resolvedDependencies"]
    if not isinstance(deps, list) or len(deps) > 100_000:
        raise _fail("resolvedDependencies", "must be a list")
    run = _object(predicate["runDetails"], "predicate.runDetails", {"builder", "byproducts"})
    builder = _object(run["builder"], "predicate.runDetails.builder", {"id", "version"})
    _const(builder["id"], "predicate.runDetails.builder.id", BUILDER_ID)
    config, layers = _byproducts(run["byproducts"])
    name = _text(subject["name"], "subject[0].name", _NAME)
    _const(params["image"], "externalParameters.image", name)
    return Provenance(
        name=name,
        digest="sha256:" + _sha256(subject["digest"], "subject[0].digest"),
        definition_path=_text(definition["path"], "externalParameters.definition.path"),
        definition_sha256=_text(definition["sha256"], "externalParameters.definition.sha256", _HEX64),
        epoch=epoch,
        dependencies=tuple(_dependency(d, f"resolvedDependencies[{i}]") for i, d in enumerate(deps)),
        config=config,
        layers=layers,
        builder_version=_builder_version(builder["version"]),
    )


# --- checking -----------------------------------------------------------------------------------


def _verify_envelope(env: dict[str, Any], trusted: KeyLookup | None) -> tuple[bytes, RunnerKey]:
    """The payload of a DSSE envelope, and the trusted key one of its signatures verifies with."""
    _object(env, "envelope", {"payload", "payloadType", "signatures"})
    _const(env["payloadType"], "payloadType", PAYLOAD_TYPE)
    encoded = env["payload"]
    if not isinstance(encoded, str) or not encoded or len(encoded) > MAX_BYTES * 4 // 3 + 4:
        raise _fail("payload", f"must be the base64 of at most {MAX_BYTES} bytes")
    try:
        payload = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise _fail("payload", "is not base64") from None
    signatures = env["signatures"]
    if not isinstance(signatures, list) or not 1 <= len(signatures) <= 16:
        raise _fail("signatures", "must be a list of 1 to 16 signatures")
    named_trusted = False
    for i, item in enumerate(signatures):
        sig = _object(item, f"signatures[{i}]", {"keyid", "sig"})
        keyid = _text(sig["keyid"], f"signatures[{i}].keyid", _HEX64)
        runner = trusted(keyid) if trusted is not None else None
        if runner is None:
            continue
        named_trusted = True
        try:
            value = base64.b64decode(_text(sig["sig"], f"signatures[{i}].sig"), validate=True)
            raw = base64.b64decode(runner.public_key, validate=True)
            if key_id(raw) != keyid:
                continue  # the lookup's key is not the one named
            Ed25519PublicKey.from_public_bytes(raw).verify(value, pae(PAYLOAD_TYPE, payload))
        except (binascii.Error, ValueError, InvalidSignature):
            continue
        return payload, runner
    if named_trusted:
        raise ProvenanceError("bad_signature", "no signature verifies over the statement with the key it names")
    raise ProvenanceError("untrusted_signer", "no signature is by a registered runner key")


def read(raw: bytes, *, trusted: KeyLookup | None, allow_unsigned: bool = False) -> Checked:
    """Steps 1 to 3: the bytes as a checked Statement (not yet compared with a lock)."""
    try:
        doc = parse_json(raw, what="provenance statement", max_bytes=MAX_BYTES)
    except ParseError as exc:
        raise ProvenanceError("malformed", str(exc)) from None
    signer = None
    if isinstance(doc, dict) and "payloadType" in doc:
        payload, signer = _verify_envelope(doc, trusted)
        try:
            doc = parse_json(payload, what="the envelope's statement", max_bytes=MAX_BYTES)
        except ParseError as exc:
            raise ProvenanceError("malformed", str(exc)) from None
    elif not allow_unsigned:
        raise ProvenanceError("unsigned", "the statement is not in a signed DSSE envelope")
    return Checked(parse_statement(doc), signer)


def check(
    raw: bytes,
    name: str,
    lock_entry: Mapping[str, Any],
    *,
    trusted: KeyLookup | None,
    allow_unsigned: bool = False,
) -> Checked:
    """The statement in ``raw`` checked against the lock's entry for image ``name`` (steps 1 to 6)."""
    checked = read(raw, trusted=trusted, allow_unsigned=allow_unsigned)
    p = checked.provenance
    if p.name != name or p.digest != lock_entry.get("digest"):
        raise ProvenanceError(
            "subject_mismatch",
            f"the statement is for {p.name} {p.digest}, the lock's {name} is {lock_entry.get('digest')}",
        )
    if p.definition_sha256 != lock_entry.get("definition_sha256"):
        raise ProvenanceError("definition_mismatch", f"{name}: built from another definition than the lock's")
    layers = lock_entry.get("layers")
    if layers is not None and list(p.layers) != list(layers):
        raise ProvenanceError("layers_mismatch", f"{name}: the layers are not the lock's")
    return checked


def lock_entries(lock: ImagesLock) -> dict[str, dict[str, Any]]:
    """A lock's images as :func:`check` takes them (each entry as ``ale images lock`` writes it)."""
    return {
        name: {"digest": e.digest, "definition_sha256": e.definition_sha256, "layers": list(e.layers)}
        for name, e in sorted(lock.images.items())
    }


def parse_lock(raw: bytes) -> dict[str, dict[str, Any]]:
    """An images lock (``ale images lock``) as the verifier reads it (:func:`ale.core.release.parse_lock`,
    the one reader of locks): each image's digest, the definition's SHA-256 and the layer digests
    (``malformed`` when it is not exactly that)."""
    try:
        return lock_entries(release.parse_lock(raw))
    except ParseError as exc:
        raise ProvenanceError("malformed", str(exc)) from None


def check_lock(
    lock: Mapping[str, Mapping[str, Any]],
    statements: Mapping[str, bytes],
    *,
    trusted: KeyLookup | None,
    allow_unsigned: bool = False,
) -> dict[str, Checked]:
    """Every locked image's statement checked (``missing`` when one has none; ``subject_mismatch``
    for a statement of an image the lock does not hold)."""
    extra = sorted(set(statements) - set(lock))
    if extra:
        raise ProvenanceError("subject_mismatch", f"no image {extra[0]!r} in the lock")
    out = {}
    for name in sorted(lock):
        if name not in statements:
            raise ProvenanceError("missing", f"no provenance statement for {name}")
        out[name] = check(statements[name], name, lock[name], trusted=trusted, allow_unsigned=allow_unsigned)
    return out


# --- an uploaded run's images -------------------------------------------------------------------

VERIFIED, MISSING, INVALID = "verified", "missing", "invalid"


@attrs.frozen
class ImageProof:
    """What the verifier found of the provenance of one image a bundle's run ran."""

    name: str
    digest: str  # "sha256:<hex>", as the bundle's manifest names it
    status: str  # VERIFIED | MISSING | INVALID
    message: str  # why not verified ("" when it is)
    reason: str | None = None  # an invalid statement's ProvenanceError reason
    signer: RunnerKey | None = None  # the registered runner key whose signature verified

    def summary(self) -> dict[str, Any]:
        """What the audit summary (and the submission page) holds of it."""
        signed = None if self.signer is None else {"key_id": self.signer.key_id, "kind": self.signer.kind}
        return {"digest": self.digest, "status": self.status, "reason": self.reason, "message": self.message,
                "signed_by": signed}  # fmt: skip


def prove_image(
    name: str, digest: str, lock: ImagesLock | None, statement: bytes | None, *, trusted: KeyLookup | None
) -> ImageProof:
    """The provenance of image ``name`` (``digest`` ran) under the release's ``lock``: its registered
    ``statement`` (None: none is registered) checked against the lock's entry, signed by a ``trusted``
    key (a bare Statement is not enough for a site)."""
    entry = lock.images.get(name) if lock is not None else None
    if lock is None or entry is None or entry.digest != digest:
        why = "the release names no images lock" if lock is None else "the release's lock does not hold it"
        return ImageProof(name, digest, MISSING, f"{why}: there is nothing to check a provenance against")
    if statement is None:
        return ImageProof(name, digest, MISSING, "no provenance statement of it is registered on this site")
    try:
        checked = check(statement, name, lock_entries(lock)[name], trusted=trusted)
    except ProvenanceError as exc:
        return ImageProof(name, digest, INVALID, exc.message, reason=exc.reason)
    return ImageProof(name, digest, VERIFIED, "", signer=checked.signer)


def prove_images(
    ran: Mapping[str, str],
    lock: ImagesLock | None,
    statements: Mapping[str, bytes | None],
    *,
    trusted: KeyLookup | None,
) -> tuple[ImageProof, ...]:
    """Each image that ran (name -> digest), by name: :func:`prove_image` with its statement."""
    return tuple(
        prove_image(name, digest, lock, statements.get(name), trusted=trusted) for name, digest in sorted(ran.items())
    )


def proof_notes(proofs: tuple[ImageProof, ...]) -> list[dict[str, str]]:
    """A note for each image whose provenance did not verify (``provenance_missing``, ``provenance_invalid``)."""
    reason = {MISSING: Reason.PROVENANCE_MISSING, INVALID: Reason.PROVENANCE_INVALID}
    return [
        {
            "reason": reason[p.status],
            "message": f"{p.name} {p.digest}: " + (f"{p.reason}: {p.message}" if p.reason else p.message),
        }
        for p in proofs
        if p.status != VERIFIED
    ]


def credited_level(level: Level, proofs: tuple[ImageProof, ...]) -> Level:
    """``level`` unless it is ``officially_verified`` and an image that ran is not proven: then
    ``validated`` (the runner's signature vouches for the run, but not for what its images hold)."""
    if level is Level.OFFICIALLY_VERIFIED and any(p.status != VERIFIED for p in proofs):
        return Level.VALIDATED
    return level
