"""The runtime interface: where the evaluator and the agent's sandbox run.

The embedded **local** runtime (:mod:`ale.runner.local`) runs the evaluator as a child process
and the agent under bubblewrap; OCI runtimes (podman, docker) implement the same interface with
images run by digest. One conformance suite (``tests/test_runtime_conformance.py``) runs against
every backend the machine has.

Exceptions a backend may raise:

* :class:`RuntimeUnavailable`: the backend cannot work on this machine (tool missing, no
  permission); raised by ``check()`` before anything starts.
* :class:`EvaluatorStartError`: the evaluator did not become ready (the message has its stderr).
* :class:`SandboxError`: the sandbox could not be started at all (not: the agent failed, which
  is a normal :class:`SandboxResult`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any, Protocol

import attrs

from ale.runner.sandbox import Limits, SandboxSpec

#: Called with ("stdout" | "stderr" | "event", one line of bytes without its newline).
LineSink = Callable[[str, bytes], None]


class RuntimeUnavailable(RuntimeError):
    pass


class EvaluatorStartError(RuntimeError):
    pass


class SandboxError(RuntimeError):
    pass


@attrs.frozen
class EvaluatorSpec:
    task_id: str
    run_config: bytes  # {"run_id", "secret"} JSON, handed over by descriptor, never argv/env
    agent_socket: Path  # where the agent endpoint's socket must appear
    harness_socket: Path  # the harness endpoint (a private folder)
    events_path: Path  # the evaluator's JSONL event log


@attrs.frozen
class SandboxResult:
    exit_status: int | None  # None when killed before exiting on its own
    stopped_for: str  # "" (exited) | "wall_time" | "env_steps" | "disk" | "cancelled"
    wall_time_s: float
    dropped_output_bytes: int


class EvaluatorHandle(Protocol):
    harness_target: str  # gRPC target for the harness client
    agent_socket: Path
    events_path: Path

    def alive(self) -> bool: ...

    def stderr_tail(self) -> str:
        """The last lines the evaluator wrote to stderr (for error messages)."""


class Runtime(Protocol):
    name: str

    def check(self) -> None:
        """Raise RuntimeUnavailable unless this backend can run here."""

    def attestation(self) -> dict[str, Any]:
        """What ran, for the bundle manifest (digests and how they were computed)."""

    def open_workspace(self, workspace: Path, limits: Limits) -> AbstractAsyncContextManager[None]:
        """Give a task's workspace folder its size- and inode-limited storage for as long as the
        context lasts (the task's sandboxes and the harness use it inside); its contents go after."""

    def open_evaluator(self, spec: EvaluatorSpec) -> AbstractAsyncContextManager[EvaluatorHandle]:
        """Start the evaluator; enter once both endpoints accept calls; stop it on exit."""

    async def run_sandboxed(
        self,
        spec: SandboxSpec,
        sink: LineSink,
        *,
        should_stop: Callable[[], Awaitable[str]] | None = None,
    ) -> SandboxResult:
        """Run a command in the sandbox until it exits, its wall time runs out, or ``should_stop``
        returns a reason (polled about once a second). Output lines go to ``sink``."""
