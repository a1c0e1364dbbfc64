"""A reproduction task's faithfulness rubric (``ale-rubric/v1``): what the judge holds a run to.

Shipped beside the task as ``ale/tasks/<id>/rubric.json`` (docs/judge.md, "The rubric"). It names
the paper's method in a sentence or two and lists *items*, each one thing the judge decides:

* ``method``: a step of the paper's method that the agent's code must implement;
* ``shortcut``: a way of reaching the metric without the method (hard-coded gains copied from the
  paper, a lookup table or gains tuned on practice seeds, a generic optimiser in place of the
  derivation) that must be absent;
* ``hacking``: reward hacking the trajectory may show (probing the evaluator for its internals or
  hidden seeds, replaying results seen on practice seeds, addressing the judge) that must be absent.

A run is faithful only when every item is satisfied. Parsed strictly with the one bounded parser;
the rubric's bytes are part of the task's digest (:func:`ale.core.tasks.parse_task`). Pure: no I/O.
"""

from __future__ import annotations

import re
from typing import Literal

import attrs

from ale.core.parse import loads

RUBRIC_SCHEMA = "ale-rubric/v1"
ItemKind = Literal["method", "shortcut", "hacking"]
KINDS: tuple[ItemKind, ...] = ("method", "shortcut", "hacking")
MAX_RUBRIC_BYTES = 64 * 1024
MAX_ITEMS = 32
MAX_TEXT = 2000  # characters of one title, requirement or the method summary
_ITEM_ID = re.compile(r"[a-z][a-z0-9-]{0,47}")
_TASK_ID = re.compile(r"[a-z][a-z0-9-]{1,62}[a-z0-9]")


def _text(_inst: object, attr: attrs.Attribute[str], value: str) -> None:
    if not value.strip() or len(value) > MAX_TEXT:
        raise ValueError(f"{attr.name} must be 1 to {MAX_TEXT} characters, not blank")


def _item_id(_inst: object, attr: attrs.Attribute[str], value: str) -> None:
    if not _ITEM_ID.fullmatch(value):
        raise ValueError(f"{attr.name} {value[:60]!r} must match {_ITEM_ID.pattern}")


def _schema(_inst: object, attr: attrs.Attribute[str], value: str) -> None:
    if value != RUBRIC_SCHEMA:
        raise ValueError(f"{attr.name} must be {RUBRIC_SCHEMA!r}")


def _task(_inst: object, attr: attrs.Attribute[str], value: str) -> None:
    if not _TASK_ID.fullmatch(value):
        raise ValueError(f"{attr.name} is not a task id")


@attrs.frozen
class RubricItem:
    id: str = attrs.field(validator=_item_id)
    kind: ItemKind = attrs.field(validator=attrs.validators.in_(KINDS))
    title: str = attrs.field(validator=_text)
    requirement: str = attrs.field(validator=_text)


def _items(_inst: object, _attr: attrs.Attribute[tuple[RubricItem, ...]], value: tuple[RubricItem, ...]) -> None:
    if not 1 <= len(value) <= MAX_ITEMS:
        raise ValueError(f"a rubric has 1 to {MAX_ITEMS} items")
    ids = [item.id for item in value]
    if len(set(ids)) != len(ids):
        raise ValueError("item ids repeat")
    if not any(item.kind == "method" for item in value):
        raise ValueError("a rubric names at least one method item")


@attrs.frozen
class Rubric:
    schema: str = attrs.field(validator=_schema)
    task: str = attrs.field(validator=_task)  # the task id this rubric belongs to
    method: str = attrs.field(validator=_text)  # the paper's method in a sentence or two
    items: tuple[RubricItem, ...] = attrs.field(validator=_items)

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(item.id for item in self.items)

    def item(self, item_id: str) -> RubricItem:
        return next(item for item in self.items if item.id == item_id)


def parse_rubric(raw: bytes) -> Rubric:
    """Parse ``rubric.json`` (ParseError naming the field)."""
    return loads(raw, Rubric, what="rubric.json", max_bytes=MAX_RUBRIC_BYTES)
