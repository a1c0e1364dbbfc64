"""The cgroup an OCI runtime's container is nested in, and the out-of-memory kills counted there.

Each sandbox's container gets a parent cgroup of the harness's own, ``/ale-oci/ale-<pid>-<hex>``
(``--cgroup-parent``; the engine makes it and the container's cgroup below it, with the
container's limits), so that the harness knows where the container's cgroup is whatever the
engine calls it, and can count what the kernel killed there after the engine removed it:

* **cgroup v2**: ``memory.events`` counts hierarchically, so the parent's ``oom_kill`` includes
  the container's kills, and it outlives the container's cgroup: read once the container ended.
* **cgroup v1**: the counter (``memory.oom_control``'s ``oom_kill``) is the container cgroup's
  own and goes with it, and the engine removes that cgroup as soon as the container exits. So a
  watcher (:meth:`SandboxCgroup.watch`) registers an eventfd on the container cgroup's
  ``memory.oom_control`` (``cgroup.event_control``) as soon as the cgroup appears, and reads the
  counter whenever the kernel signals an out-of-memory event and once a second; the count is the
  largest value read (a kill in the last instants before the cgroup goes can be missed).

:meth:`SandboxCgroup.destroy` removes the parent in every hierarchy (the engine's ``conmon``
child included) once the container is gone; :func:`sweep` removes what a harness that died left.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import time
from pathlib import Path

import attrs
import trio
import trio.lowlevel

from ale.runner import cgroups

BASE = "ale-oci"
WATCH_S = 1.0  # the v1 watcher reads the counter at least this often


@attrs.frozen
class Layout:
    """Where the engine makes containers' cgroups: v2 (one mount) or v1 (one mount a hierarchy)."""

    version: int
    mounts: tuple[Path, ...]  # every hierarchy the engine makes a container's cgroup in
    memory: Path  # the memory controller's mount

    def describe(self) -> dict[str, object]:
        if self.version == 2:
            return {"version": 2, "parents": {"unified": str(self.memory / BASE)}}
        by_name = {}
        for name in cgroups.CONTROLLERS:
            mount = next((m for m in self.mounts if name in m.name.split(",")), None)
            if mount is not None:
                by_name[name] = str(mount / BASE)
        return {"version": 1, "parents": by_name}


def layout() -> Layout:
    """The hierarchies on this machine: v1 when a v1 memory controller is mounted (engines then use
    v1), else the unified hierarchy; OSError when neither is there."""
    found = cgroups._mounts()
    v1 = [(Path(point), opts) for point, kind, opts in found if kind == "cgroup"]
    memory = next((point for point, opts in v1 if "memory" in opts), None)
    if memory is not None:  # runc makes the container's cgroup in a hybrid's unified hierarchy too
        return Layout(version=1, mounts=tuple(Path(point) for point, _kind, _opts in found), memory=memory)
    v2 = next((Path(point) for point, kind, _ in found if kind == "cgroup2"), None)
    if v2 is None:
        raise OSError("no cgroup hierarchy with the memory controller is mounted")
    return Layout(version=2, mounts=(v2,), memory=v2)


def _oom_kill(path: Path) -> int | None:
    """The ``oom_kill`` count of a memory.events or memory.oom_control file; None if unreadable."""
    try:
        text = path.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill":
            with contextlib.suppress(ValueError):
                return int(value)
    return None


@attrs.define
class SandboxCgroup:
    """One sandbox's parent cgroup (made by the engine, removed here)."""

    layout: Layout
    name: str = attrs.field(factory=lambda: f"ale-{os.getpid()}-{secrets.token_hex(4)}")
    seen: int = 0  # the largest v1 count read

    @property
    def parent(self) -> str:
        """The engine's ``--cgroup-parent``."""
        return f"/{BASE}/{self.name}"

    def _dirs(self) -> list[Path]:
        return [mount / BASE / self.name for mount in self.layout.mounts]

    def _container_dir(self) -> Path | None:
        """The container's memory cgroup below the parent (not the engine's ``conmon``)."""
        with contextlib.suppress(OSError):
            for child in (self.layout.memory / BASE / self.name).iterdir():
                if child.is_dir() and child.name != "conmon":
                    return child
        return None

    def _read_v1(self, folder: Path) -> None:
        count = _oom_kill(folder / "memory.oom_control")
        if count is not None:
            self.seen = max(self.seen, count)

    async def watch(self) -> None:
        """cgroup v1: keep :attr:`seen` up to date until cancelled (returns at once on v2)."""
        if self.layout.version == 2:
            return
        while (folder := self._container_dir()) is None:  # noqa: ASYNC110 - the engine makes it
            await trio.sleep(0.01)
        efd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        try:
            with contextlib.suppress(OSError):
                control = os.open(folder / "memory.oom_control", os.O_RDONLY | os.O_CLOEXEC)
                try:
                    (folder / "cgroup.event_control").write_text(f"{efd} {control}")
                finally:
                    os.close(control)
            while True:
                self._read_v1(folder)
                with trio.move_on_after(WATCH_S):
                    await trio.lowlevel.wait_readable(efd)
                    with contextlib.suppress(BlockingIOError):
                        os.eventfd_read(efd)
                    for pause in (0.0, 0.02, 0.1):  # the kernel signals before it kills
                        await trio.sleep(pause)
                        self._read_v1(folder)
        finally:
            trio.lowlevel.notify_closing(efd)
            os.close(efd)

    def finish(self) -> None:
        """cgroup v1: a last read while the container's cgroup may still be there."""
        if self.layout.version == 1 and (folder := self._container_dir()) is not None:
            self._read_v1(folder)

    def oom_kills(self) -> int:
        """Processes the kernel killed for the container's memory limit."""
        if self.layout.version == 2:
            return _oom_kill(self.layout.memory / BASE / self.name / "memory.events") or 0
        return self.seen

    def destroy(self, timeout_s: float = 10.0) -> None:
        """Remove the parent in every hierarchy, children first (the container must be gone;
        the engine's ``conmon`` may take a moment to leave its cgroup)."""
        deadline = time.monotonic() + timeout_s
        for top in self._dirs():
            _remove_tree(top, deadline)


def _remove_tree(top: Path, deadline: float) -> None:
    if not top.is_dir():
        return
    folders = sorted((Path(root) for root, _dirs, _files in os.walk(top)), key=lambda p: len(p.parts), reverse=True)
    for folder in folders:
        pause = 0.001
        while True:
            try:
                folder.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                if time.monotonic() > deadline:
                    return
                time.sleep(pause)
                pause = min(pause * 2, 0.05)


def sweep(where: Layout) -> list[Path]:
    """Remove the parents a harness that died left (``ale-<pid>-*`` of a pid that is gone)."""
    from ale.runner.sandbox_fs import pid_alive

    swept = []
    for mount in where.mounts:
        with contextlib.suppress(OSError):
            for child in (mount / BASE).iterdir():
                owner = re.fullmatch(r"ale-([0-9]+)-[0-9a-f]+", child.name)
                if owner is None or pid_alive(int(owner.group(1))):
                    continue
                _remove_tree(child, time.monotonic() + 1.0)
                if not child.exists():
                    swept.append(child)
    return swept
