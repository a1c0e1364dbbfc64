"""The bubblewrap command line: mount order and what is bound."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from ale.runner import agent_env, sandbox
from ale.runner.agent_env import AgentEnv, Interpreter
from ale.runner.runtime import (
    GATEWAY_PORT,
    GATEWAY_SOCKET_PATH,
    Network,
    SandboxSpec,
    gateway_attachment_env,
    sandbox_path,
)
from ale.runner.sandbox import bwrap_argv

INTERPRETER = Interpreter(
    executable="/tmp/ci-tool-cache/python3.11/bin/python3.11",
    version="3.11",
    binds=("/tmp/ci-tool-cache/python3.11/bin/python3.11", "/tmp/ci-tool-cache/python3.11/lib"),
    hidden=("/tmp/ci-tool-cache/python3.11/lib/python3.11/site-packages", "/usr/lib/python3/dist-packages"),
)


def _env(tmp_path: Path) -> AgentEnv:
    return AgentEnv(
        root=tmp_path / "agent-env",
        digest="0" * 64,
        interpreter=INTERPRETER,
        modules=("ale", "ale.client"),
        distributions=("numpy==2.0",),
    )


def _spec(tmp_path: Path) -> SandboxSpec:
    return SandboxSpec(
        command=("true",),
        workspace=tmp_path / "ws",
        workspace_writable=True,
        task_dir=tmp_path / "task",
        evaluator_socket=tmp_path / "a.sock",
        env={"PATH": "/usr/bin"},
        agent_env=_env(tmp_path),
    )


def _ro_binds(argv: list[str]) -> list[tuple[int, str, str]]:
    return [(i, argv[i + 1], argv[i + 2]) for i, a in enumerate(argv) if a == "--ro-bind"]


def test_private_tmp_is_mounted_before_an_interpreter_under_tmp(tmp_path: Path) -> None:
    """An interpreter under the host's /tmp (a CI tool cache) must not be hidden by the sandbox's /tmp."""
    argv = bwrap_argv(_spec(tmp_path), as_root=True)
    tmpfs = argv.index("--tmpfs")
    assert argv[tmpfs + 1] == "/tmp"
    binds = [i for i, src, _ in _ro_binds(argv) if src.startswith("/tmp/ci-tool-cache")]
    assert len(binds) == 2, "the interpreter's binary and its lib folder are bound"
    assert all(i > tmpfs for i in binds)


def test_agent_env_is_mounted_read_only_at_its_mount_point(tmp_path: Path) -> None:
    argv = bwrap_argv(_spec(tmp_path), as_root=True)
    assert (str(tmp_path / "agent-env"), agent_env.MOUNT_POINT) in [(s, d) for _, s, d in _ro_binds(argv)]
    assert sandbox_path().startswith(f"{agent_env.MOUNT_POINT}/bin:")


def test_hidden_folders_are_covered_by_the_empty_folder_after_their_tree(tmp_path: Path) -> None:
    """The base installation's site-packages lies inside a bound tree: an empty folder goes over it, later."""
    argv = bwrap_argv(_spec(tmp_path), as_root=True)
    binds = _ro_binds(argv)
    empty = str(tmp_path / "agent-env" / "empty")
    for hidden in INTERPRETER.hidden:
        over = [i for i, src, dst in binds if dst == hidden]
        assert over, hidden
        assert all(binds[[b[0] for b in binds].index(i)][1] == empty for i in over)
        containing = [i for i, src, dst in binds if hidden.startswith(dst + "/")]
        assert containing, f"{hidden} is inside a bound tree"
        assert max(containing) < min(over), "the empty folder must come after the tree it covers"


def test_no_host_python_install_is_bound(tmp_path: Path) -> None:
    """Only the system trees, the interpreter's own files, /etc pieces, the agent's environment and the task."""
    spec = _spec(tmp_path)
    argv = bwrap_argv(spec, as_root=True)
    allowed = {"/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", *INTERPRETER.binds}
    allowed |= {str(spec.agent_env.root), str(spec.agent_env.empty), str(spec.task_dir), str(spec.workspace)}
    for _, src, _dst in _ro_binds(argv):
        assert src in allowed or src.startswith("/etc/"), src
    assert not any(a.endswith("site-packages") for _, a, _ in _ro_binds(argv)), "no host site-packages as a source"


