"""The runtime interface: where the evaluator and the agent's sandbox run.

Everything a backend is given is defined here: :class:`SandboxSpec` with its :class:`Limits` and
:class:`Network` attachment, :class:`EvaluatorSpec`, and the agent-contract paths
(:data:`WORKSPACE_PATH`, :data:`TASK_PATH`, :data:`SOCKET_PATH`) every backend mounts the same way
(docs/agent-contract.md). The embedded **local** runtime (:mod:`ale.runner.local`) runs the
evaluator as a child process and the agent under bubblewrap; OCI runtimes (podman, docker) will
implement the same interface with images run by digest. Backends are found by name in
:mod:`ale.runner.runtimes` (``ale run --runtime NAME``). Supervision (output caps, the
workspace watchdog, ``should_stop``, the wall time, the stop sequence) is shared code,
:mod:`ale.runner.supervise`: a backend only starts, observes and kills. The conformance suite,
:mod:`ale.runner.conformance`, checks a backend against this interface.

Exceptions a backend may raise:

* :class:`RuntimeUnavailable`: the backend cannot work on this machine (tool missing, no
  permission); raised by ``check()`` before anything starts.
* :class:`EvaluatorStartError`: the evaluator did not become ready (the message has its stderr).
* :class:`SandboxError`: the sandbox could not be started at all, including a spec the backend
  does not support (a network attachment it lacks); not: the agent failed, which is a normal
  :class:`SandboxResult`.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any, Protocol

import attrs

from ale.runner.agent_env import MOUNT_POINT as PYTHON_PATH
from ale.runner.agent_env import AgentEnv

# The agent contract's paths inside every sandbox (docs/agent-contract.md).
SOCKET_PATH = "/ale/evaluator.sock"  # the evaluator's agent endpoint
TASK_PATH = "/task"  # the task's paper and card, read-only
WORKSPACE_PATH = "/workspace"  # the agent's workspace, its cwd and HOME
EVENT_FD = 3  # the usual number of the event channel's descriptor (its number is in ALE_EVENT_FD)
GATEWAY_SOCKET_PATH = "/ale/gateway.sock"  # the gateway's agent socket (Network.GATEWAY)
GATEWAY_PORT = 27100  # the relay to it on the sandbox's own loopback: 127.0.0.1:GATEWAY_PORT
GATEWAY_URL = f"http://127.0.0.1:{GATEWAY_PORT}"  # what ALE_GATEWAY_URL holds; /{upstream}/... routes


def gateway_attachment_env() -> dict[str, str]:
    """What a backend adds to the environment of a sandbox with the gateway attachment."""
    return {"ALE_GATEWAY_SOCKET": GATEWAY_SOCKET_PATH, "ALE_GATEWAY_URL": GATEWAY_URL}


def sandbox_path() -> str:
    """PATH inside the sandbox: the agent environment's bin folder first (docs/agent-contract.md)."""
    return f"{PYTHON_PATH}/bin:/usr/bin:/bin"


class Network(enum.Enum):
    """The sandbox's network attachment.

    ``NONE``: a network namespace of its own with only its loopback. ``GATEWAY``: that, plus the
    socket of the LLM gateway (``SandboxSpec.gateway_socket``) at :data:`GATEWAY_SOCKET_PATH`, and a
    relay on the sandbox's loopback (``127.0.0.1:``:data:`GATEWAY_PORT`) that splices TCP to it
    (:mod:`ale._relay`), running before the command starts; the backend adds
    :func:`gateway_attachment_env` to the environment. Nothing else is reachable either way.
    """

    NONE = "none"
    GATEWAY = "gateway"


@attrs.frozen
class Limits:
    memory_bytes: int = 8 * 1024**3  # address space of each process (RLIMIT_AS)
    processes: int = 256  # the sandbox's cgroup pids.max, and RLIMIT_NPROC of the sandbox uid
    file_bytes: int = 1024**3  # largest file (RLIMIT_FSIZE)
    open_files: int = 1024
    tmp_bytes: int = 512 * 1024**2  # the private /tmp
    workspace_bytes: int = 2 * 1024**3  # the workspace filesystem's size, also watched by supervision
    sandbox_memory_bytes: int = 8 * 1024**3  # all the sandbox's processes together (its memory cgroup)
    cpus: float = 1.0  # CPU quota of the sandbox's cgroup, in CPUs


