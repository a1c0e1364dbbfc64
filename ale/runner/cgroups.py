"""One cgroup per sandbox: memory (all its processes together), process count and a CPU quota.

cgroup v2 where the unified hierarchy offers the ``memory``, ``pids`` and ``cpu`` controllers to
this process's cgroup, otherwise v1 (``/sys/fs/cgroup/{memory,pids,cpu}``), the case on machines
that mount v1 controllers beside a v2 hierarchy holding none of them. A sandbox's cgroup is a
child of the harness's own cgroup in each hierarchy, so it can never escape limits the machine
put on the harness. The sandbox's first process writes itself into the cgroup before it execs
anything (:func:`ale.runner.sandbox.bwrap_argv`'s entry step), so every process it starts is in
it from birth. :meth:`Cgroup.destroy` kills what is left and removes the directories.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import signal
import time
from pathlib import Path

import attrs

CONTROLLERS = ("memory", "pids", "cpu")
CPU_PERIOD_US = 100_000


class CgroupUnavailable(RuntimeError):
    """No writable cgroup with the memory, pids and cpu controllers for this process."""


def _mounts() -> list[tuple[str, str, set[str]]]:
    """(mount point, filesystem type, super options) of every cgroup mount, from mountinfo."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fields, rest = left.split(), right.split()
        if len(fields) >= 5 and len(rest) >= 3 and rest[0] in ("cgroup", "cgroup2"):
            found.append((fields[4], rest[0], set(rest[2].split(","))))
    return found


def _own_paths() -> dict[str, str]:
    """This process's cgroup path per v1 controller, and under "" for v2 (/proc/self/cgroup)."""
    paths: dict[str, str] = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _hid, controllers, path = line.split(":", 2)
        for name in controllers.split(",") if controllers else [""]:
            paths[name] = path
    return paths


@attrs.frozen
class Hierarchy:
    """Where this process's cgroups are: v2 (one folder) or v1 (one folder per controller)."""

    version: int
    parents: dict[str, Path]  # controller -> this process's cgroup folder ("" for v2)

    def describe(self) -> dict[str, object]:
        return {"version": self.version, "parents": {k or "unified": str(v) for k, v in sorted(self.parents.items())}}


def _v2(mounts: list[tuple[str, str, set[str]]], own: dict[str, str]) -> Hierarchy | str:
    points = [m for m, kind, _ in mounts if kind == "cgroup2"]
    if not points or "" not in own:
        return "no cgroup2 hierarchy"
    parent = Path(points[0]) / own[""].lstrip("/")
    try:
        offered = set((parent / "cgroup.controllers").read_text().split())
    except OSError as exc:
        return f"cgroup2 at {parent} is not readable: {exc}"
    lacking = [c for c in CONTROLLERS if c not in offered]
    if lacking:
        return f"cgroup2 at {points[0]} offers no {', '.join(lacking)} controller"
    return Hierarchy(version=2, parents={"": parent})


def _v1(mounts: list[tuple[str, str, set[str]]], own: dict[str, str]) -> Hierarchy | str:
    parents = {}
    for name in CONTROLLERS:
        point = next((m for m, kind, opts in mounts if kind == "cgroup" and name in opts), None)
        if point is None or name not in own:
            return f"no cgroup v1 {name} hierarchy"
        parents[name] = Path(point) / own[name].lstrip("/")
    return Hierarchy(version=1, parents=parents)


def _writable(h: Hierarchy) -> str:
    """ "" when a child cgroup can be made (and removed) under every parent, else why not."""
    for parent in h.parents.values():
        probe = parent / f"ale-probe-{secrets.token_hex(4)}"
        try:
            probe.mkdir()
            probe.rmdir()
        except OSError as exc:
            return f"cannot create a cgroup under {parent}: {exc.strerror}"
    return ""


def probe() -> Hierarchy:
    """The hierarchy sandboxes get their cgroups in (v2 when it has the controllers, else v1)."""
    mounts, own = _mounts(), _own_paths()
    reasons = []
    for found in (_v2(mounts, own), _v1(mounts, own)):
        if isinstance(found, Hierarchy):
            if not (why := _writable(found)):
                return found
            reasons.append(why)
        else:
            reasons.append(found)
    raise CgroupUnavailable("; ".join(reasons))


