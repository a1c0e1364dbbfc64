"""How many of a run's tasks run at once (``ale run --jobs N``): the admission rule.

A task *demands* what its agent's sandbox may take, its :class:`~ale.runner.runtime.Limits`:
``cpus`` (the sandbox cgroup's CPU quota) and ``sandbox_memory_bytes`` (its memory limit). The
machine *offers* the CPUs this process may run on (its affinity mask) and its memory (MemTotal, or
the harness's own cgroup limit when lower). A task starts, in task order, when

* fewer than ``jobs`` tasks run, and
* the demands of the running tasks and its own fit the offer, both CPUs and memory,

or when no task runs at all (a task that alone demands more than the machine offers still runs,
one at a time, as a run of one task always did). The evaluators are not counted: they step only
when asked and the agent's sandbox is what a task can fill. docs/decisions.md says why.
"""

from __future__ import annotations

import os
from pathlib import Path

import attrs
import trio

from ale.runner.runtime import Limits

GIB = 1024**3


@attrs.frozen
class Demand:
    cpus: float
    memory_bytes: int

    @classmethod
    def of(cls, limits: Limits) -> Demand:
        return cls(float(limits.cpus), int(limits.sandbox_memory_bytes))


@attrs.frozen
class Machine:
    cpus: float
    memory_bytes: int

    def describe(self) -> str:
        return f"{self.cpus:g} CPUs, {self.memory_bytes / GIB:.1f} GiB"


def _cgroup_memory_limit() -> int | None:
    """The memory limit of this process's cgroup (v2 ``memory.max``, v1 ``memory.limit_in_bytes``)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if hierarchy == "0":
            candidates = [Path("/sys/fs/cgroup") / path.lstrip("/") / "memory.max"]
        elif "memory" in controllers.split(","):
            candidates = [Path("/sys/fs/cgroup/memory") / path.lstrip("/") / "memory.limit_in_bytes"]
        else:
            continue
        for candidate in candidates:
            try:
                text = candidate.read_text().strip()
            except OSError:
                continue
            if text.isdigit():
                return int(text)
    return None


def machine() -> Machine:
    """What this machine offers the run's tasks."""
    try:
        cpus = float(len(os.sched_getaffinity(0)))
    except OSError:  # pragma: no cover - Linux always has it
        cpus = float(os.cpu_count() or 1)
    memory = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory = int(line.split()[1]) * 1024
                break
    except (OSError, ValueError, IndexError):
        memory = 0
    limit = _cgroup_memory_limit()
    if limit is not None and (memory == 0 or limit < memory):
        memory = limit
    return Machine(cpus, memory or 1 << 62)


def fits(running: list[Demand], demand: Demand, jobs: int, offer: Machine) -> bool:
    """The admission rule (the module's docstring)."""
    if not running:
        return True
    if len(running) >= jobs:
        return False
    cpus = sum(d.cpus for d in running) + demand.cpus
    memory = sum(d.memory_bytes for d in running) + demand.memory_bytes
    return cpus <= offer.cpus + 1e-9 and memory <= offer.memory_bytes


def concurrency(jobs: int, tasks: int, demand: Demand, offer: Machine) -> int:
    """How many of ``tasks`` tasks, each demanding ``demand``, can run at once under the rule."""
    running: list[Demand] = []
    while len(running) < tasks and fits(running, demand, jobs, offer):
        running.append(demand)
    return max(1, len(running))


class Admission:
    """Tasks wait here until the rule lets them start; :meth:`leave` needs no await (it runs in
    cleanup, cancelled or not)."""

    def __init__(self, jobs: int, offer: Machine) -> None:
        if jobs < 1:
            raise ValueError("jobs must be at least 1")
        self.jobs, self.offer = jobs, offer
        self.running: list[Demand] = []
        self._changed = trio.Event()
        self.most = 0  # the most tasks that ran at once

    async def enter(self, demand: Demand) -> None:
        while not fits(self.running, demand, self.jobs, self.offer):
            await self._changed.wait()
        self.running.append(demand)
        self.most = max(self.most, len(self.running))

    def leave(self, demand: Demand) -> None:
        self.running.remove(demand)
        self._changed.set()
        self._changed = trio.Event()
