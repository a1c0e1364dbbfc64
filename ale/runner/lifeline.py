"""Children that cannot outlive the harness, and a sweep of what a killed harness left anyway.

Every process the harness starts for a run (an evaluator, a sandbox, an LLM gateway) is started
by :func:`popen` (blocking) or :func:`open_process` (Trio), which

* fork it from one thread of the harness's (the *spawner*, started on first use, which lives as
  long as the process), and have the child ask the kernel for ``SIGKILL`` on that thread's death
  (``prctl(PR_SET_PDEATHSIG)``, before it execs; a child whose parent is already gone exits at
  once). The parent-death signal follows the thread that forked, so it must not be a worker
  thread that ends when idle; the spawner never ends. A harness killed with SIGKILL so takes its
  evaluators and gateways with it; a sandbox's first process (timeout(1)) dies with it, bwrap
  (``--die-with-parent``) with that, and the sandbox's PID namespace with bwrap;
* record it in the harness's *ledger* (:class:`Ledger`): ``LEDGER_DIR/<pid>-<start>.jsonl``, one
  JSON line per child (``pid``, ``start``: its start time in clock ticks since boot, from
  ``/proc/PID/stat``, and ``group``: it leads a process group of its own) and per run folder
  (``folder``). The harness holds an exclusive ``flock`` on its ledger while it lives (the kernel
  drops it when the process ends, even by SIGKILL) and removes it when it exits.

:func:`sweep` (run by ``ale run`` before it starts or resumes a run) reads every ledger nobody
holds: each recorded child still running with its recorded start time (not a later process that
reuses the pid) is killed (``SIGKILL``, its whole group where it led one), then the harness's
leftover tmpfs mounts are detached and its run folders removed, then the ledger.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import contextlib
import ctypes
import fcntl
import json
import os
import queue
import secrets
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import attrs
import trio
import trio.lowlevel

from ale.core.parse import ParseError, parse_json

PR_SET_PDEATHSIG = 1
MAX_LEDGER = 4 * 1024 * 1024  # a ledger's lines: a few per task

_T = TypeVar("_T")


def ledger_dir() -> Path:
    """``/run/ale-runs`` for root, else ``$XDG_RUNTIME_DIR/ale-runs`` (or ``/tmp/ale-runs-UID``)."""
    if os.geteuid() == 0:
        return Path("/run/ale-runs")
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    return Path(runtime) / "ale-runs" if runtime else Path(tempfile.gettempdir()) / f"ale-runs-{os.geteuid()}"


def _private_dir(folder: Path) -> Path | None:
    """``folder``, made if missing; None unless it is this user's own and private (0700)."""
    with contextlib.suppress(FileExistsError, FileNotFoundError):
        folder.mkdir(mode=0o700)
    try:
        info = folder.lstat()
    except OSError:
        return None
    if not os.path.isdir(folder) or folder.is_symlink() or info.st_uid != os.geteuid() or info.st_mode & 0o077:
        return None
    return folder


def start_time(pid: int) -> int | None:
    """The process's start time (clock ticks since boot, ``/proc/PID/stat`` field 22), or None."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    fields = raw[raw.rfind(b")") + 2 :].split()  # past the command's name, which may hold anything
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


# -- the parent-death signal, from a thread that lives as long as the harness --------------------------

_libc = ctypes.CDLL(None, use_errno=True)
_prctl = _libc.prctl
_prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
_prctl.restype = ctypes.c_int


def _die_with(parent: int) -> Callable[[], None]:
    """The child's last step before exec: SIGKILL when the forking thread dies; exit if it did."""

    def preexec() -> None:
        if _prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            os._exit(127)
        if os.getppid() != parent:  # the harness died between fork and prctl
            os._exit(127)

    return preexec


