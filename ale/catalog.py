"""The tasks and release manifests shipped with this installation (package data).

This is the I/O edge in front of :mod:`ale.core.tasks` and :mod:`ale.core.release`:
it reads the files, the core parses them.
"""

from __future__ import annotations

import functools
from importlib import resources

import attrs

from ale.core.release import ReleaseManifest, parse_release
from ale.core.tasks import TaskSpec, parse_task

DEFAULT_RELEASE = "2026.11"


class UnknownTaskError(LookupError):
    """No task of that id is installed."""


@attrs.frozen
class Task:
    """A task definition with its paper and digest."""

    spec: TaskSpec
    paper: str
    digest: str


@functools.cache
def tasks() -> dict[str, Task]:
    """Every installed task by id, parsed strictly (a broken file fails loudly)."""
    found: dict[str, Task] = {}
    root = resources.files("ale") / "tasks"
    for entry in sorted(root.iterdir(), key=lambda e: e.name):
        if not entry.is_dir() or not (entry / "task.json").is_file():
            continue
        raw = (entry / "task.json").read_bytes()
        spec, _ = parse_task(raw, paper=b"")
        paper = (entry / spec.paper).read_bytes()
        spec, digest = parse_task(raw, paper=paper)
        if spec.id != entry.name:
            raise ValueError(f"task folder {entry.name!r} holds task {spec.id!r}")
        found[spec.id] = Task(spec=spec, paper=paper.decode("utf-8"), digest=digest)
    return found


def get_task(task_id: str) -> Task:
    try:
        return tasks()[task_id]
    except KeyError:
        known = ", ".join(sorted(tasks())) or "none"
        raise UnknownTaskError(f"unknown task {task_id!r}; installed tasks: {known}") from None


def release_bytes(name: str = DEFAULT_RELEASE) -> bytes:
    path = resources.files("ale") / "releases" / f"{name}.json"
    if not path.is_file():
        raise FileNotFoundError(f"no release manifest {name!r} is installed")
    return path.read_bytes()


def release(name: str = DEFAULT_RELEASE) -> tuple[ReleaseManifest, str]:
    """The named installed release manifest and its SHA-256."""
    return parse_release(release_bytes(name))