def test_a_spec_without_an_agent_env_is_refused(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    import attrs

    with pytest.raises(ValueError, match="agent_env"):
        bwrap_argv(attrs.evolve(spec, agent_env=None), as_root=True)


def test_root_drops_to_the_sandbox_uid_without_capabilities(tmp_path: Path) -> None:
    argv = bwrap_argv(_spec(tmp_path), as_root=True)
    setpriv = next(i for i, a in enumerate(argv) if a.endswith("setpriv"))
    assert f"--reuid={sandbox.SANDBOX_UID}" in argv[setpriv:]
    assert "--inh-caps=-all" in argv[setpriv:]
    assert "--no-new-privs" in argv[setpriv:]
    assert "--unshare-net" in argv
    assert argv[argv.index("--") + 1 :] != []


def test_timeout_bounds_the_sandbox_beyond_its_wall_time(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    argv = bwrap_argv(spec)
    assert argv[0].endswith("timeout")
    assert argv[1] == "--kill-after=5"
    assert int(argv[2]) == int(spec.wall_time_s) + 30


def test_a_limited_tmp_is_bound_before_an_interpreter_under_tmp(tmp_path: Path) -> None:
    """The size- and inode-limited /tmp (a host folder) too comes before the interpreter's binds."""
    argv = bwrap_argv(_spec(tmp_path), as_root=True, tmp_dir=Path("/tmp/ale-tmp-x"))
    bind = argv.index("/tmp/ale-tmp-x")
    assert argv[bind - 1 : bind + 2] == ["--bind", "/tmp/ale-tmp-x", "/tmp"]
    assert "--tmpfs" not in argv
    binds = [i for i, src, _ in _ro_binds(argv) if src.startswith("/tmp/ci-tool-cache")]
    assert len(binds) == 2
    assert all(i > bind for i in binds)


def test_the_sandbox_enters_its_cgroup_before_anything_else(tmp_path: Path) -> None:
    procs = ["/sys/fs/cgroup/memory/x/cgroup.procs", "/sys/fs/cgroup/pids/x/cgroup.procs"]
    argv = bwrap_argv(_spec(tmp_path), as_root=True, cgroup_procs=procs, uid=1879048200)
    assert argv[:3] == ["/bin/sh", "-c", sandbox.ENTER_CGROUP]
    assert argv[4:7] == [*procs, "--"]
    assert argv[7].endswith("timeout")
    assert "--reuid=1879048200" in argv
    assert argv[-1] == "true"


def test_the_cgroup_entry_writes_its_pid_then_execs(tmp_path: Path) -> None:
    import subprocess

    files = [tmp_path / "a", tmp_path / "b"]
    done = subprocess.run(
        ["/bin/sh", "-c", sandbox.ENTER_CGROUP, "enter", *map(str, files), "--", "sh", "-c", "echo $$"],
        capture_output=True,
        text=True,
        check=True,
    )
    pid = done.stdout.strip()
    assert [f.read_text().strip() for f in files] == [pid, pid]  # the same process, before and after exec
    bad = subprocess.run(
        ["/bin/sh", "-c", sandbox.ENTER_CGROUP, "enter", str(tmp_path / "no" / "such"), "--", "true"],
        capture_output=True,
    )
    assert bad.returncode == 125  # cannot enter: does not run the command


def test_bwrap_argv_gives_a_fresh_network_namespace_with_or_without_the_gateway(tmp_path: Path) -> None:
    """Network.NONE is --unshare-net and nothing else; GATEWAY adds the socket's mount, the relay
    before the command (after the uid drop, so it runs unprivileged) and the two attachment variables."""
    plain = bwrap_argv(_spec(tmp_path), as_root=True)
    assert "--unshare-net" in plain
    assert GATEWAY_SOCKET_PATH not in plain
    assert "ale._relay" not in plain
    assert plain[-1] == "true"
    gateway = attrs.evolve(_spec(tmp_path), network=Network.GATEWAY, gateway_socket=tmp_path / "gw.sock")
    argv = bwrap_argv(gateway, as_root=True)
    assert "--unshare-net" in argv
    assert "--share-net" not in argv
    mount = argv.index(GATEWAY_SOCKET_PATH)
    assert argv[mount - 2 : mount + 1] == ["--bind", str(tmp_path / "gw.sock"), GATEWAY_SOCKET_PATH]
    relay = [f"{agent_env.MOUNT_POINT}/bin/python3", "-I", "-m", "ale._relay", str(GATEWAY_PORT), GATEWAY_SOCKET_PATH]
    assert argv[-8:] == [*relay, "--", "true"]
    assert argv.index("--no-new-privs") < argv.index("ale._relay")
    env = {argv[i + 1]: argv[i + 2] for i, a in enumerate(argv) if a == "--setenv"}
    assert env == {"PATH": "/usr/bin", **gateway_attachment_env()}


def test_bwrap_argv_refuses_an_attachment_it_lacks(tmp_path: Path) -> None:
    class Other:
        value = "vpn"

    odd = attrs.evolve(_spec(tmp_path), network=Network.GATEWAY, gateway_socket=tmp_path / "gw.sock")
    object.__setattr__(odd, "network", Other())
    with pytest.raises(ValueError, match="'vpn' network attachment"):
        bwrap_argv(odd, as_root=True)
