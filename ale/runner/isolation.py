"""The isolation the local runtime puts around each sandbox, and what of it this machine provides.

:func:`probe` (the runtime's ``check()``) finds each facility in force or missing with a
reason; :meth:`Isolation.describe` is what the bundle manifest records (``runtime.isolation``),
so a run on a machine without one says so instead of running weaker in silence:

* ``seccomp``: the system-call filter (:mod:`ale.runner.seccomp`);
* ``cgroup``: one cgroup per sandbox with memory, pids and CPU limits (:mod:`ale.runner.cgroups`);
* ``uid``: a uid of the run's own (:mod:`ale.runner.uids`), as root, and one more for each task that runs
  beside another (:meth:`Isolation.uid_for`);
* ``filesystems``: workspace and /tmp on size- and inode-limited tmpfs (:mod:`ale.runner.sandbox_fs`).

:meth:`Isolation.open_sandbox` makes one sandbox's cgroup and /tmp and removes them after;
:meth:`Isolation.open_workspace` gives a task's workspace its filesystem.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import trio

from ale.runner import cgroups, sandbox_fs, seccomp, uids
from ale.runner.runtime import Limits, SandboxError, SandboxSpec
from ale.runner.sandbox import SANDBOX_UID


@attrs.frozen
class SandboxResources:
    """What one sandbox gets: the keyword arguments of :func:`ale.runner.sandbox.bwrap_argv`."""

    uid: int
    tmp_dir: Path | None
    cgroup: cgroups.Cgroup | None

    def argv_kwargs(self) -> dict[str, Any]:
        return {
            "uid": self.uid,
            "tmp_dir": self.tmp_dir,
            "cgroup_procs": self.cgroup.procs_files if self.cgroup is not None else (),
        }


@attrs.define
class Isolation:
    filter: seccomp.Filter | None
    hierarchy: cgroups.Hierarchy | None
    mounts: bool  # may mount tmpfs (root)
    uid_claim: uids.Claim | None
    missing: dict[str, str] = attrs.field(factory=dict)  # facility -> why it is not in force
    _workspaces: set[Path] = attrs.field(factory=set)
    _uids: uids.TaskUids | None = None  # each open workspace's uid (its task's)

    @property
    def uid(self) -> int:
        return self.uid_claim.uid if self.uid_claim is not None else SANDBOX_UID

    @property
    def _task_uids(self) -> uids.TaskUids | None:
        if self.uid_claim is None:
            return None
        if self._uids is None:
            self._uids = uids.TaskUids(self.uid_claim)
        return self._uids

    def uid_for(self, workspace: Path) -> int:
        """The uid of the sandboxes of the task whose workspace this is: each task that runs beside
        another has a uid of its own (its RLIMIT_NPROC count, its files), the run's first one's."""
        pool = self._task_uids
        return pool.uid_for(workspace) if pool is not None else self.uid

    def _claim(self, workspace: Path) -> None:
        if (pool := self._task_uids) is not None:
            pool.open(workspace)

    def _unclaim(self, workspace: Path) -> None:
        if (pool := self._task_uids) is not None:
            pool.close(workspace)

    def describe(self) -> dict[str, Any]:
        def entry(name: str, details: dict[str, Any] | None) -> dict[str, Any]:
            if details is None:
                return {"in_force": False, "reason": self.missing[name], "details": None}
            return {"in_force": True, "reason": None, "details": details}

        return {
            "seccomp": entry("seccomp", self.filter.describe() if self.filter is not None else None),
            "cgroup": entry("cgroup", self.hierarchy.describe() if self.hierarchy is not None else None),
            "uid": entry(
                "uid",
                {"range": [uids.FIRST_UID, uids.FIRST_UID + uids.COUNT - 1]} if self.uid_claim is not None else None,
            ),
            "filesystems": entry(
                "filesystems",
                {"kind": "tmpfs", "bytes_per_inode": sandbox_fs.BYTES_PER_INODE} if self.mounts else None,
            ),
        }

    @asynccontextmanager
    async def open_sandbox(self, spec: SandboxSpec) -> AsyncIterator[SandboxResources]:
        """The sandbox's cgroup and /tmp for as long as it runs; removed (its processes killed) after."""
        cg = None
        tmp_dir = None
        try:
            with _as_sandbox_error():
                cg, tmp_dir = self._make(spec)
            yield SandboxResources(uid=self.uid_for(spec.workspace), tmp_dir=tmp_dir, cgroup=cg)
        finally:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(self._release, cg, tmp_dir)

    def _make(self, spec: SandboxSpec) -> tuple[cgroups.Cgroup | None, Path | None]:
        lim = spec.limits
        cg = tmp_dir = None
        try:
            if self.hierarchy is not None:
                cg = cgroups.create(
                    self.hierarchy,
                    f"ale-{os.getpid()}-{secrets.token_hex(6)}",
                    cgroups.CgroupLimits(memory_bytes=lim.sandbox_memory_bytes, pids=lim.processes, cpus=lim.cpus),
                )
            if self.mounts:
                tmp_dir = Path(tempfile.mkdtemp(prefix="ale-tmp-"))
                sandbox_fs.mount_tmpfs(
                    tmp_dir,
                    size_bytes=lim.tmp_bytes,
                    inodes=sandbox_fs.inodes_for(lim.tmp_bytes),
                    uid=self.uid_for(spec.workspace),
                    mode=0o1777,
                )
            if self.uid_claim is not None and spec.workspace_writable and spec.workspace not in self._workspaces:
                uid = self.uid_for(spec.workspace)
                os.chown(spec.workspace, uid, uid)  # a host folder the harness made for nobody
                os.chmod(spec.workspace, 0o700)  # its task's alone
        except BaseException:
            self._release(cg, tmp_dir)
            raise
        return cg, tmp_dir

    @staticmethod
    def _release(cg: cgroups.Cgroup | None, tmp_dir: Path | None) -> None:
        if cg is not None:
            cg.destroy()
        if tmp_dir is not None:
            with contextlib.suppress(OSError):
                sandbox_fs.unmount(tmp_dir)
            with contextlib.suppress(OSError):
                tmp_dir.rmdir()

    @asynccontextmanager
    async def open_workspace(self, workspace: Path, limits: Limits) -> AsyncIterator[None]:
        """The task's workspace on its own tmpfs (size and inodes limited) while the context lasts,
        owned by the task's uid (:meth:`uid_for`)."""
        await trio.to_thread.run_sync(self._claim, workspace)
        try:
            if not self.mounts:
                yield
                return
            sandbox_fs.mount_tmpfs(
                workspace,
                size_bytes=limits.workspace_bytes,
                inodes=sandbox_fs.inodes_for(limits.workspace_bytes),
                uid=self.uid_for(workspace),
                mode=0o700,  # its task's alone: a task beside it runs as another uid
            )
            self._workspaces.add(workspace)
            try:
                yield
            finally:
                self._workspaces.discard(workspace)
                sandbox_fs.unmount(workspace)
        finally:
            self._unclaim(workspace)


