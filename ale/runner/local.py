"""The embedded local runtime: the evaluator as a child process, the agent under bubblewrap.

It starts (:func:`ale.runner.sandbox.bwrap_argv`), observes (pipes and the event channel) and
kills (:func:`_signal_sandbox`); supervising the run is :mod:`ale.runner.supervise`'s.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
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
from ale.runner import agent_env, isolation, lifeline, sandbox, seccomp, supervise
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
    process: subprocess.Popen[bytes]
    harness_target: str
    agent_socket: Path
    events_path: Path
    stderr_lines: deque[str] = attrs.Factory(lambda: deque(maxlen=40))

    def alive(self) -> bool:
        return self.process.poll() is None

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


@attrs.define
class _Popen(supervise.Signals):
    """A child started with subprocess (a prestarted evaluator) as supervision's Killable; it is
    waited for through a pidfd, so the Trio loop never blocks on it."""

    process: subprocess.Popen[bytes]

    @property
    def returncode(self) -> int | None:
        return self.process.poll()

    async def wait(self) -> int:
        return await lifeline.wait_popen(self.process)


@attrs.define
class _Standby:
    """``ale-evaluator standby``: an evaluator whose code is loaded, waiting for its job on a pipe."""

    process: subprocess.Popen[bytes]
    job_fd: int  # the pipe's write end

    @classmethod
    def spawn(cls) -> _Standby:
        read_fd, write_fd = os.pipe()
        try:
            process = lifeline.popen(
                [sys.executable, "-m", "ale_evaluator", "standby", "--job-fd", str(read_fd)],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=(read_fd,),
            )  # fmt: skip
        except BaseException:
            os.close(write_fd)
            raise
        finally:
            os.close(read_fd)
        return cls(process, write_fd)

    def hand_over(self, serve: list[str], run_config: bytes) -> tuple[trio.lowlevel.FdStream, trio.lowlevel.FdStream]:
        """Send the job (the run configuration goes only through this pipe) and take its output."""
        job = b'{"serve":' + json.dumps(serve).encode() + b',"run_config":' + run_config + b"}"
        try:
            view = memoryview(job)
            while view:
                view = view[os.write(self.job_fd, view) :]
        finally:
            os.close(self.job_fd)
        out, err = self.process.stdout, self.process.stderr
        assert out is not None
        assert err is not None
        streams = (trio.lowlevel.FdStream(os.dup(out.fileno())), trio.lowlevel.FdStream(os.dup(err.fileno())))
        out.close()
        err.close()
        return streams

    def discard(self) -> None:
        """Close its job pipe (it exits on the empty job) and reap it."""
        with contextlib.suppress(OSError):
            os.close(self.job_fd)
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        for stream in (self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()


class LocalRuntime:
    """Evaluator as a child process; the agent under bubblewrap."""

    name = "local"
    networks = frozenset({Network.NONE, Network.GATEWAY})

    def __init__(self) -> None:
        self._sandbox_kind: str | None = None
        self._isolation: isolation.Isolation | None = None
        self._standby: _Standby | None = None  # a prestarted evaluator (prestart_evaluator), the next taken
        self._more: list[_Standby] = []  # more of them, for tasks starting side by side
        # the run's tasks open their evaluators side by side, each from a worker thread
        self._standby_lock = threading.Lock()

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

    @property
    def sandbox(self) -> str:
        return self.sandbox_kind

    def agent_environment(self, env: agent_env.AgentEnv | None) -> dict[str, Any]:
        """The agent environment the sandbox mounts at /ale/python (the manifest's ``agent.environment``)."""
        if env is None:
            env = agent_env.ensure()  # what run_sandboxed gives a spec without one: the client library alone
        return {"digest": env.digest, "modules": list(env.modules), "distributions": list(env.distributions)}

    def image_digests(self) -> dict[str, str]:
        """None: the local runtime runs the installed code, no image."""
        return {}

    def attestation(self) -> dict[str, Any]:
        return {
            "runtime": "local",
            "sandbox": self.sandbox_kind,
            "engine": None,  # no OCI engine,
            "images": None,  # and no image: the installed code runs (code below)
            "isolation": self.isolation.describe(),
            "code": code_digest(),
        }

    def prestart_evaluator(self, count: int = 1) -> None:
        """Keep ``count`` evaluator processes started ahead (``ale-evaluator standby``), so that the
        next ``count`` open_evaluator calls (tasks starting side by side) do not wait for their code
        to load. Best effort: if one cannot start, open_evaluator starts one itself and reports the
        error. Called again, it adds only what is missing."""
        with self._standby_lock:
            alive = [s for s in (self._standby, *self._more) if s is not None and s.process.poll() is None]
            dead = [s for s in (self._standby, *self._more) if s is not None and s not in alive]
            while len(alive) < max(1, count):
                try:
                    alive.append(_Standby.spawn())
                except OSError:
                    break
            self._standby, self._more = (alive[0] if alive else None), alive[1:]
        for standby in dead:
            standby.discard()

    def close(self) -> None:
        """Stop the prestarted evaluators nobody took (they end by themselves when this process does)."""
        with self._standby_lock:
            left = [s for s in (self._standby, *self._more) if s is not None]
            self._standby, self._more = None, []
        for standby in left:
            standby.discard()

    def _take_standby(self) -> _Standby:
        with self._standby_lock:  # one task takes each; one starting when none is left starts its own
            standby = self._standby
            self._standby, self._more = (self._more[0], self._more[1:]) if self._more else (None, [])
        if standby is not None and standby.process.poll() is None:
            return standby
        if standby is not None:
            standby.discard()
        try:
            return _Standby.spawn()
        except OSError as exc:
            raise EvaluatorStartError(f"cannot start the evaluator: {exc}") from None

    @asynccontextmanager
    async def open_evaluator(self, spec: EvaluatorSpec) -> AsyncIterator[LocalEvaluator]:
        standby = await trio.to_thread.run_sync(self._take_standby)
        serve = [
            "--task", spec.task_id, "--agent-socket", str(spec.agent_socket),
            "--harness-socket", str(spec.harness_socket), "--events", str(spec.events_path),
        ]  # fmt: skip
        process = _Popen(standby.process)
        try:
            stdout, stderr = standby.hand_over(serve, spec.run_config)
        except OSError as exc:
            await supervise.stop(process)
            raise EvaluatorStartError(f"cannot start the evaluator: {exc}") from None
        handle = LocalEvaluator(standby.process, f"unix:{spec.harness_socket}", spec.agent_socket, spec.events_path)
        ready = trio.Event()

        on_stdout = supervise.ready_sink(ready, "the evaluator's stdout")

        def on_stderr(_s: str, line: bytes) -> None:
            handle.stderr_lines.append(line.decode(errors="replace"))

        try:
            with collapse():
                async with stdout, stderr, trio.open_nursery() as nursery:
                    nursery.start_soon(supervise.pump, stderr, supervise.LineSplitter("stderr", on_stderr))
                    nursery.start_soon(
                        supervise.pump,
                        stdout,
                        supervise.LineSplitter("stdout", on_stdout),
                    )
                    if not await supervise.until_ready(process, ready, READY_TIMEOUT_S):
                        await supervise.stop(process)
                        await trio.sleep(0.1)
                        raise EvaluatorStartError(
                            f"the evaluator for {spec.task_id} did not become ready "
                            f"(exit status {process.returncode}):\n{handle.stderr_tail()}"
                        )
                    try:
                        yield handle
                    finally:
                        await supervise.stop(process)
                        nursery.cancel_scope.cancel()
        finally:
            if process.returncode is None:
                await supervise.stop(process)

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
            result = await supervise.supervise(
                spec, await self._start(spec, resources), sink, should_stop, started=started
            )
            if resources.cgroup is None:
                return result
            return attrs.evolve(result, oom_kills=resources.cgroup.oom_kills())  # before the cgroup goes

    async def _start(self, spec: SandboxSpec, resources: SandboxResources) -> _Sandbox:
        """Start bwrap with the spec's argv, the event channel's write end and the seccomp filter."""
        read_fd, write_fd = os.pipe()
        spec = attrs.evolve(spec, env={**spec.env, "ALE_EVENT_FD": str(write_fd)})
        flt = self.isolation.filter
        seccomp_fd = seccomp.program_fd(flt) if flt is not None else None
        argv = sandbox.bwrap_argv(spec, seccomp_fd=seccomp_fd, **resources.argv_kwargs())
        try:
            process = await lifeline.open_process(
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
