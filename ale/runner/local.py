"""The embedded local runtime: the evaluator as a child process, the agent under bubblewrap."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from importlib import metadata
from pathlib import Path
from typing import Any

import attrs
import trio
import trio.lowlevel

from ale.core import attestation
from ale.core.parse import ParseError, parse_json
from ale.runner import agent_env, isolation, sandbox, seccomp
from ale.runner._groups import collapse
from ale.runner.isolation import SandboxResources
from ale.runner.runtime import (
    EvaluatorSpec,
    EvaluatorStartError,
    LineSink,
    RuntimeUnavailable,
    SandboxError,
    SandboxResult,
)

READY_TIMEOUT_S = 60.0
KILL_GRACE_S = 5.0
MAX_LINE = 64 * 1024
MAX_STREAM_BYTES = 8 * 1024 * 1024


def code_digest() -> dict[str, Any]:
    """A digest of the installed code (the ale and ale_evaluator packages: runner, client and evaluator)
    and of the dependency lock (sorted name==version lines)."""
    import ale
    import ale_evaluator

    def files() -> Iterator[tuple[str, bytes]]:
        for package in (ale, ale_evaluator):
            assert package.__file__ is not None  # both are regular packages
            root = Path(package.__file__).resolve().parent
            for path in sorted(root.rglob("*")):
                if (
                    path.is_file()
                    and path.suffix in {".py", ".json", ".md", ".proto", ".pyi"}
                    and "__pycache__" not in path.parts
                ):
                    yield f"{package.__name__}/{path.relative_to(root).as_posix()}", path.read_bytes()

    installed = ((d.metadata["Name"], d.version) for d in metadata.distributions())
    return {
        "kind": "local-install",
        "note": "digest of the installed Python code and dependency versions, not of an OCI image",
        "code_sha256": attestation.code_sha256(files()),
        "dependency_lock_sha256": attestation.dependency_lock_sha256(installed),
        "python": sys.version.split()[0],
    }


@attrs.define
class _LineSplitter:
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
            if cut < 0:
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


async def _pump(stream: trio.abc.ReceiveStream, splitter: _LineSplitter) -> None:
    try:
        while chunk := await stream.receive_some(65536):
            splitter.feed(chunk)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    splitter.close()


def _dir_size(path: Path, limit: int) -> int:
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


@attrs.define
class LocalEvaluator:
    process: trio.Process
    harness_target: str
    agent_socket: Path
    events_path: Path
    stderr_lines: deque[str] = attrs.Factory(lambda: deque(maxlen=40))

    def alive(self) -> bool:
        return self.process.returncode is None

    def stderr_tail(self) -> str:
        return "\n".join(self.stderr_lines)


def _descendants(pid: int) -> list[int]:
    """Every descendant of ``pid`` (children first, breadth-first), read from /proc."""
    found: list[int] = []
    queue = [pid]
    while queue:
        parent = queue.pop(0)
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{parent}/task/{tid}/children") as fh:
                    kids = [int(k) for k in fh.read().split()]
            except (OSError, ValueError):
                continue
            for kid in kids:
                if kid not in found:
                    found.append(kid)
                    queue.append(kid)
    return found


def _pid_namespace(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return ""


async def _terminate(process: trio.Process, *, group: bool) -> None:
    """SIGTERM (to the whole tree: a sandboxed agent sits in its own session), then SIGKILL."""

    def send(sig: int) -> None:
        targets = _descendants(process.pid) if group else []
        if group and sig == signal.SIGTERM:
            # Only the sandbox's own processes: SIGTERM to timeout(1) or the outer bwrap ends the
            # sandbox's PID namespace at once (SIGKILL), before the agent's handler can run.
            targets = [pid for pid in targets if _pid_namespace(pid) not in ("", _pid_namespace(os.getpid()))]
            for pid in reversed(targets):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
            return
        for pid in reversed(targets):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if group:
                os.killpg(process.pid, sig)
            else:
                process.send_signal(sig)

    if process.returncode is not None:
        return
    with trio.CancelScope(shield=True):
        send(signal.SIGTERM)
        with trio.move_on_after(KILL_GRACE_S):
            await process.wait()
        if process.returncode is None:
            send(signal.SIGKILL)
            await process.wait()


class LocalRuntime:
    """Evaluator as a child process; the agent under bubblewrap."""

    name = "local"

    def __init__(self) -> None:
        self._sandbox_kind: str | None = None
        self._isolation: isolation.Isolation | None = None

    @property
    def sandbox_kind(self) -> str:
        if self._sandbox_kind is None:
            self._sandbox_kind = sandbox.detect()
        return self._sandbox_kind

    @property
    def isolation(self) -> isolation.Isolation:
        if self._isolation is None:
            self._isolation = isolation.probe(self.sandbox_kind)
        return self._isolation

    def check(self) -> None:
        try:
            _ = self.isolation
        except sandbox.SandboxUnavailable as exc:
            raise RuntimeUnavailable(str(exc)) from None

    def attestation(self) -> dict[str, Any]:
        return {
            "runtime": "local",
            "sandbox": self.sandbox_kind,
            "isolation": self.isolation.describe(),
            "code": code_digest(),
        }

    @asynccontextmanager
    async def open_evaluator(self, spec: EvaluatorSpec) -> AsyncIterator[LocalEvaluator]:
        read_fd, write_fd = os.pipe()
        try:
            os.write(write_fd, spec.run_config)
        finally:
            os.close(write_fd)
        argv = [
            sys.executable, "-m", "ale_evaluator", "serve", "--task", spec.task_id,
            "--agent-socket", str(spec.agent_socket), "--harness-socket", str(spec.harness_socket),
            "--run-config-fd", str(read_fd), "--events", str(spec.events_path),
        ]  # fmt: skip
        try:
            process = await trio.lowlevel.open_process(
                argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=(read_fd,)
            )
        except OSError as exc:
            raise EvaluatorStartError(f"cannot start the evaluator: {exc}") from None
        finally:
            os.close(read_fd)
        handle = LocalEvaluator(process, f"unix:{spec.harness_socket}", spec.agent_socket, spec.events_path)
        assert process.stderr is not None
        assert process.stdout is not None
        ready = trio.Event()

        def on_stdout(_s: str, line: bytes) -> None:
            try:
                msg = parse_json(line, what="the evaluator's stdout", max_bytes=MAX_LINE)
            except ParseError:
                return
            if isinstance(msg, dict) and msg.get("event") == "ready":
                ready.set()

        def on_stderr(_s: str, line: bytes) -> None:
            handle.stderr_lines.append(line.decode(errors="replace"))

        try:
            with collapse():
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(_pump, process.stderr, _LineSplitter("stderr", on_stderr))
                    nursery.start_soon(_pump, process.stdout, _LineSplitter("stdout", on_stdout))
                    with trio.move_on_after(READY_TIMEOUT_S):
                        async with trio.open_nursery() as waiter:

                            async def _exited() -> None:
                                await process.wait()
                                waiter.cancel_scope.cancel()

                            async def _ready() -> None:
                                await ready.wait()
                                waiter.cancel_scope.cancel()

                            waiter.start_soon(_exited)
                            waiter.start_soon(_ready)
                    if not ready.is_set():
                        await _terminate(process, group=False)
                        await trio.sleep(0.1)
                        raise EvaluatorStartError(
                            f"the evaluator for {spec.task_id} did not become ready "
                            f"(exit status {process.returncode}):\n{handle.stderr_tail()}"
                        )
                    try:
                        yield handle
                    finally:
                        await _terminate(process, group=False)
                        nursery.cancel_scope.cancel()
        finally:
            if process.returncode is None:
                await _terminate(process, group=False)

    def open_workspace(self, workspace: Path, limits: sandbox.Limits) -> AbstractAsyncContextManager[None]:
        return self.isolation.open_workspace(workspace, limits)

    async def run_sandboxed(
        self,
        spec: sandbox.SandboxSpec,
        sink: LineSink,
        *,
        should_stop: Callable[[], Awaitable[str]] | None = None,
    ) -> SandboxResult:
        if spec.agent_env is None:  # the client library alone
            try:
                spec = attrs.evolve(spec, agent_env=await trio.to_thread.run_sync(agent_env.ensure))
            except agent_env.AgentEnvError as exc:
                raise SandboxError(str(exc)) from None
        async with self.isolation.open_sandbox(spec) as resources:
            return await self._supervise(spec, sink, should_stop, resources)

    async def _supervise(
        self,
        spec: sandbox.SandboxSpec,
        sink: LineSink,
        should_stop: Callable[[], Awaitable[str]] | None,
        resources: SandboxResources,
    ) -> SandboxResult:
        read_fd, write_fd = os.pipe()
        spec = attrs.evolve(spec, env={**spec.env, "ALE_EVENT_FD": str(write_fd)})
        flt = self.isolation.filter
        seccomp_fd = seccomp.program_fd(flt) if flt is not None else None
        argv = sandbox.bwrap_argv(spec, seccomp_fd=seccomp_fd, **resources.argv_kwargs())
        started = time.monotonic()
        try:
            process = await trio.lowlevel.open_process(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=(write_fd,) if seccomp_fd is None else (write_fd, seccomp_fd),
                start_new_session=True,
            )
        except OSError as exc:
            os.close(read_fd)
            raise SandboxError(f"cannot start the sandbox: {exc}") from None
        finally:
            os.close(write_fd)
            if seccomp_fd is not None:
                os.close(seccomp_fd)
        splitters = [
            _LineSplitter("stdout", sink),
            _LineSplitter("stderr", sink),
            _LineSplitter("event", sink, cut=True),
        ]
        stopped_for = ""
        events = trio.lowlevel.FdStream(read_fd)
        assert process.stdout is not None
        assert process.stderr is not None
        try:
            with collapse():
                async with trio.open_nursery() as readers:
                    readers.start_soon(_pump, process.stdout, splitters[0])
                    readers.start_soon(_pump, process.stderr, splitters[1])
                    readers.start_soon(_pump, events, splitters[2])
                    async with trio.open_nursery() as watch:

                        async def watchdog() -> None:
                            nonlocal stopped_for
                            while True:
                                await trio.sleep(1.0)
                                size = await trio.to_thread.run_sync(
                                    _dir_size, spec.workspace, spec.limits.workspace_bytes
                                )
                                if size > spec.limits.workspace_bytes:
                                    stopped_for = "disk"
                                    break
                                if should_stop is not None and (reason := await should_stop()):
                                    stopped_for = reason
                                    break
                            await _terminate(process, group=True)

                        watch.start_soon(watchdog)
                        with trio.move_on_after(spec.wall_time_s):
                            await process.wait()
                        if process.returncode is None and not stopped_for:
                            stopped_for = "wall_time"
                            await _terminate(process, group=True)
                        await process.wait()
                        watch.cancel_scope.cancel()
                    readers.cancel_scope.deadline = trio.current_time() + 2.0
        finally:
            # Whatever ended the wait (a cancellation, an error), the sandbox does not outlive it.
            if process.returncode is None:
                stopped_for = stopped_for or "cancelled"
                await _terminate(process, group=True)
            with trio.CancelScope(shield=True):
                await events.aclose()
        exit_status = process.returncode if not stopped_for else None
        return SandboxResult(
            exit_status=exit_status,
            stopped_for=stopped_for,
            wall_time_s=time.monotonic() - started,
            dropped_output_bytes=sum(s.dropped for s in splitters),
        )