class _Spawner:
    """The one thread that forks the harness's children (so their parent-death signal follows a
    thread that never ends)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], concurrent.futures.Future[Any]]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._pid = -1

    def call(self, job: Callable[[], _T]) -> _T:
        with self._lock:
            if self._thread is None or self._pid != os.getpid():  # none yet, or a forked copy of the harness
                self._jobs = queue.SimpleQueue()
                self._thread = threading.Thread(target=self._serve, args=(self._jobs,), name="ale-spawner", daemon=True)
                self._pid = os.getpid()
                self._thread.start()
            if threading.current_thread() is self._thread:
                return job()
            future: concurrent.futures.Future[_T] = concurrent.futures.Future()
            self._jobs.put((job, future))
        return future.result()

    @staticmethod
    def _serve(jobs: queue.SimpleQueue[tuple[Callable[[], Any], concurrent.futures.Future[Any]]]) -> None:
        while True:
            job, future = jobs.get()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(job())
            except BaseException as exc:  # handed to the caller
                future.set_exception(exc)


_SPAWNER = _Spawner()


def popen(argv: Sequence[str], **options: Any) -> subprocess.Popen[bytes]:
    """``subprocess.Popen(argv, **options)`` as a child that dies with the harness, recorded in its
    ledger. ``preexec_fn`` is this module's; the other options are Popen's."""
    if "preexec_fn" in options:
        raise TypeError("popen sets the child's preexec_fn itself")
    parent = os.getpid()

    def start() -> subprocess.Popen[bytes]:
        return subprocess.Popen(list(argv), preexec_fn=_die_with(parent), **options)

    process = _SPAWNER.call(start)
    ledger().child(process.pid, group=bool(options.get("start_new_session")))
    return process


# -- a child as Trio sees it ------------------------------------------------------------------------------


async def wait_popen(popen: subprocess.Popen[bytes]) -> int:
    """Wait for a child started with subprocess without blocking the Trio loop: on a pidfd."""
    if (status := popen.poll()) is not None:
        return status
    try:
        pidfd = os.pidfd_open(popen.pid)  # ours and unreaped until poll() reaps it
    except ProcessLookupError:
        return popen.wait()
    try:
        while (status := popen.poll()) is None:
            await trio.lowlevel.wait_readable(pidfd)
    finally:
        os.close(pidfd)
    return status


@attrs.define(eq=False)
class Child:
    """A child started by :func:`open_process`: its output as Trio streams, waited for by pidfd."""

    popen: subprocess.Popen[bytes]
    stdout: trio.lowlevel.FdStream | None
    stderr: trio.lowlevel.FdStream | None

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def returncode(self) -> int | None:
        return self.popen.poll()

    async def wait(self) -> int:
        return await wait_popen(self.popen)

    def send_signal(self, sig: int) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _stream(file: Any) -> trio.lowlevel.FdStream | None:
    if file is None:
        return None
    stream = trio.lowlevel.FdStream(os.dup(file.fileno()))
    file.close()
    return stream


async def open_process(argv: Sequence[str], **options: Any) -> Child:
    """:func:`popen` for Trio (the fork runs on the spawner thread; the loop never blocks)."""
    process = await trio.to_thread.run_sync(lambda: popen(argv, **options))
    return Child(process, _stream(process.stdout), _stream(process.stderr))


# -- the ledger ------------------------------------------------------------------------------------------


class Ledger:
    """This process's ledger: held (flock) while it lives, removed when it exits."""

    def __init__(self, folder: Path | None) -> None:
        self.path: Path | None = None
        self._fd = -1
        if folder is None:
            return  # no private folder for it: children still die with the harness, nothing is recorded
        path = folder / f"{os.getpid()}-{start_time(os.getpid()) or 0}.jsonl"
        # locked under a name no sweep reads, then renamed into place: a sweep never sees it unheld
        tmp = folder / f".{path.name}.{secrets.token_hex(4)}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC, 0o600)
        except OSError:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.replace(tmp, path)
        except OSError:
            os.close(fd)
            with contextlib.suppress(OSError):
                tmp.unlink()
            return
        self.path, self._fd = path, fd
        atexit.register(self.close)

    def _write(self, entry: dict[str, Any]) -> None:
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.write(self._fd, json.dumps(entry).encode() + b"\n")

    def child(self, pid: int, *, group: bool) -> None:
        start = start_time(pid)
        if start is not None:
            self._write({"pid": pid, "start": start, "group": group})

    def folder(self, path: Path) -> None:
        """A run folder of this harness's: a sweep removes it once the harness is gone."""
        self._write({"folder": str(path)})

    def close(self) -> None:
        if self._fd >= 0 and self.path is not None:
            with contextlib.suppress(OSError):
                self.path.unlink()
            os.close(self._fd)
            self._fd = -1


_LEDGER: Ledger | None = None
_LEDGER_LOCK = threading.Lock()


def ledger() -> Ledger:
    global _LEDGER
    with _LEDGER_LOCK:
        if _LEDGER is None or (_LEDGER.path is not None and not _LEDGER.path.name.startswith(f"{os.getpid()}-")):
            _LEDGER = Ledger(_private_dir(ledger_dir()))
        return _LEDGER


@attrs.frozen
class Swept:
    killed: list[int]
    folders: list[str]


def _entries(raw: bytes) -> list[dict[str, Any]]:
    entries = []
    for line in raw.splitlines():
        try:
            entry = parse_json(line, what="a ledger line", max_bytes=64 * 1024, max_depth=2)
        except ParseError:
            continue  # a line torn by the kill
        if isinstance(entry, dict):
            entries.append(entry)
    return entries


def _kill(entry: dict[str, Any]) -> int | None:
    pid, start = entry.get("pid"), entry.get("start")
    if type(pid) is not int or type(start) is not int or pid <= 1 or start_time(pid) != start:
        return None  # gone, or the pid is another process's now
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if entry.get("group") is True and os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGKILL)
        os.kill(pid, signal.SIGKILL)
    return pid


def _wait_gone(pids: list[int], timeout_s: float = 10.0) -> None:
    """Until the killed processes are gone (init reaps them: they are not ours), at most ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while pids and time.monotonic() < deadline:
        pids = [pid for pid in pids if _running(pid)]
        if pids:
            time.sleep(0.02)


def _running(pid: int) -> bool:
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return raw[raw.rfind(b")") + 2 : raw.rfind(b")") + 3] not in (b"Z", b"X")


def sweep(folder: Path | None = None) -> Swept:
    """Kill what every harness that is gone left running, remove its run folders and its ledger."""
    folder = _private_dir(folder or ledger_dir())
    killed: list[int] = []
    removed: list[str] = []
    if folder is None:
        return Swept(killed, removed)
    own = ledger().path
    for path in sorted(folder.glob("*.jsonl")):
        if path == own:
            continue
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # its harness lives
            raw = os.read(fd, MAX_LEDGER)
            entries = _entries(raw)
            mine = [pid for entry in entries if "pid" in entry and (pid := _kill(entry)) is not None]
            _wait_gone(mine)
            killed += mine
            folders = [e["folder"] for e in entries if type(e.get("folder")) is str and os.path.isabs(e["folder"])]
            if folders:
                from ale.runner import sandbox_fs

                with contextlib.suppress(OSError):
                    sandbox_fs.sweep()  # its workspaces' tmpfs mounts, before their folders go
            for run_folder in folders:
                if os.path.isdir(run_folder) and not os.path.islink(run_folder):
                    shutil.rmtree(run_folder, ignore_errors=True)
                    removed.append(run_folder)
            with contextlib.suppress(OSError):
                path.unlink()
        finally:
            os.close(fd)
    return Swept(killed, removed)
