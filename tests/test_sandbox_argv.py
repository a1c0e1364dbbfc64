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
