"""Supervision of a running sandbox, shared by every runtime backend.

A backend starts the sandbox and hands :func:`supervise` a :class:`Sandboxed`: its three output
streams, a way to wait for it and two ways to signal it. Everything else is decided here, the
same for every backend: lines are split and capped (:class:`LineSplitter`), the workspace's
size is watched and ``should_stop`` polled about once a second, the wall time is kept, and a
sandbox is stopped with :func:`stop` (SIGTERM, then SIGKILL after :data:`KILL_GRACE_S`) whatever
ended the wait, a cancellation included. A backend's evaluator uses the same pieces: its output
through :class:`LineSplitter`, its start deadline with :func:`until_ready`, its end with :func:`stop`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Protocol

import attrs
import trio

from ale.core.parse import ParseError, parse_json
from ale.runner._groups import collapse
from ale.runner.lifeline import Child
from ale.runner.runtime import LineSink, SandboxResult, SandboxSpec

KILL_GRACE_S = 5.0  # between SIGTERM and SIGKILL (docs/agent-contract.md)
MAX_LINE = 64 * 1024  # longest line passed on
MAX_STREAM_BYTES = 8 * 1024 * 1024  # most bytes passed on per stream
WATCH_INTERVAL_S = 1.0  # how often the workspace and should_stop are looked at
DRAIN_S = 2.0  # how long the streams are read after the sandbox ended


class Killable(Protocol):
    """A started process (or sandbox) that can be waited for and signalled."""

    @property
    def returncode(self) -> int | None:
        """The exit status once it ended, else None."""

    async def wait(self) -> object:
        """Return once it ended."""

    def send_term(self) -> None:
        """Ask it to stop (SIGTERM to what it runs)."""

    def send_kill(self) -> None:
        """Stop it at once (SIGKILL to everything it runs)."""


class Signals:
    """A :class:`Killable`'s send_term and send_kill, to ``self.process`` alone (a trio.Process, a
    :class:`ale.runner.lifeline.Child` or a subprocess.Popen: each has send_signal)."""

    process: trio.Process | Child | subprocess.Popen[bytes]

    def send_term(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            self.process.send_signal(signal.SIGTERM)

    def send_kill(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            self.process.send_signal(signal.SIGKILL)


@attrs.define
class ChildProcess(Signals):
    """A child process (an evaluator, a gateway) as a :class:`Killable`: signals go to it alone."""

    process: trio.Process | Child

    @property
    def returncode(self) -> int | None:
        return self.process.returncode

    async def wait(self) -> int:
        return await self.process.wait()


class Sandboxed(Killable, Protocol):
    """What a backend hands :func:`supervise`: a started sandbox and its output."""

    stdout: trio.abc.ReceiveStream
    stderr: trio.abc.ReceiveStream
    events: trio.abc.ReceiveStream  # the event channel (ALE_EVENT_FD), one JSON value a line

    async def aclose(self) -> None:
        """Release what the backend holds to observe the sandbox (the event channel's end)."""


@attrs.define
class LineSplitter:
    """Splits a byte stream into lines, capping the total it passes on. A line longer than MAX_LINE
    is passed on in pieces of MAX_LINE (output text), or, with ``cut``, only its first MAX_LINE bytes
    (the event channel: one line, one JSON value); the rest of it is counted as dropped."""

    stream: str
    sink: LineSink
    budget: int = MAX_STREAM_BYTES
    cut: bool = False
    buf: bytearray = attrs.Factory(bytearray)
    dropped: int = 0
    skipping: bool = False  # inside the rest of a cut line

    def feed(self, data: bytes | bytearray) -> None:
        self.buf += data
        while True:
            cut = self.buf.find(b"\n")
            if self.skipping:
                self.dropped += len(self.buf) if cut < 0 else cut + 1
                del self.buf[: len(self.buf) if cut < 0 else cut + 1]
                self.skipping = cut < 0
                if cut < 0:
                    return
                continue
            if cut < 0 or cut > MAX_LINE:  # no whole line yet, or one too long: however it arrived
                if len(self.buf) > MAX_LINE:
                    self._line(bytes(self.buf[:MAX_LINE]))
                    del self.buf[:MAX_LINE]
                    self.skipping = self.cut
                    continue
                return
            self._line(bytes(self.buf[:cut]))
            del self.buf[: cut + 1]

    def _line(self, line: bytes) -> None:
        if self.budget <= 0:
            self.dropped += len(line) + 1
            return
        line = line[:MAX_LINE]
        self.budget -= len(line) + 1
        self.sink(self.stream, line)

    def close(self) -> None:
        if self.buf and not self.skipping:
            self._line(bytes(self.buf))
        self.dropped += len(self.buf) if self.skipping else 0
        self.buf.clear()


def ready_sink(ready: trio.Event, what: str) -> LineSink:
    """A stdout sink that sets ``ready`` at a child's ``{"event": "ready", ...}`` line (the
    evaluator's and the gateway's handshake); other lines, readable or not, are ignored."""

    def sink(_stream: str, line: bytes) -> None:
        try:
            msg = parse_json(line, what=what, max_bytes=MAX_LINE)
        except ParseError:
            return
        if isinstance(msg, dict) and msg.get("event") == "ready":
            ready.set()

    return sink


async def pump(stream: trio.abc.ReceiveStream, splitter: LineSplitter) -> None:
    """Feed ``stream`` to ``splitter`` until it ends (or is closed), then flush the last line."""
    try:
        while chunk := await stream.receive_some(65536):
            splitter.feed(chunk)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    splitter.close()


def dir_size(path: Path, limit: int) -> int:
    """The apparent size of the files under ``path``, counted until it passes ``limit``."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                continue
            if total > limit:
                return total
    return total


async def stop(process: Killable) -> None:
    """SIGTERM, then SIGKILL after KILL_GRACE_S; shielded, so a cancelled caller still stops it."""
    if process.returncode is not None:
        return
    with trio.CancelScope(shield=True):
        process.send_term()
        with trio.move_on_after(KILL_GRACE_S):
            await process.wait()
        if process.returncode is None:
            process.send_kill()
            await process.wait()


async def until_ready(process: Killable, ready: trio.Event, timeout_s: float) -> bool:
    """Wait until ``ready`` is set, the process ends or ``timeout_s`` passes; True when it is ready."""
    with trio.move_on_after(timeout_s):
        async with trio.open_nursery() as waiter:

            async def exited() -> None:
                await process.wait()
                waiter.cancel_scope.cancel()

            async def is_ready() -> None:
                await ready.wait()
                waiter.cancel_scope.cancel()

            waiter.start_soon(exited)
            waiter.start_soon(is_ready)
    return ready.is_set()


async def _watch(spec: SandboxSpec, should_stop: Callable[[], Awaitable[str]] | None) -> str:
    """Return the reason to stop: "disk" once the workspace outgrows its limit, or should_stop's."""
    while True:
        await trio.sleep(WATCH_INTERVAL_S)
        limit = spec.limits.workspace_bytes
        if await trio.to_thread.run_sync(dir_size, spec.workspace, limit) > limit:
            return "disk"
        if should_stop is not None and (reason := await should_stop()):
            return reason


async def supervise(
    spec: SandboxSpec,
    sandboxed: Sandboxed,
    sink: LineSink,
    should_stop: Callable[[], Awaitable[str]] | None,
    *,
    started: float,
) -> SandboxResult:
    """Read, watch and stop a started sandbox until it ends; ``started`` is its time.monotonic() start."""
    splitters = [
        LineSplitter("stdout", sink),
        LineSplitter("stderr", sink),
        LineSplitter("event", sink, cut=True),
    ]
    stopped_for = ""
    try:
        with collapse():
            async with trio.open_nursery() as readers:
                for stream, splitter in zip(
                    (sandboxed.stdout, sandboxed.stderr, sandboxed.events), splitters, strict=True
                ):
                    readers.start_soon(pump, stream, splitter)
                async with trio.open_nursery() as watch:

                    async def watchdog() -> None:
                        nonlocal stopped_for
                        stopped_for = await _watch(spec, should_stop)
                        await stop(sandboxed)

                    watch.start_soon(watchdog)
                    with trio.move_on_after(spec.wall_time_s):
                        await sandboxed.wait()
                    if sandboxed.returncode is None and not stopped_for:
                        stopped_for = "wall_time"
                        await stop(sandboxed)
                    await sandboxed.wait()
                    watch.cancel_scope.cancel()
                readers.cancel_scope.deadline = trio.current_time() + DRAIN_S
    finally:
        # Whatever ended the wait (a cancellation, an error), the sandbox does not outlive it.
        if sandboxed.returncode is None:
            stopped_for = stopped_for or "cancelled"
            await stop(sandboxed)
        with trio.CancelScope(shield=True):
            await sandboxed.aclose()
    return SandboxResult(
        exit_status=sandboxed.returncode if not stopped_for else None,
        stopped_for=stopped_for,
        wall_time_s=time.monotonic() - started,
        dropped_output_bytes=sum(s.dropped for s in splitters),
    )
