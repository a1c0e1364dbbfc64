"""Task definitions (``ale-task/v1``): versioned data, parsed strictly.

A task names its simulator (a gymnasium id and arguments), the domain metric
the evaluator computes, its genre and mode, the official episode count and
budgets. Paper targets, the CAP and safety limits are *not* here: they come
from the release manifest (:mod:`ale.core.release`).
"""

from __future__ import annotations

import hashlib
import re
from typing import Any, Literal

import attrs

from ale.core.canonical import canonical_json
from ale.core.parse import ParseError, converter, loads

TASK_SCHEMA = "ale-task/v1"
Genre = Literal["reproduction", "open"]
Mode = Literal["interactive", "batch"]
Direction = Literal["higher", "lower"]

_ID = re.compile(r"^[a-z][a-z0-9-]{1,62}[a-z0-9]$")
_VERSION = re.compile(r"^[0-9]+\.[0-9]+\.[0-9]+$")
_NAME = re.compile(r"^[a-z][a-z0-9_]{0,62}$")


def _check(pattern: re.Pattern[str], what: str) -> Any:
    def validator(_inst: object, attr: attrs.Attribute[str], value: str) -> None:
        if not pattern.fullmatch(value):
            raise ValueError(f"{attr.name} {value!r} is not a valid {what}")

    return validator


def _positive(_inst: object, attr: attrs.Attribute[int], value: int) -> None:
    if value <= 0:
        raise ValueError(f"{attr.name} must be positive, got {value}")


@attrs.frozen
class Headline:
    metric: str = attrs.field(validator=_check(_NAME, "metric name"))
    direction: Direction = attrs.field(validator=attrs.validators.in_(("higher", "lower")))


@attrs.frozen
class Budgets:
    wall_time_s: int = attrs.field(validator=_positive)
    env_steps: int = attrs.field(validator=_positive)
    llm_tokens: int = attrs.field(validator=_positive)


@attrs.frozen
class TaskSpec:
    schema: str = attrs.field(validator=attrs.validators.in_((TASK_SCHEMA,)))
    id: str = attrs.field(validator=_check(_ID, "task id"))
    version: str = attrs.field(validator=_check(_VERSION, "version (MAJOR.MINOR.PATCH)"))
    title: str
    genre: Genre = attrs.field(validator=attrs.validators.in_(("reproduction", "open")))
    mode: Mode = attrs.field(validator=attrs.validators.in_(("interactive", "batch")))
    domain: str = attrs.field(validator=_check(_NAME, "domain name"))
    gym_id: str
    gym_kwargs: dict[str, Any] = attrs.field()
    headline: Headline
    safety_metrics: tuple[str, ...] = attrs.field()
    official_episodes: int = attrs.field(validator=_positive)
    budgets: Budgets
    paper: str

    @safety_metrics.validator
    def _safety(self, _a: object, value: tuple[str, ...]) -> None:
        if not value:
            raise ValueError("a task declares at least one zero-target safety metric")
        for name in value:
            if not _NAME.fullmatch(name):
                raise ValueError(f"safety metric {name!r} is not a valid metric name")
        if len(set(value)) != len(value):
            raise ValueError("safety metrics repeat")

    @gym_kwargs.validator
    def _kwargs(self, _a: object, value: dict[str, Any]) -> None:
        for key, item in value.items():
            if not isinstance(item, (bool, int, float, str)):
                raise ValueError(f"gym_kwargs[{key!r}] must be a number, boolean or string")

    @property
    def ref(self) -> str:
        """``id@version``, the form used in the required task set."""
        return f"{self.id}@{self.version}"


def parse_task(raw: bytes, *, paper: bytes, rubric: bytes | None = None) -> tuple[TaskSpec, str]:
    """Parse a task definition and return it with its digest.

    The digest is the SHA-256 (hex) of the canonical JSON of
    ``{"paper_sha256": <hex of the paper's bytes>, "task": <the definition>}``, with
    ``"rubric_sha256": <hex of rubric.json's bytes>`` added for a task that ships a faithfulness
    rubric (docs/judge.md), so a changed write-up or rubric changes the task's identity.
    """
    spec = loads(raw, TaskSpec, what="task definition")
    body = {"paper_sha256": hashlib.sha256(paper).hexdigest(), "task": converter.unstructure(spec)}
    if rubric is not None:
        body["rubric_sha256"] = hashlib.sha256(rubric).hexdigest()
    return spec, hashlib.sha256(canonical_json(body)).hexdigest()


__all__ = ["TASK_SCHEMA", "Budgets", "Headline", "ParseError", "TaskSpec", "parse_task"]
