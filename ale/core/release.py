"""The release manifest (``ale-release-manifest/v1``): what a score is measured against.

Paper targets, the CAP, EPS, zero-target safety limits and the required task
set are synced from this versioned JSON file at scoring time; none of them is
embedded in task code. Its hash (SHA-256 of the file's bytes) goes into every
bundle, and the hash of the required task set is what coverage is checked
against.
"""

from __future__ import annotations

import hashlib
import math

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


def parse_release(raw: bytes) -> tuple[ReleaseManifest, str]:
    """Parse a release manifest; return it with the SHA-256 (hex) of its bytes."""
    manifest = loads(raw, ReleaseManifest, what="release manifest")
    return manifest, hashlib.sha256(raw).hexdigest()


__all__ = ["RELEASE_SCHEMA", "ParseError", "ReleaseManifest", "TaskTarget", "parse_release"]
