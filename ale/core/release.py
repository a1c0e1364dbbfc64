"""The release manifest (``ale-release-manifest/v1``): what a score is measured against.

Paper targets, the CAP, EPS, zero-target safety limits and the required task
set are synced from this versioned JSON file at scoring time; none of them is
embedded in task code. Its hash (SHA-256 of the file's bytes) goes into every
bundle, and the hash of the required task set is what coverage is checked
against. ``images_lock`` names the release's images lock (what ``ale images
lock`` wrote: each image's OCI manifest digest, read from its layout), a file in
the ``locks/`` folder beside the manifest, or is absent: a release that pins no
images. The lock is read with the manifest (:func:`parse_release`, which is given
a reader for it) and is not part of the manifest's hash: the images follow the
code, the targets do not (docs/decisions.md, "Images"). The runner refuses to
run other images for a release, and the verifier refuses a bundle whose runtime
ran others (:func:`image_mismatches`).
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from ale.core.canonical import canonical_json
from ale.core.parse import ParseError, parse_json, structure

RELEASE_SCHEMA = "ale-release-manifest/v1"


def _finite_positive(_inst: object, attr: attrs.Attribute[float], value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{attr.name} must be a finite positive number, got {value}")


@attrs.frozen
class TaskTarget:
    """The paper's value for a task's headline metric and its safety budgets."""

    paper_value: float = attrs.field(validator=_finite_positive)
    safety_limits: dict[str, float] = attrs.field()

    @safety_limits.validator
    def _limits(self, _a: object, value: dict[str, float]) -> None:
        for name, limit in value.items():
            if not (math.isfinite(limit) and limit > 0):
                raise ValueError(f"safety limit {name!r} must be a finite positive number, got {limit}")


IMAGE_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
IMAGE_NAME = re.compile(r"[a-z][a-z0-9-]{0,62}")
LOCK_FORMAT = "ale-images-lock/v1"
MAX_LOCK_BYTES = 1024 * 1024
#: A lock's file name in the releases' ``locks/`` folder: no folder, nothing hidden.
LOCK_FILE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}\.json")
_HEX64 = re.compile(r"[0-9a-f]{64}")


@attrs.frozen
class LockedImage:
    """One image of a lock: its manifest digest, its definition's SHA-256, its layers (lowest first)."""

    digest: str  # "sha256:<hex>"
    definition_sha256: str  # hex
    layers: tuple[str, ...]  # "sha256:<hex>" each


@attrs.frozen
class ImagesLock:
    """An images lock (``ale-images-lock/v1``) as read: its images, and the SHA-256 of its bytes."""

    sha256: str
    images: Mapping[str, LockedImage]

    @property
    def digests(self) -> dict[str, str]:
        """Each image's manifest digest, by name."""
        return {name: entry.digest for name, entry in sorted(self.images.items())}


def _lock_fail(where: str, why: str) -> ParseError:
    return ParseError(f"images lock: {where} {why}")


def _lock_text(value: Any, where: str, pattern: re.Pattern[str]) -> str:
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise _lock_fail(where, f"must be a string matching {pattern.pattern}")
    return value


def _locked_image(name: str, entry: Any) -> LockedImage:
    where = f"images.{name}"
    if not isinstance(entry, dict) or set(entry) != {"digest", "definition_sha256", "layers"}:
        raise _lock_fail(where, "must be an object of exactly digest, definition_sha256 and layers")
    layers = entry["layers"]
    if not isinstance(layers, list) or not 1 <= len(layers) <= 128:
        raise _lock_fail(f"{where}.layers", "must be a list of 1 to 128 layer digests")
    return LockedImage(
        digest=_lock_text(entry["digest"], f"{where}.digest", IMAGE_DIGEST),
        definition_sha256=_lock_text(entry["definition_sha256"], f"{where}.definition_sha256", _HEX64),
        layers=tuple(_lock_text(x, f"{where}.layers[{i}]", IMAGE_DIGEST) for i, x in enumerate(layers)),
    )


def parse_lock(raw: bytes) -> ImagesLock:
    """An images lock as ``ale images lock`` writes it, checked for shape (``ParseError`` otherwise):
    ``{"format": "ale-images-lock/v1", "images": {NAME: {"digest", "definition_sha256", "layers"}}}``."""
    doc = parse_json(raw, what="images lock", max_bytes=MAX_LOCK_BYTES, max_depth=8)
    if not isinstance(doc, dict) or set(doc) != {"format", "images"}:
        raise _lock_fail("the document", "must be an object of exactly format and images")
    if doc["format"] != LOCK_FORMAT:
        raise _lock_fail("format", f"must be {LOCK_FORMAT!r}")
    images = doc["images"]
    if not isinstance(images, dict) or not 1 <= len(images) <= 64:
        raise _lock_fail("images", "must name 1 to 64 images")
    for name in images:
        if not IMAGE_NAME.fullmatch(name):
            raise _lock_fail("images", f"has {name[:80]!r}, which is not an image name")
    entries = {name: _locked_image(name, entry) for name, entry in sorted(images.items())}
    return ImagesLock(hashlib.sha256(raw).hexdigest(), entries)