@contextlib.contextmanager
def _as_sandbox_error() -> Iterator[None]:
    try:
        yield
    except OSError as exc:
        raise SandboxError(f"cannot set up the sandbox's cgroup or /tmp: {exc}") from None


def _probe_seccomp(bwrap: str) -> tuple[seccomp.Filter | None, str]:
    try:
        flt = seccomp.build()
    except seccomp.SeccompUnavailable as exc:
        return None, str(exc)
    fd = seccomp.program_fd(flt)
    try:
        probe = subprocess.run(
            [bwrap, "--ro-bind", "/", "/", "--seccomp", str(fd), "--", "true"],
            capture_output=True,
            timeout=30,
            pass_fds=(fd,),
        )
    finally:
        os.close(fd)
    if probe.returncode != 0:
        return None, f"bubblewrap could not install the filter: {probe.stderr.decode(errors='replace').strip()}"
    return flt, ""


def probe(bwrap: str = "bwrap") -> Isolation:
    """Probe every facility (after :func:`ale.runner.sandbox.detect` found bubblewrap working)."""
    missing: dict[str, str] = {}
    flt, why = _probe_seccomp(bwrap)
    if flt is None:
        missing["seccomp"] = why
    hierarchy = None
    try:
        hierarchy = cgroups.probe()
        cgroups.sweep(hierarchy)  # what a harness killed mid-run left
    except (cgroups.CgroupUnavailable, OSError) as exc:
        missing["cgroup"] = f"{exc}; memory, processes and CPU are limited per process only (rlimits)"
    why = sandbox_fs.can_mount()
    if why:
        missing["filesystems"] = f"{why}; /tmp is bubblewrap's --size tmpfs, the workspace a watched host folder"
    else:
        sandbox_fs.sweep()
    claim = None
    if os.geteuid() != 0:
        missing["uid"] = "not root: every sandbox runs as the invoking user in a user namespace"
    else:
        try:
            claim = uids.claim()
        except (uids.NoFreeUid, OSError) as exc:
            missing["uid"] = f"{exc}; sandboxes run as nobody ({SANDBOX_UID})"
    return Isolation(filter=flt, hierarchy=hierarchy, mounts=not why, uid_claim=claim, missing=missing)
