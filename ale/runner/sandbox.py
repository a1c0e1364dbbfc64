"""The agent sandbox of the local runtime: a bubblewrap (or unshare) command line.

Building the argv is pure; running it is :mod:`ale.runner.local`'s job. The sandbox gets no
network namespace access (a fresh, empty network namespace: loopback only), its own PID, IPC
and UTS namespaces, a private size-limited /tmp, its workspace, the read-only task files, the
evaluator's agent socket, and the read-only Python installation that carries ``ale.client``;
nothing else of the host. As root it drops to an unprivileged uid (``setpriv``) with no
capabilities and ``no_new_privs``, so the process-count limit is enforced by the kernel.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import attrs

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


class SandboxUnavailable(RuntimeError):
    """Neither bubblewrap nor unshare can isolate the agent on this machine."""


def _python_roots() -> list[Path]:
    """What the sandbox needs to run Python with ``ale.client``: the interpreter and the packages."""
    import ale

    roots = {Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve()}
    package = Path(ale.__file__).resolve().parent
    if not any(package.is_relative_to(r) for r in roots):
        roots.add(package)  # an editable install: bind the package folder where it is
    # Fold roots that sit inside another root.
    ordered = sorted(roots, key=lambda p: len(p.parts))
    return [r for i, r in enumerate(ordered) if not any(r.is_relative_to(o) for o in ordered[:i])]


def _parents(path: Path) -> list[Path]:
    return [p for p in reversed(path.parents) if str(p) != "/"]


def sandbox_path() -> str:
    return f"{Path(sys.prefix) / 'bin'}:/usr/bin:/bin"


def bwrap_argv(spec: SandboxSpec, *, bwrap: str = "bwrap", as_root: bool | None = None) -> list[str]:
    """The full command line: prlimit, bwrap with its mounts, setpriv (as root), the command."""
    as_root = os.geteuid() == 0 if as_root is None else as_root
    lim = spec.limits
    argv = [
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
    for etc in ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives"):
        if os.path.exists(etc):
            argv += ["--ro-bind", etc, etc]
    made: set[Path] = set()
    for root in _python_roots():
        for parent in _parents(root):
            if parent not in made and not str(parent).startswith("/usr"):
                argv += ["--perms", "0755", "--dir", str(parent)]
                made.add(parent)
        argv += ["--ro-bind", str(root), str(root)]
    argv += [
        "--proc", "/proc",
        "--dev", "/dev",
        "--perms", "1777", "--size", str(lim.tmp_bytes), "--tmpfs", "/tmp",
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


def unshare_argv(spec: SandboxSpec) -> list[str]:
    """The fallback: network, PID, IPC and UTS isolation and limits, but the host's filesystem.

    Weaker than bubblewrap (the agent sees the host's files with its uid's permissions); the
    manifest records which sandbox ran.
    """
    lim = spec.limits
    argv = [
        "prlimit", f"--as={lim.memory_bytes}", f"--nproc={lim.processes}", f"--fsize={lim.file_bytes}",
        f"--nofile={lim.open_files}", "--core=0", "--",
        "unshare", "--net", "--pid", "--ipc", "--uts", "--fork", "--kill-child", "--mount-proc",
        "--", "env", "-i", *[f"{k}={v}" for k, v in sorted(spec.env.items())],
    ]  # fmt: skip
    if os.geteuid() == 0:
        argv += [
            "setpriv", f"--reuid={SANDBOX_UID}", f"--regid={SANDBOX_UID}", "--clear-groups",
            "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--",
        ]  # fmt: skip
    return argv + list(spec.command)


def detect() -> str:
    """``bwrap`` when bubblewrap works here, else ``unshare``, else SandboxUnavailable."""
    import subprocess

    if shutil.which("bwrap"):
        probe = subprocess.run(
            ["bwrap", "--unshare-net", "--ro-bind", "/", "/", "--", "true"], capture_output=True, timeout=30
        )
        if probe.returncode == 0:
            return "bwrap"
    if shutil.which("unshare"):
        probe = subprocess.run(["unshare", "--net", "--pid", "--fork", "--", "true"], capture_output=True, timeout=30)
        if probe.returncode == 0:
            return "unshare"
    raise SandboxUnavailable("neither bubblewrap (apt-get install bubblewrap) nor unshare --net works on this machine")
