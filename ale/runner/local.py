"""The embedded local runtime: the evaluator as a child process, the agent under bubblewrap.

It starts (:func:`ale.runner.sandbox.bwrap_argv`), observes (pipes and the event channel) and
kills (:func:`_signal_sandbox`); supervising the run is :mod:`ale.runner.supervise`'s.
"""

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
from ale.runner import agent_env, isolation, sandbox, seccomp, supervise
from ale.runner._groups import collapse
from ale.runner.isolation import SandboxResources
from ale.runner.runtime import (
    EvaluatorSpec,
    EvaluatorStartError,
    Limits,
    LineSink,
    Network,
    RuntimeUnavailable,
    SandboxError,
    SandboxResult,
    SandboxSpec,
)

READY_TIMEOUT_S = 60.0


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


def _signal_sandbox(pid: int, sig: int) -> None:
    """Signal a sandbox started in its own session: SIGTERM to its own processes only, SIGKILL to all.

    SIGTERM to timeout(1) or the outer bwrap would end the sandbox's PID namespace at once
    (SIGKILL), before the agent's handler could run; so SIGTERM goes only to the processes inside
    that namespace, SIGKILL to every descendant and the session's process group.
    """
    targets = _descendants(pid)
    if sig == signal.SIGTERM:
        host = _pid_namespace(os.getpid())
        targets = [p for p in targets if _pid_namespace(p) not in ("", host)]
    for target in reversed(targets):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(target, sig)
    if sig == signal.SIGKILL:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)


@attrs.define
class _Sandbox(supervise.ChildProcess):
    """A bubblewrap sandbox as supervision's Sandboxed: its output pipes and event channel."""

    stdout: trio.abc.ReceiveStream
    stderr: trio.abc.ReceiveStream
    events: trio.abc.ReceiveStream  # the event channel's read end (an FdStream)

    def send_term(self) -> None:
        _signal_sandbox(self.process.pid, signal.SIGTERM)

    def send_kill(self) -> None:
        _signal_sandbox(self.process.pid, signal.SIGKILL)

    async def aclose(self) -> None:
        await self.events.aclose()


class LocalRuntime:
    """Evaluator as a child process; the agent under bubblewrap."""

    name = "local"
    networks = frozenset({Network.NONE, Network.GATEWAY})

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
                msg = parse_json(line, what="the evaluator's stdout", max_bytes=supervise.MAX_LINE)
            except ParseError:
                return
            if isinstance(msg, dict) and msg.get("event") == "ready":
                ready.set()

        def on_stderr(_s: str, line: bytes) -> None:
            handle.stderr_lines.append(line.decode(errors="replace"))

        try:
            with collapse():
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(supervise.pump, process.stderr, supervise.LineSplitter("stderr", on_stderr))
                    nursery.start_soon(supervise.pump, process.stdout, supervise.LineSplitter("stdout", on_stdout))
                    if not await supervise.until_ready(supervise.ChildProcess(process), ready, READY_TIMEOUT_S):
                        await supervise.stop(supervise.ChildProcess(process))
                        await trio.sleep(0.1)
                        raise EvaluatorStartError(
                            f"the evaluator for {spec.task_id} did not become ready "
                            f"(exit status {process.returncode}):\n{handle.stderr_tail()}"
                        )
                    try:
                        yield handle
                    finally:
                        await supervise.stop(supervise.ChildProcess(process))
                        nursery.cancel_scope.cancel()
        finally:
            if process.returncode is None:
                await supervise.stop(supervise.ChildProcess(process))

    def open_workspace(self, workspace: Path, limits: Limits) -> AbstractAsyncContextManager[None]:
        return self.isolation.open_workspace(workspace, limits)

    async def run_sandboxed(
        self,
        spec: SandboxSpec,
        sink: LineSink,
        *,
        should_stop: Callable[[], Awaitable[str]] | None = None,
    ) -> SandboxResult:
        if spec.network not in self.networks:
            raise SandboxError(f"the local runtime has no {spec.network.value!r} network attachment")
        if spec.gateway_socket is not None and not await trio.Path(spec.gateway_socket).is_socket():
            raise SandboxError(f"the gateway socket {spec.gateway_socket} is not there")
        if spec.agent_env is None:  # the client library alone
            try:
                spec = attrs.evolve(spec, agent_env=await trio.to_thread.run_sync(agent_env.ensure))
            except agent_env.AgentEnvError as exc:
                raise SandboxError(str(exc)) from None
        async with self.isolation.open_sandbox(spec) as resources:
            started = time.monotonic()
            return await supervise.supervise(
                spec, await self._start(spec, resources), sink, should_stop, started=started
            )

    async def _start(self, spec: SandboxSpec, resources: SandboxResources) -> _Sandbox:
        """Start bwrap with the spec's argv, the event channel's write end and the seccomp filter."""
        read_fd, write_fd = os.pipe()
        spec = attrs.evolve(spec, env={**spec.env, "ALE_EVENT_FD": str(write_fd)})
        flt = self.isolation.filter
        seccomp_fd = seccomp.program_fd(flt) if flt is not None else None
        argv = sandbox.bwrap_argv(spec, seccomp_fd=seccomp_fd, **resources.argv_kwargs())
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
        assert process.stdout is not None
        assert process.stderr is not None
        return _Sandbox(process, process.stdout, process.stderr, trio.lowlevel.FdStream(read_fd))
