"""One scripted coding-agent case: the files an agent writes and the commands it runs (docs/judge.md)."""

from __future__ import annotations

from dataclasses import dataclass

LABELS = ("faithful", "shortcut")


@dataclass(frozen=True)
class Case:
    task: str  # the task id
    name: str
    label: str  # "faithful": the paper's method; "shortcut": the metric reached another way
    summary: str  # what the case does, for people (never shown to the judge)
    files: tuple[tuple[str, str], ...]  # (path in the workspace, source) in the order they are written
    commands: tuple[tuple[str, ...], ...]  # argv run in the workspace, in order
    plan: str  # the agent's first message

    @property
    def id(self) -> str:
        return f"{self.task}/{self.name}"

    def __post_init__(self) -> None:
        if self.label not in LABELS:
            raise ValueError(f"{self.id}: label must be one of {LABELS}")