def _lock_file(_inst: object, _attr: object, value: str | None) -> None:
    if value is not None and not LOCK_FILE.fullmatch(value):
        raise ValueError(f"images_lock must be a file name matching {LOCK_FILE.pattern} (in the releases' locks/)")


def _lock_named(inst: ReleaseManifest, _attr: object, value: ImagesLock | None) -> None:
    if value is not None and inst.images_lock is None:
        raise ValueError("a release with an images lock names it (images_lock)")


@attrs.frozen
class ReleaseManifest:
    schema: str = attrs.field(validator=attrs.validators.in_((RELEASE_SCHEMA,)))
    release: str
    cap: float = attrs.field(validator=_finite_positive)
    eps: float = attrs.field(validator=_finite_positive)
    aggregate: str = attrs.field(validator=attrs.validators.in_(("macro_mean",)))
    missing_tasks: str = attrs.field(validator=attrs.validators.in_(("exclude", "zero")))
    required_tasks: tuple[str, ...]
    tasks: dict[str, TaskTarget]
    #: the images lock's file name in the releases' locks/ folder (None: the release pins no images)
    images_lock: str | None = attrs.field(default=None, validator=_lock_file)
    #: the lock images_lock names, as read by parse_release (never a member of the manifest's JSON)
    lock: ImagesLock | None = attrs.field(default=None, validator=_lock_named)

    def __attrs_post_init__(self) -> None:
        if len(set(self.required_tasks)) != len(self.required_tasks):
            raise ValueError("required_tasks repeat")
        missing = [ref for ref in self.required_tasks if ref not in self.tasks]
        if missing:
            raise ValueError(f"required tasks without a target: {', '.join(missing)}")
        for ref in self.tasks:
            if "@" not in ref:
                raise ValueError(f"task key {ref!r} is not of the form id@version")

    @property
    def images(self) -> dict[str, str] | None:
        """The release's images by name: each one's manifest digest, from its lock (None: it pins none)."""
        return None if self.lock is None else self.lock.digests

    @property
    def required_task_set_hash(self) -> str:
        """SHA-256 (hex) of the canonical JSON array of sorted ``id@version`` refs."""
        return hashlib.sha256(canonical_json(sorted(self.required_tasks))).hexdigest()

    def target(self, task_ref: str) -> TaskTarget:
        try:
            return self.tasks[task_ref]
        except KeyError:
            raise KeyError(f"release {self.release} has no target for {task_ref}") from None


def image_mismatches(pinned: Mapping[str, str] | None, ran: Mapping[str, str]) -> list[str]:
    """What keeps images ``ran`` (name -> manifest digest) from being a release's ``pinned`` ones,
    one sentence each; empty when they are (or when the release pins none)."""
    if pinned is None:
        return []
    problems = [
        f"the release pins {name} {digest}, but {ran[name]} ran"
        if name in ran
        else f"the release pins {name} {digest}, which did not run"
        for name, digest in sorted(pinned.items())
        if ran.get(name) != digest
    ]
    problems += [f"{name} {ran[name]} ran, which the release does not pin" for name in sorted(set(ran) - set(pinned))]
    return problems


LockReader = Callable[[str], bytes]


def parse_release(raw: bytes, read_lock: LockReader | None = None) -> tuple[ReleaseManifest, str]:
    """Parse a release manifest; return it with the SHA-256 (hex) of its bytes. A manifest that
    names an images lock is returned with it, read by ``read_lock(file name)`` (an ``OSError`` from
    it, or a lock that does not parse, is a ``ParseError`` naming the lock)."""
    doc = parse_json(raw, what="release manifest")
    if isinstance(doc, dict) and "lock" in doc:
        raise ParseError("release manifest: unknown member lock (a release names its lock with images_lock)")
    manifest = structure(doc, ReleaseManifest, what="release manifest")
    if manifest.images_lock is not None:
        name = manifest.images_lock
        if read_lock is None:
            raise ParseError(f"release {manifest.release} names the images lock {name}, and no lock can be read here")
        try:
            lock = parse_lock(read_lock(name))
        except OSError as exc:
            raise ParseError(
                f"release {manifest.release}: cannot read its images lock {name}: {exc.strerror or exc}"
            ) from None
        except ParseError as exc:
            raise ParseError(f"release {manifest.release}: {name}: {exc}") from None
        manifest = attrs.evolve(manifest, lock=lock)
    return manifest, hashlib.sha256(raw).hexdigest()


__all__ = [
    "LOCK_FORMAT",
    "RELEASE_SCHEMA",
    "ImagesLock",
    "LockedImage",
    "ParseError",
    "ReleaseManifest",
    "TaskTarget",
    "image_mismatches",
    "parse_lock",
    "parse_release",
]
