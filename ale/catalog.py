"""The tasks and release manifests shipped with this installation (package data).

This is the I/O edge in front of :mod:`ale.core.tasks` and :mod:`ale.core.release`:
it reads the files, the core parses them.
"""

from __future__ import annotations

import functools
from importlib import resources
from typing import TYPE_CHECKING

import attrs

from ale.core.release import ReleaseManifest, parse_release
from ale.core.rubric import Rubric, parse_rubric

if TYPE_CHECKING:
    from ale.core.judge_input import TaskContext
from ale.core.tasks import TaskSpec, parse_task

DEFAULT_RELEASE = "2026.11"


class UnknownTaskError(LookupError):
    """No task of that id is installed."""


RUBRIC_FILE = "rubric.json"


@attrs.frozen
class Task:
    """A task definition with its paper, its faithfulness rubric (reproduction tasks) and digest."""

    spec: TaskSpec
    paper: str
    digest: str
    rubric: Rubric | None = None


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
        rubric_raw = (entry / RUBRIC_FILE).read_bytes() if (entry / RUBRIC_FILE).is_file() else None
        spec, digest = parse_task(raw, paper=paper, rubric=rubric_raw)
        if spec.id != entry.name:
            raise ValueError(f"task folder {entry.name!r} holds task {spec.id!r}")
        rubric = None if rubric_raw is None else parse_rubric(rubric_raw)
        if (rubric is not None) != (spec.genre == "reproduction") or (rubric is not None and rubric.task != spec.id):
            raise ValueError(f"task {spec.id!r}: a reproduction task ships its own {RUBRIC_FILE}, an open one none")
        found[spec.id] = Task(spec=spec, paper=paper.decode("utf-8"), digest=digest, rubric=rubric)
    return found


def get_task(task_id: str) -> Task:
    try:
        return tasks()[task_id]
    except KeyError:
        known = ", ".join(sorted(tasks())) or "none"
        raise UnknownTaskError(f"unknown task {task_id!r}; installed tasks: {known}") from None


def judge_context(task: Task) -> TaskContext:
    """What the judge input needs of a reproduction task: its definition, paper and rubric."""
    s = task.spec
    if task.rubric is None:
        raise ValueError(f"{s.ref} has no rubric: only reproduction tasks are judged")
    from ale.core.judge_input import TaskContext  # here: the evaluator loads the catalog, not the judge

    return TaskContext(s.ref, task.digest, s.title, s.genre, s.mode, task.paper, task.rubric)


def judge_contexts() -> dict[str, TaskContext]:
    """Every installed reproduction task's :func:`judge_context`, by ``id@version``."""
    return {t.spec.ref: judge_context(t) for t in tasks().values() if t.rubric is not None}


def release_bytes(name: str = DEFAULT_RELEASE) -> bytes:
    path = resources.files("ale") / "releases" / f"{name}.json"
    if not path.is_file():
        raise FileNotFoundError(f"no release manifest {name!r} is installed")
    return path.read_bytes()


#: The releases' images locks: ``releases/locks/<images_lock>`` (ale.core.release).
LOCKS = "locks"


def lock_bytes(file_name: str) -> bytes:
    """An installed release's images lock (the file its ``images_lock`` names)."""
    path = resources.files("ale") / "releases" / LOCKS / file_name
    if not path.is_file():
        raise FileNotFoundError(f"no images lock {file_name!r} is installed")
    return path.read_bytes()


def parse_installed_release(raw: bytes) -> tuple[ReleaseManifest, str]:
    """An installed release manifest's bytes, parsed with the installed lock it names."""
    return parse_release(raw, lock_bytes)


def release(name: str = DEFAULT_RELEASE) -> tuple[ReleaseManifest, str]:
    """The named installed release manifest (with its images lock) and its SHA-256."""
    return parse_installed_release(release_bytes(name))


def release_lock_path(name: str = DEFAULT_RELEASE) -> str | None:
    """Where the named installed release's images lock is on this machine (None: it pins no images)."""
    manifest, _ = release(name)
    if manifest.images_lock is None:
        return None
    return str(resources.files("ale") / "releases" / LOCKS / manifest.images_lock)
