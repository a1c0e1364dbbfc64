"""The agent sandbox of the local runtime: a bubblewrap command line.

Building the argv is pure; running it is :mod:`ale.runner.local`'s job. The sandbox gets no
network namespace access (a fresh, empty network namespace: loopback only), its own PID, IPC
and UTS namespaces, a private size-limited /tmp, its workspace, the read-only task files, the
evaluator's agent socket, and the read-only Python installation that carries ``ale.client``
with the harness's parts of it (:data:`HARNESS_ONLY_IN_PACKAGE`, the bundled agents unless the
agent is one, the evaluator and verifier packages) covered by empty folders; nothing else of the
host. Its command runs under a seccomp filter (:mod:`ale.runner.seccomp`).
As root it drops to an unprivileged uid (``setpriv``) with no
capabilities and ``no_new_privs``, so the process-count limit is enforced by the kernel.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

import attrs

SANDBOX_UID = 65534  # nobody: the sandbox uid without root (and without a claimed per-run uid)
SOCKET_PATH = "/ale/evaluator.sock"
TASK_PATH = "/task"
WORKSPACE_PATH = "/workspace"
EVENT_FD = 3


@attrs.frozen
class Limits:
    memory_bytes: int = 8 * 1024**3  # address space of each process (RLIMIT_AS)
    processes: int = 256  # the sandbox's cgroup pids.max, and RLIMIT_NPROC of the sandbox uid
    file_bytes: int = 1024**3  # largest file (RLIMIT_FSIZE)
    open_files: int = 1024
    tmp_bytes: int = 512 * 1024**2  # the private /tmp
    workspace_bytes: int = 2 * 1024**3  # the workspace filesystem's size, also watched by the runtime
    sandbox_memory_bytes: int = 8 * 1024**3  # all the sandbox's processes together (its memory cgroup)
    cpus: float = 1.0  # CPU quota of the sandbox's cgroup, in CPUs


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
    sees_bundled_agents: bool = False  # the agent is one of ale.agents: their source stays visible


class SandboxUnavailable(RuntimeError):
    """Bubblewrap cannot isolate the agent on this machine."""


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


#: Parts of the installed ``ale`` package that are the harness's, not the agent's: every release
#: manifest (the paper targets), every task's paper and definition, the harness itself, and the
#: bundled agents (reference solutions; visible only to a bundled agent).
HARNESS_ONLY_IN_PACKAGE = ("releases", "tasks", "runner")
BUNDLED_AGENTS_IN_PACKAGE = "agents"
#: The distribution's other packages: the evaluator, the verifier, the site.
HARNESS_ONLY_PACKAGES = ("ale_evaluator", "ale_verify", "ale_site")


def hidden_paths(*, sees_bundled_agents: bool = False) -> list[Path]:
    """Folders inside the sandbox's read-only Python roots that are covered by an empty one."""
    import importlib.util

    import ale

    package = Path(ale.__file__).resolve().parent
    names = HARNESS_ONLY_IN_PACKAGE + (() if sees_bundled_agents else (BUNDLED_AGENTS_IN_PACKAGE,))
    hidden = [package / name for name in names]
    for name in HARNESS_ONLY_PACKAGES:
        spec = importlib.util.find_spec(name)  # finds, does not import
        if spec is not None and spec.submodule_search_locations:
            hidden += [Path(p).resolve() for p in spec.submodule_search_locations]
    roots = _python_roots()
    return [p for p in hidden if p.is_dir() and any(p.is_relative_to(r) for r in roots)]


def _parents(path: Path) -> list[Path]:
    return [p for p in reversed(path.parents) if str(p) != "/"]


def sandbox_path() -> str:
    return f"{Path(sys.prefix) / 'bin'}:/usr/bin:/bin"


#: The first process of a sandbox writes its pid into each cgroup.procs file named before "--",
#: then execs the rest: everything the sandbox starts is in its cgroup from birth.
ENTER_CGROUP = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'


def bwrap_argv(
    spec: SandboxSpec,
    *,
    bwrap: str = "bwrap",
    as_root: bool | None = None,
    seccomp_fd: int | None = None,
    uid: int = SANDBOX_UID,
    tmp_dir: Path | None = None,
    cgroup_procs: Sequence[str] = (),
) -> list[str]:
    """The full command line: the cgroup entry, prlimit, bwrap with its mounts, setpriv (as root), the command.

    ``seccomp_fd`` is a descriptor the caller passes to the child holding the system-call filter
    (:mod:`ale.runner.seccomp`); bwrap installs it on the sandbox's command, so that it and
    everything it starts (the agent, its tools, the policy) runs under it. ``uid`` is the run's
    own uid (as root), ``tmp_dir`` a host folder with a size- and inode-limited filesystem to be
    the sandbox's /tmp (else bwrap's ``--size`` tmpfs), ``cgroup_procs`` the sandbox cgroup's
    ``cgroup.procs`` files.
    """
    as_root = os.geteuid() == 0 if as_root is None else as_root
    lim = spec.limits
    argv = []
    if cgroup_procs:
        argv += ["/bin/sh", "-c", ENTER_CGROUP, "ale-enter-cgroup", *cgroup_procs, "--"]
    # timeout(1) sits between the harness and bwrap: bwrap's --die-with-parent then follows a process
    # that lives as long as the sandbox (not the harness's short-lived spawning thread), and even a
    # harness killed with SIGKILL cannot leave a sandbox running past its wall time.
    argv += [
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
    if tmp_dir is not None:
        argv += ["--bind", str(tmp_dir), "/tmp"]
    else:
        argv += ["--perms", "1777", "--size", str(lim.tmp_bytes), "--tmpfs", "/tmp"]
    made: set[Path] = set()
    for root in _python_roots():
        for parent in _parents(root):
            if parent not in made and not str(parent).startswith("/usr"):
                argv += ["--perms", "0755", "--dir", str(parent)]
                made.add(parent)
        argv += ["--ro-bind", str(root), str(root)]
    for path in hidden_paths(sees_bundled_agents=spec.sees_bundled_agents):
        argv += ["--perms", "0555", "--tmpfs", str(path), "--remount-ro", str(path)]
    argv += [
        "--proc", "/proc",
        "--dev", "/dev",
        "--perms", "0755", "--dir", "/ale",
        "--bind", str(spec.evaluator_socket), SOCKET_PATH,
        "--ro-bind", str(spec.task_dir), TASK_PATH,
        "--bind" if spec.workspace_writable else "--ro-bind", str(spec.workspace), WORKSPACE_PATH,
        "--chdir", WORKSPACE_PATH,
    ]  # fmt: skip
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    for key, value in sorted(spec.env.items()):
        argv += ["--setenv", key, value]
    argv.append("--")
    if as_root:
        argv += [
            shutil.which("setpriv") or "/usr/bin/setpriv",
            f"--reuid={uid}",
            f"--regid={uid}",
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