def _check_gateway(spec: SandboxSpec, _attribute: object, value: Path | None) -> None:
    if (spec.network is Network.GATEWAY) != (value is not None):
        raise ValueError("a gateway socket is given exactly when the network attachment is 'gateway'")


@attrs.frozen
class SandboxSpec:
    command: tuple[str, ...]
    workspace: Path  # host folder mounted at WORKSPACE_PATH
    workspace_writable: bool
    task_dir: Path  # host folder mounted read-only at TASK_PATH
    evaluator_socket: Path  # host socket mounted at SOCKET_PATH
    env: dict[str, str]  # the whole environment (plus ALE_EVENT_FD, and the gateway's two, which the runtime adds)
    limits: Limits = Limits()
    wall_time_s: float = 3600.0
    agent_env: AgentEnv | None = None  # the agent's Python (ale.runner.agent_env); the runtime's default when None
    network: Network = Network.NONE
    gateway_socket: Path | None = attrs.field(default=None, validator=_check_gateway)


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
    oom_kills: int = 0  # processes the kernel killed at the sandbox's memory limit (0 where it cannot tell)


class EvaluatorHandle(Protocol):
    harness_target: str  # gRPC target for the harness client
    agent_socket: Path
    events_path: Path

    def alive(self) -> bool: ...

    def stderr_tail(self) -> str:
        """The last lines the evaluator wrote to stderr (for error messages)."""


class Runtime(Protocol):
    name: str  # its registry name (ale.runner.runtimes), recorded in the manifest as runtime.runtime
    networks: frozenset[Network]  # the network attachments run_sandboxed supports

    def check(self) -> None:
        """Raise RuntimeUnavailable unless this backend can run here."""

    @property
    def sandbox(self) -> str:
        """What isolates the agent (``bwrap``, ...), as the attestation's ``sandbox``; cheap once
        check() passed (the harness records it before the attestation is ready)."""

    def attestation(self) -> dict[str, Any]:
        """What ran, for the bundle manifest (digests and how they were computed). It may take a
        while (it hashes what it attests): the harness computes it while the run goes on."""

    def agent_environment(self, env: AgentEnv | None) -> dict[str, Any]:
        """The Python environment the agent's sandbox runs with, as the bundle manifest's
        ``agent.environment`` (docs/formats.md): for ``env`` (the agent's environment the harness
        assembled; None: the client library's alone), what the sandbox's ``/ale/python`` is: the
        local runtime mounts ``env`` itself, an OCI runtime runs the agent image's own Python with
        ``env``'s bundled-agent modules bound in. Cheap once check() passed."""

    def image_digests(self) -> dict[str, str]:
        """The images it runs, by name: each one's OCI manifest digest (``sha256:...``), as check()
        read it; empty for a backend that runs no image (the local runtime). Cheap once check()
        passed: the harness compares it with the release's images before anything runs."""

    def open_workspace(self, workspace: Path, limits: Limits) -> AbstractAsyncContextManager[None]:
        """Give a task's workspace folder its size- and inode-limited storage for as long as the
        context lasts (the task's sandboxes and the harness use it inside); its contents go after."""

    def open_evaluator(self, spec: EvaluatorSpec) -> AbstractAsyncContextManager[EvaluatorHandle]:
        """Start the evaluator; enter once both endpoints accept calls; stop it on exit."""

    def prestart_evaluator(self, count: int = 1) -> None:
        """Start, ahead of time, what the next open_evaluator needs before it can hand the evaluator
        its task (an evaluator process with its code loaded, an unstarted container), so that the
        task does not wait for it; ``count``: for that many tasks starting side by side (a backend
        may keep fewer, one). A second call keeps what the first started, it does not add to it.
        Optional (a backend may do nothing); best effort (a failure is reported by the
        open_evaluator that follows, not here); never blocks for long. Called from worker threads,
        possibly while another task's open_evaluator takes what it started."""

    def close(self) -> None:
        """Discard what prestart_evaluator started and no open_evaluator took. Idempotent; the
        runtime stays usable."""

    async def run_sandboxed(
        self,
        spec: SandboxSpec,
        sink: LineSink,
        *,
        should_stop: Callable[[], Awaitable[str]] | None = None,
    ) -> SandboxResult:
        """Run a command in the sandbox until it exits, its wall time runs out, or ``should_stop``
        returns a reason (polled about once a second). Output lines go to ``sink``. A backend
        starts the sandbox and hands it to :func:`ale.runner.supervise.supervise`, which does the
        rest. A spec whose ``network`` is not in ``networks`` is a SandboxError before anything starts."""
