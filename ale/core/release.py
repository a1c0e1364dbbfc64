"""The release manifest (``ale-release-manifest/v1``): what a score is measured against.

Paper targets, the CAP, EPS, zero-target safety limits and the required task
set are synced from this versioned JSON file at scoring time; none of them is
embedded in task code. Its hash (SHA-256 of the file's bytes) goes into every
bundle, and the hash of the required task set is what coverage is checked
against. ``images`` names the release's images by their OCI manifest digests
(what ``ale images lock`` wrote), or is absent: a release that pins none. The
runner refuses to run other images for it, and the verifier refuses a bundle
whose runtime ran others (:func:`image_mismatches`).
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping

import attrs

from ale.core.canonical import canonical_json
from ale.core.parse import ParseError, loads

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


_IMAGE_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_IMAGE_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,63}")


def _images(_inst: object, _attr: object, value: dict[str, str] | None) -> None:
    if value is None:
        return
    if not value:
        raise ValueError("images: name at least one image, or leave the member out")
    for name, digest in value.items():
        if not _IMAGE_NAME.fullmatch(name):
            raise ValueError(f"images: {name[:80]!r} is not an image name")
        if not _IMAGE_DIGEST.fullmatch(digest):
            raise ValueError(f"images.{name} must be sha256: and 64 lowercase hex digits")


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
    images: dict[str, str] | None = attrs.field(default=None, validator=_images)  # name -> sha256:...

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


def parse_release(raw: bytes) -> tuple[ReleaseManifest, str]:
    """Parse a release manifest; return it with the SHA-256 (hex) of its bytes."""
    manifest = loads(raw, ReleaseManifest, what="release manifest")
    return manifest, hashlib.sha256(raw).hexdigest()


__all__ = ["RELEASE_SCHEMA", "ParseError", "ReleaseManifest", "TaskTarget", "image_mismatches", "parse_release"]