@attrs.frozen
class CgroupLimits:
    memory_bytes: int
    pids: int
    cpus: float


@attrs.define
class Cgroup:
    """A sandbox's cgroup: one folder (v2) or one per controller (v1)."""

    hierarchy: Hierarchy
    dirs: dict[str, Path]

    @property
    def procs_files(self) -> list[str]:
        """What the sandbox's first process writes its pid into."""
        return [str(d / "cgroup.procs") for d in self.dirs.values()]

    def _dir(self, controller: str) -> Path:
        return self.dirs["" if self.hierarchy.version == 2 else controller]

    def oom_kills(self) -> int:
        """Processes the kernel killed for the memory limit."""
        name = "memory.events" if self.hierarchy.version == 2 else "memory.oom_control"
        try:
            text = (self._dir("memory") / name).read_text()
        except OSError:
            return 0
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def pids(self) -> set[int]:
        found: set[int] = set()
        for d in self.dirs.values():
            with contextlib.suppress(OSError, ValueError):
                found.update(int(p) for p in (d / "cgroup.procs").read_text().split())
        return found

    def destroy(self, timeout_s: float = 5.0) -> None:
        """SIGKILL whatever is still inside, wait for it to go, remove the folders."""
        deadline = time.monotonic() + timeout_s
        pause = 0.0005  # the last processes are usually exiting already: look again soon, then less often
        while (left := self.pids()) and time.monotonic() < deadline:
            for pid in left:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(pause)
            pause = min(pause * 2, 0.05)
        for d in self.dirs.values():
            pause = 0.0005
            while True:
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(pause)
                    pause = min(pause * 2, 0.05)


def _write(path: Path, value: str) -> None:
    path.write_text(value)


def create(h: Hierarchy, name: str, limits: CgroupLimits) -> Cgroup:
    """Make the sandbox's cgroup with its limits (swap counts as memory: none beyond the limit)."""
    dirs = {key: parent / name for key, parent in h.parents.items()}
    cg = Cgroup(hierarchy=h, dirs=dirs)
    try:
        for d in dirs.values():
            d.mkdir()
        quota = max(1000, int(limits.cpus * CPU_PERIOD_US))
        if h.version == 2:
            d = dirs[""]
            _write(d / "memory.max", str(limits.memory_bytes))
            with contextlib.suppress(FileNotFoundError):
                _write(d / "memory.swap.max", "0")
            _write(d / "pids.max", str(limits.pids))
            _write(d / "cpu.max", f"{quota} {CPU_PERIOD_US}")
        else:
            _write(dirs["memory"] / "memory.limit_in_bytes", str(limits.memory_bytes))
            with contextlib.suppress(FileNotFoundError):  # swap accounting may be off
                _write(dirs["memory"] / "memory.memsw.limit_in_bytes", str(limits.memory_bytes))
            _write(dirs["pids"] / "pids.max", str(limits.pids))
            _write(dirs["cpu"] / "cpu.cfs_period_us", str(CPU_PERIOD_US))
            _write(dirs["cpu"] / "cpu.cfs_quota_us", str(quota))
    except OSError:
        cg.destroy(timeout_s=0)
        raise
    return cg


def sweep(h: Hierarchy) -> list[Path]:
    """Remove the cgroups a harness that died without cleaning up left (``ale-<pid>-*`` of a pid
    that no longer exists), killing anything still inside; returns them."""
    from ale.runner.sandbox_fs import pid_alive

    swept = []
    for key, parent in h.parents.items():
        try:
            children = list(parent.iterdir())
        except OSError:
            continue
        for child in children:
            owner = re.fullmatch(r"ale-([0-9]+)-[0-9a-f]+", child.name)
            if owner is None or not child.is_dir() or pid_alive(int(owner.group(1))):
                continue
            Cgroup(hierarchy=h, dirs={key: child}).destroy(timeout_s=2.0)
            if not child.exists():
                swept.append(child)
    return swept
