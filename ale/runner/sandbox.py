"""The agent sandbox of the local runtime: a bubblewrap command line.

Building the argv is pure; running it is :mod:`ale.runner.local`'s job. What goes in (the
:class:`~ale.runner.runtime.SandboxSpec`, its limits and the agent-contract paths) is the runtime
interface's (:mod:`ale.runner.runtime`). The sandbox gets no
network namespace access (a fresh, empty network namespace: loopback only), its own PID, IPC
and UTS namespaces, a private size-limited /tmp, its workspace, the read-only task files, the
evaluator's agent socket, and its own read-only Python environment (:mod:`ale.runner.agent_env`);
nothing else of the host. With the gateway attachment it also gets the gateway's socket, and its
command starts through the relay to it (:mod:`ale._relay`) on its own loopback. Its command runs
under a seccomp filter (:mod:`ale.runner.seccomp`).
As root it drops to an unprivileged uid (``setpriv``) with no
capabilities and ``no_new_privs``, so the process-count limit is enforced by the kernel.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path

from ale.runner.agent_env import MOUNT_POINT as PYTHON_PATH
from ale.runner.agent_env import AgentEnv
from ale.runner.runtime import (
    GATEWAY_PORT,
    GATEWAY_SOCKET_PATH,
    SOCKET_PATH,
    TASK_PATH,
    WORKSPACE_PATH,
    Network,
    SandboxSpec,
    gateway_attachment_env,
)

SANDBOX_UID = 65534  # nobody: the sandbox uid without root (and without a claimed per-run uid)


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
    argv += _system_mounts()
    # The private /tmp comes before the interpreter's binds: an interpreter installed under the
    # host's /tmp (a CI runner's tool cache, say) must stay visible on top of it.
    if tmp_dir is not None:
        argv += ["--bind", str(tmp_dir), "/tmp"]
    else:
        argv += ["--perms", "1777", "--size", str(lim.tmp_bytes), "--tmpfs", "/tmp"]
    if spec.agent_env is None:
        raise ValueError("the sandbox needs the agent's Python environment (SandboxSpec.agent_env)")
    argv += _python_mounts(spec.agent_env)
    argv += [
        "--proc", "/proc",
        "--dev", "/dev",
        "--perms", "0755", "--dir", "/ale",
        "--bind", str(spec.evaluator_socket), SOCKET_PATH,
        *_gateway_mount(spec),
        "--ro-bind", str(spec.task_dir), TASK_PATH,
        "--bind" if spec.workspace_writable else "--ro-bind", str(spec.workspace), WORKSPACE_PATH,
        "--chdir", WORKSPACE_PATH,
    ]  # fmt: skip
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    env = spec.env | gateway_attachment_env() if spec.network is Network.GATEWAY else spec.env
    for key, value in sorted(env.items()):
        argv += ["--setenv", key, value]
    argv.append("--")
    if as_root:
        argv += _drop_to(uid)
    return argv + _relayed(spec)


def _gateway_mount(spec: SandboxSpec) -> list[str]:
    """The gateway's socket at GATEWAY_SOCKET_PATH (Network.GATEWAY), else nothing."""
    if spec.network is Network.NONE:
        return []
    if spec.network is not Network.GATEWAY or spec.gateway_socket is None:
        raise ValueError(f"the local runtime's sandbox has no {spec.network.value!r} network attachment")
    return ["--bind", str(spec.gateway_socket), GATEWAY_SOCKET_PATH]


def _relayed(spec: SandboxSpec) -> list[str]:
    """The command, started through the relay to the gateway socket when the sandbox has one
    (:mod:`ale._relay`: it binds the port, then execs the command in its own process)."""
    if spec.network is not Network.GATEWAY:
        return list(spec.command)
    relay = [f"{PYTHON_PATH}/bin/python3", "-I", "-m", "ale._relay", str(GATEWAY_PORT), GATEWAY_SOCKET_PATH, "--"]
    return [*relay, *spec.command]


def _system_mounts() -> list[str]:
    """The host's /bin, /lib... (as links or read-only binds) and the dynamic linker's files in /etc."""
    argv: list[str] = []
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
    return argv


def _drop_to(uid: int) -> list[str]:
    """setpriv: the run's own uid and gid, no groups, no capabilities, no_new_privs."""
    return [
        shutil.which("setpriv") or "/usr/bin/setpriv",
        f"--reuid={uid}",
        f"--regid={uid}",
        "--clear-groups",
        "--inh-caps=-all",
        "--bounding-set=-all",
        "--no-new-privs",
        "--",
    ]


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
