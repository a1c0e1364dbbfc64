"""A uid of its own for each concurrent run of the local runtime (when the harness is root).

The range is :data:`FIRST_UID` .. ``FIRST_UID + COUNT - 1`` (1879048192 .. 1879113727): above
what Debian's adduser hands out (up to 59999, and 65536+ only on request) and past the uid ranges
systemd-nspawn gives containers (524288 .. 1879048191), so no account or container on the host
shares it. A run claims the lowest free uid with an exclusive ``flock`` on
``/run/ale-uids/<uid>.lock`` (released when the process ends, even by SIGKILL) and skips a uid
that still owns a process (a sandbox outliving a killed harness). Its sandboxes then have their
own ``RLIMIT_NPROC`` count, cannot signal another run's processes, and own no reserved blocks of
any filesystem.

Tasks that run side by side (``ale run --jobs N``) each get one (:class:`TaskUids`, keyed by the
task's workspace): the first the run's own, the others claimed the same way and kept for the
run's next tasks once theirs ended. Their workspaces are owned by that uid with mode 0700, so
one task's agent can neither read nor signal another's.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from collections.abc import Callable
from pathlib import Path

FIRST_UID = 1_879_048_192
COUNT = 65_536
LOCK_DIR = Path("/run/ale-uids")


class NoFreeUid(OSError):
    """Every uid of the range is held (an OSError: the harness's storage, not the agent's doing)."""


def _busy_uids() -> set[int]:
    """Uids that own a process now."""
    busy = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                busy.add(os.stat(f"/proc/{entry}").st_uid)
    return busy


class Claim:
    """A uid held for this process until :meth:`release` (or its exit)."""

    def __init__(self, uid: int, fd: int) -> None:
        self.uid = uid
        self._fd = fd

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __del__(self) -> None:
        self.release()


def claim(lock_dir: Path = LOCK_DIR) -> Claim:
    lock_dir.mkdir(mode=0o700, exist_ok=True)
    busy = _busy_uids()
    for uid in range(FIRST_UID, FIRST_UID + COUNT):
        if uid in busy:
            continue
        fd = os.open(lock_dir / f"{uid}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        return Claim(uid, fd)
    raise NoFreeUid(f"every uid from {FIRST_UID} to {FIRST_UID + COUNT - 1} is in use")


class TaskUids:
    """Each open workspace's uid (its task's): the run's own claim for one task, a claim of its own
    for each task that runs beside another (the claims of tasks that ended are kept for the next)."""

    def __init__(self, first: Claim, claimer: Callable[[], Claim] = claim) -> None:
        self.first = first
        self._claimer = claimer
        self._of: dict[Path, Claim] = {}
        self._spare: list[Claim] = []
        self._lock = threading.Lock()  # the run's tasks open their workspaces from worker threads

    def open(self, workspace: Path) -> int:
        """Claim a uid for the task of ``workspace`` (NoFreeUid when none is left), and return it."""
        with self._lock:
            if workspace in self._of:
                return self._of[workspace].uid
            taken = {c.uid for c in self._of.values()}
            if self.first.uid not in taken:
                found = self.first
            elif self._spare:
                found = self._spare.pop()
            else:
                found = self._claimer()
            self._of[workspace] = found
            return found.uid

    def uid_for(self, workspace: Path) -> int:
        """The uid of ``workspace``'s task (the run's own for a workspace not opened)."""
        with self._lock:
            found = self._of.get(workspace)
            return (found or self.first).uid

    def close(self, workspace: Path) -> None:
        with self._lock:
            found = self._of.pop(workspace, None)
            if found is not None and found is not self.first:
                self._spare.append(found)
