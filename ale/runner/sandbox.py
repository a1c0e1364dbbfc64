"""The agent sandbox of the local runtime: a bubblewrap command line.

Building the argv is pure; running it is :mod:`ale.runner.local`'s job. The sandbox gets no
network namespace access (a fresh, empty network namespace: loopback only), its own PID, IPC
and UTS namespaces, a private size-limited /tmp, its workspace, the read-only task files, the
evaluator's agent socket, and its own read-only Python environment (:mod:`ale.runner.agent_env`);
nothing else of the host. As root it drops to an unprivileged uid (``setpriv``) with no
capabilities and ``no_new_privs``, so the process-count limit is enforced by the kernel.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import attrs

from ale.runner.agent_env import MOUNT_POINT as PYTHON_PATH
from ale.runner.agent_env import AgentEnv

SANDBOX_UID = 65534  # nobody
SOCKET_PATH = "/ale/evaluator.sock"
TASK_PATH = "/task"
WORKSPACE_PATH = "/workspace"
EVENT_FD = 3


@attrs.frozen
class Limits:
    memory_bytes: int = 8 * 1024**3  # address space (RLIMIT_AS)
    processes: int = 256  # RLIMIT_NPROC of the sandbox uid
    file_bytes: int = 1024**3  # largest file (RLIMIT_FSIZE)
    open_files: int = 1024
    tmp_bytes: int = 512 * 1024**2  # the private /tmp
    workspace_bytes: int = 2 * 1024**3  # watched by the runtime


@attrs.frozen
class SandboxSpec:
    command: tuple[str, ...]
    workspace: Path
    workspace_writable: bool
    task_dir: Path
    evaluator_socket: Path
    env: dict[str, str]
    limits: Limits = Limits()
    wall_time_s: float = 3600.0
    agent_env: AgentEnv | None = None  # the agent's Python (ale.runner.agent_env); the runtime's default when None


class SandboxUnavailable(RuntimeError):
    """Bubblewrap cannot isolate the agent on this machine."""


def _python_mounts(env: AgentEnv) -> list[str]:
    """The agent's own environment at PYTHON_PATH, the interpreter's standard library at its own
    path, and an empty folder over whatever of the host's installation those trees would show."""
    argv: list[str] = []
    made: set[Path] = set()
    for bind in env.interpreter.binds:
        for parent in _parents(Path(bind)):
            if parent not in made and not str(parent).startswith("/usr"):
                argv += ["--perms", "0755", "--dir", str(parent)]
                made.add(parent)
        argv += ["--ro-bind", bind, bind]
    for hidden in env.interpreter.hidden:
        argv += ["--ro-bind", str(env.empty), hidden]
    # The mount point's parent is made here: bwrap would make a missing one 0700.
    return [*argv, "--perms", "0755", "--dir", str(Path(PYTHON_PATH).parent), "--ro-bind", str(env.root), PYTHON_PATH]


def _parents(path: Path) -> list[Path]:
    return [p for p in reversed(path.parents) if str(p) != "/"]


def sandbox_path() -> str:
    return f"{PYTHON_PATH}/bin:/usr/bin:/bin"


def bwrap_argv(spec: SandboxSpec, *, bwrap: str = "bwrap", as_root: bool | None = None) -> list[str]:
    """The full command line: prlimit, bwrap with its mounts, setpriv (as root), the command."""
    as_root = os.geteuid() == 0 if as_root is None else as_root
    lim = spec.limits
    # timeout(1) sits between the harness and bwrap: bwrap's --die-with-parent then follows a process
    # that lives as long as the sandbox (not the harness's short-lived spawning thread), and even a
    # harness killed with SIGKILL cannot leave a sandbox running past its wall time.
    argv = [
        shutil.which("timeout") or "timeout",
        "--kill-after=5",
        f"{int(spec.wall_time_s) + 30}",
        shutil.which("prlimit") or "prlimit",
        f"--as={lim.memory_bytes}",
        f"--nproc={lim.processes}",
        f"--fsize={lim.file_bytes}",
        f"--nofile={lim.open_files}",
        "--core=0",
        "--",
        bwrap,
        "--die-with-parent",
        "--new-session",
        "--unshare-net",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--hostname",
        "sandbox",
        "--clearenv",
        "--ro-bind",
        "/usr",
        "/usr",
    ]
    if not as_root:
        argv += ["--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID)]
    for name in ("bin", "sbin", "lib", "lib64", "lib32"):
        link = Path("/") / name
        if link.is_symlink():
            argv += ["--symlink", os.readlink(link), f"/{name}"]
        elif link.is_dir():
            argv += ["--ro-bind", f"/{name}", f"/{name}"]
    argv += ["--perms", "0755", "--dir", "/etc"]
    for etc in ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives"):
        if os.path.exists(etc):
            argv += ["--ro-bind", etc, etc]
    # The private /tmp comes before the read-only binds: a Python installation or checkout that
    # lives under the host's /tmp (a CI clone, say) must stay visible on top of it.
    argv += ["--perms", "1777", "--size", str(lim.tmp_bytes), "--tmpfs", "/tmp"]
    if spec.agent_env is None:
        raise ValueError("the sandbox needs the agent's Python environment (SandboxSpec.agent_env)")
    argv += _python_mounts(spec.agent_env)
    argv += [
        "--proc", "/proc",
        "--dev", "/dev",
        "--perms", "0755", "--dir", "/ale",
        "--bind", str(spec.evaluator_socket), SOCKET_PATH,
        "--ro-bind", str(spec.task_dir), TASK_PATH,
        "--bind" if spec.workspace_writable else "--ro-bind", str(spec.workspace), WORKSPACE_PATH,
        "--chdir", WORKSPACE_PATH,
    ]  # fmt: skip
    for key, value in sorted(spec.env.items()):
        argv += ["--setenv", key, value]
    argv.append("--")
    if as_root:
        argv += [
            shutil.which("setpriv") or "/usr/bin/setpriv",
            f"--reuid={SANDBOX_UID}",
            f"--regid={SANDBOX_UID}",
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
            "--no-new-privs",
            "--",
        ]
    return argv + list(spec.command)


def detect() -> str:
    """``bwrap`` when bubblewrap can isolate the agent here, else SandboxUnavailable.

    There is no weaker fallback: without a mount namespace the agent contract (its paths, and
    nothing else of the host) cannot be kept, and a run that cannot keep it must not start.
    """
    import subprocess

    if not shutil.which("bwrap"):
        raise SandboxUnavailable("bubblewrap is not installed (apt-get install bubblewrap)")
    probe = subprocess.run(
        ["bwrap", "--unshare-net", "--unshare-pid", "--ro-bind", "/", "/", "--", "true"],
        capture_output=True,
        timeout=30,
    )
    if probe.returncode != 0:
        raise SandboxUnavailable(f"bubblewrap cannot create namespaces here: {probe.stderr.decode(errors='replace')}")
    return "bwrap"
