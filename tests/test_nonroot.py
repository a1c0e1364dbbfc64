"""``ale run`` by a user who is not root: the sandbox still runs (bubblewrap in a user namespace,
the seccomp filter), and what needs root (a uid of the run's own, mounted filesystems, and cgroups
where the user may not create any) is attested as missing with its reason, never silently.

The test runs the real CLI as ``nobody`` (uid 65534) through ``setpriv``. It needs root to switch
to that user and a project interpreter that user can reach; ``.ci/run`` makes the folders on the
way to it traversable, so in CI it never skips.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from sandbox_tools import missing, need_bwrap

from ale.core.bundle import unpack
from ale.runner import agent_env
from ale.runner.inspect import read_identity

NOBODY = 65534
ALE = Path(sys.executable).with_name("ale")
AGENT = (
    "import os, numpy as np; from ale.policy import linear_policy; "
    "open(os.environ['ALE_WORKSPACE'] + '/policy.safetensors', 'wb')"
    ".write(linear_policy(np.array([[0, 0, 0, 0], [0, 0.5, 10, 2.0]]), output='discrete'))"
)


def as_nobody(*argv: str, home: Path, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "XDG_CACHE_HOME": str(home / "cache"), "TMPDIR": str(home)}
    return subprocess.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "env", "-i",
         *(f"{k}={v}" for k, v in env.items()), *argv],
        capture_output=True, text=True, timeout=timeout, cwd=home, check=False,
    )  # fmt: skip


@pytest.fixture
def home() -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("switching to another user needs root (this process is already not root)")
    need_bwrap()
    if shutil.which("setpriv") is None:
        missing("setpriv is not installed (apt-get install util-linux)")
    path = Path(tempfile.mkdtemp(prefix="ale-nonroot-"))
    path.chmod(0o777)
    try:
        probe = as_nobody(sys.executable, "-c", "import ale.runner.cli", home=path, timeout=60)
        if probe.returncode != 0:
            missing(
                f"uid {NOBODY} cannot run the project's interpreter {sys.executable} (make the folders on "
                f"the way to it and to the checkout traversable: chmod o+x): {probe.stderr.strip()[-300:]}"
            )
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_a_run_by_a_user_who_is_not_root_completes_and_attests_what_it_lacks(home: Path) -> None:
    out = home / "out"
    proc = as_nobody(
        str(ALE), "run", "cartpole-balance", "--plain", "--episodes", "2", "--out", str(out),
        "--agent-cmd", f'{agent_env.PYTHON} -c "{AGENT}"', home=home,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    bundle = Path(proc.stdout.strip().splitlines()[-1])
    files = unpack(bundle.read_bytes(), read_identity(bundle.with_suffix(".key")))
    manifest = json.loads(files["manifest.json"])
    (task,) = manifest["tasks"]
    assert task["agent"]["exit_status"] == 0
    isolation = manifest["runtime"]["isolation"]
    assert isolation["seccomp"]["in_force"] is True  # a filter needs no privilege
    for facility in ("uid", "filesystems"):
        assert isolation[facility]["in_force"] is False
        assert isolation[facility]["reason"].startswith("not root")
    if not isolation["cgroup"]["in_force"]:  # unless a delegated cgroup is writable by that user
        assert "rlimits" in isolation["cgroup"]["reason"]
    results = json.loads(files["task_results.json"])
    assert results["tasks"][0]["status"] == "completed"
