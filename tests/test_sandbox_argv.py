"""The bubblewrap command line: mount order and what is bound."""

from __future__ import annotations

from pathlib import Path

from ale.runner import sandbox
from ale.runner.sandbox import SandboxSpec, bwrap_argv


def _spec(tmp_path: Path) -> SandboxSpec:
    return SandboxSpec(
        command=("true",),
        workspace=tmp_path / "ws",
        workspace_writable=True,
        task_dir=tmp_path / "task",
        evaluator_socket=tmp_path / "a.sock",
        env={"PATH": "/usr/bin"},
    )


def test_private_tmp_is_mounted_before_python_roots_under_tmp(tmp_path: Path, monkeypatch) -> None:
    """A checkout under the host's /tmp (a CI clone) must not be hidden by the sandbox's /tmp."""
    checkout = Path("/tmp/some-ci-clone/ale")
    monkeypatch.setattr(sandbox, "_python_roots", lambda: [Path("/usr/lib/python3"), checkout])
    argv = bwrap_argv(_spec(tmp_path), as_root=True)
    tmpfs = argv.index("--tmpfs")
    assert argv[tmpfs + 1] == "/tmp"
    binds = [i for i, a in enumerate(argv) if a == "--ro-bind" and argv[i + 1] == str(checkout)]
    assert binds, "the checkout is bound"
    assert all(i > tmpfs for i in binds)


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


def test_a_limited_tmp_is_bound_before_python_roots_under_tmp(tmp_path: Path, monkeypatch) -> None:
    checkout = Path("/tmp/some-ci-clone/ale")
    monkeypatch.setattr(sandbox, "_python_roots", lambda: [Path("/usr/lib/python3"), checkout])
    argv = bwrap_argv(_spec(tmp_path), as_root=True, tmp_dir=Path("/tmp/ale-tmp-x"))
    bind = argv.index("/tmp/ale-tmp-x")
    assert argv[bind - 1 : bind + 2] == ["--bind", "/tmp/ale-tmp-x", "/tmp"]
    assert "--tmpfs" not in argv
    assert all(i > bind for i, a in enumerate(argv) if a == "--ro-bind" and argv[i + 1] == str(checkout))


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
