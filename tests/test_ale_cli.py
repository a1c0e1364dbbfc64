"""The ``ale`` command line end to end: help, ``tasks``, ``run`` and ``inspect`` as a user runs them.

Two real runs (module fixtures): the demo agent with a new local key, and the random agent
encrypted to a recipient the test holds. Everything else reads their bundles.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import attrs
import pyrage
import pytest

from ale import catalog
from ale.core.bundle import ALLOWED_FILES

CARTPOLE = "cartpole-balance"
RUN_ID = re.compile(r"^run-\d{8}T\d{6}Z-[0-9a-f]{8}$")


def ale(*args: str, cwd: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("ALE_RECIPIENT", "CI")}
    return subprocess.run(
        [sys.executable, "-m", "ale.runner.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@attrs.frozen
class Bundle:
    path: Path
    identity: Path  # an age identity file that opens it
    run: subprocess.CompletedProcess[str]

    @property
    def run_id(self) -> str:
        return self.path.name.removesuffix(".ale")

    def inspect_json(self) -> dict[str, Any]:
        proc = ale("inspect", str(self.path), "--identity", str(self.identity), "--json")
        assert proc.returncode == 0, proc.stderr
        return dict(json.loads(proc.stdout))


def _run(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    out = tmp / "out"
    return ale("run", CARTPOLE, "--plain", "--out", str(out), "--agent-time", "60", *args, cwd=tmp)


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Bundle:
    tmp = tmp_path_factory.mktemp("demo")
    proc = _run(tmp, "--episodes", "3")
    assert proc.returncode == 0, proc.stderr
    path = Path(proc.stdout.strip().splitlines()[-1])
    return Bundle(path=path, identity=path.with_name(path.name.removesuffix(".ale") + ".key"), run=proc)


@pytest.fixture(scope="module")
def recipient_identity(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    identity = pyrage.x25519.Identity.generate()
    path = tmp_path_factory.mktemp("identity") / "site.key"
    path.write_text(f"# a test site's identity\n{identity}\n")
    return path, str(identity.to_public())


@pytest.fixture(scope="module")
def random_run(tmp_path_factory: pytest.TempPathFactory, recipient_identity: tuple[Path, str]) -> Bundle:
    tmp = tmp_path_factory.mktemp("random")
    key_path, public = recipient_identity
    proc = _run(tmp, "--agent", "random", "--episodes", "10", "--recipient", public, "--runtime", "local")
    assert proc.returncode == 0, proc.stderr
    return Bundle(path=Path(proc.stdout.strip().splitlines()[-1]), identity=key_path, run=proc)


# --- help and tasks ----------------------------------------------------------------------------------


@pytest.mark.parametrize("command", [[], ["run"], ["inspect"], ["tasks"]], ids=["ale", "run", "inspect", "tasks"])
def test_every_command_has_help(command: list[str]) -> None:
    proc = ale(*command, "--help")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"usage: ale {' '.join(command)}".rstrip())
    assert len(proc.stdout.splitlines()) > 3
    if not command:
        for sub in ("run", "inspect", "tasks"):
            assert sub in proc.stdout
    if command == ["run"]:
        options = ("--agent-cmd", "--recipient", "--out", "--episodes", "--agent-time", "--release-file", "--runtime")
        for option in options:
            assert option in proc.stdout


def test_console_script_is_installed() -> None:
    script = Path(sys.prefix) / "bin" / "ale"
    assert script.is_file()
    proc = subprocess.run([str(script), "--version"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("ale ")


def _task_lines(stdout: str) -> dict[str, bool]:
    """ref -> marked required, from `ale tasks`."""
    found = {}
    for line in stdout.splitlines():
        m = re.match(r"^([* ]) (\S+@\S+)\s", line)
        if m:
            found[m.group(2)] = m.group(1) == "*"
    return found


def test_tasks_lists_the_four_tasks_and_marks_the_required_ones() -> None:
    proc = ale("tasks")
    assert proc.returncode == 0, proc.stderr
    listed = _task_lines(proc.stdout)
    assert set(listed) == {t.spec.ref for t in catalog.tasks().values()}
    assert len(listed) == 4
    release, _ = catalog.release()
    assert {ref for ref, required in listed.items() if required} == set(release.required_tasks)
    for task in catalog.tasks().values():
        line = next(x for x in proc.stdout.splitlines() if task.spec.ref in x)
        assert task.spec.mode in line
        assert task.spec.headline.metric in line
    assert f"release {release.release}" in proc.stdout


def test_tasks_marks_follow_the_release(tmp_path: Path) -> None:
    doc = json.loads(catalog.release_bytes())
    doc["release"] = "test.1"
    doc.pop("images_lock")  # a variant of the release's targets, pinning no images
    doc["required_tasks"] = ["cartpole-balance@1.0.0", "pendulum-lqr@1.0.0"]
    path = tmp_path / "release.json"
    path.write_text(json.dumps(doc))
    proc = ale("tasks", "--release-file", str(path))
    assert proc.returncode == 0, proc.stderr
    listed = _task_lines(proc.stdout)
    assert {ref for ref, required in listed.items() if required} == {"cartpole-balance@1.0.0", "pendulum-lqr@1.0.0"}
    assert "release test.1" in proc.stdout


# --- run ---------------------------------------------------------------------------------------------


def test_run_prints_the_bundle_path(demo: Bundle) -> None:
    lines = demo.run.stdout.splitlines()
    assert len(lines) == 1  # stdout is the path alone: scripts can use it
    assert demo.path.is_absolute() or (Path.cwd() / demo.path).exists()
    assert demo.path.suffix == ".ale"
    assert RUN_ID.match(demo.run_id)
    assert demo.path.is_file()
    # No --recipient: a new local key beside the bundle, private to its owner.
    assert demo.identity.is_file()
    assert demo.identity.stat().st_mode & 0o777 == 0o600
    assert "AGE-SECRET-KEY-1" in demo.identity.read_text()
    assert sorted(p.name for p in demo.path.parent.iterdir()) == sorted([demo.path.name, demo.identity.name])
    assert [p.name for p in demo.path.parent.parent.iterdir()] == ["out"]  # nothing in the working folder
    err = demo.run.stderr
    assert "cartpole-balance@1.0.0: mean_return" in err
    assert "macro mean" in err
    assert str(demo.identity) in err


@pytest.mark.parametrize("name", ["rkt", "no-such-runtime"])
def test_run_with_an_unknown_runtime_is_one_line_naming_the_known_ones(tmp_path: Path, name: str) -> None:
    proc = _run(tmp_path, "--runtime", name)
    assert proc.returncode == 2
    known = "docker, local, podman"
    assert proc.stderr.splitlines() == [f"ale: error: --runtime: unknown runtime {name!r}; known runtimes: {known}"]
    assert proc.stdout == ""
    assert not (tmp_path / "out").exists()  # refused before anything was made


def test_run_records_the_runtime_it_was_given(random_run: Bundle) -> None:
    """``--runtime local``: the manifest's runtime.runtime is the registry name."""
    doc = random_run.inspect_json()
    assert doc["runtime"]["runtime"] == "local"


# --- inspect -----------------------------------------------------------------------------------------


def test_inspect_shows_the_run(demo: Bundle) -> None:
    proc = ale("inspect", str(demo.path), "--identity", str(demo.identity))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"run {demo.run_id}  agent ale-demo")
    assert "cartpole-balance@1.0.0: completed, mean_return = " in proc.stdout
    assert "passed 3/3" in proc.stdout
    assert "offline checks passed: decryption" in proc.stdout
    # what could not be proven offline is said, never passed over (a run without a site has no challenge)
    assert "not checked: challenge: the run has none" in proc.stdout
    assert "all offline checks passed" not in proc.stdout


def test_inspect_json(demo: Bundle) -> None:
    doc = demo.inspect_json()
    assert doc["run_id"] == demo.run_id
    assert doc["agent"]["name"] == "ale-demo"
    assert doc["release"]["name"] == catalog.DEFAULT_RELEASE
    (task,) = doc["tasks"]
    assert task["task"] == "cartpole-balance@1.0.0"
    assert task["status"] == "completed"
    assert task["episodes"] == 3
    assert doc["trajectory"]["events"] > 5
    assert re.fullmatch(r"[0-9a-f]{64}", doc["trajectory"]["chain_head"])
    assert isinstance(doc["aggregate"]["macro_mean"], float | int)
    assert doc["aggregate"]["covered"] == ["cartpole-balance@1.0.0"]


def test_inspect_with_the_wrong_identity(demo: Bundle, tmp_path: Path) -> None:
    other = tmp_path / "other.key"
    other.write_text(f"{pyrage.x25519.Identity.generate()}\n")
    proc = ale("inspect", str(demo.path), "--identity", str(other))
    assert proc.returncode == 1
    assert "decrypt_failed" in proc.stderr
    assert proc.stdout == ""


@pytest.mark.parametrize("where", ["last", "middle"])
def test_inspect_a_tampered_bundle(demo: Bundle, tmp_path: Path, where: str) -> None:
    data = bytearray(demo.path.read_bytes())
    at = len(data) - 1 if where == "last" else len(data) // 2
    data[at] ^= 0x01
    tampered = tmp_path / "tampered.ale"
    tampered.write_bytes(bytes(data))
    proc = ale("inspect", str(tampered), "--identity", str(demo.identity))
    assert proc.returncode == 1
    assert "fails verification" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stdout == ""


def test_inspect_without_a_readable_identity(demo: Bundle, tmp_path: Path) -> None:
    proc = ale("inspect", str(demo.path), "--identity", str(tmp_path / "missing.key"))
    assert proc.returncode == 2
    assert "cannot read the identity file" in proc.stderr
    not_a_key = tmp_path / "not-a-key"
    not_a_key.write_text("hello\n")
    proc = ale("inspect", str(demo.path), "--identity", str(not_a_key))
    assert proc.returncode == 2
    assert "holds no age identity" in proc.stderr


@pytest.mark.skipif(
    not all(shutil.which(t) for t in ("age", "zstd", "tar")), reason="the reference age, zstd and tar CLIs are needed"
)
def test_reference_clis_open_the_bundle(demo: Bundle) -> None:
    age = subprocess.run(
        ["age", "-d", "-i", str(demo.identity), str(demo.path)], capture_output=True, check=True, timeout=60
    )
    tar = subprocess.run(["zstd", "-d", "-c"], input=age.stdout, capture_output=True, check=True, timeout=60)
    listing = subprocess.run(["tar", "t"], input=tar.stdout, capture_output=True, check=True, timeout=60)
    assert listing.stdout.decode().split() == list(ALLOWED_FILES)


# --- a run encrypted to a recipient, and the random baseline --------------------------------------------


def test_run_with_a_recipient_opens_with_that_identity(random_run: Bundle, demo: Bundle) -> None:
    assert random_run.path.is_file()
    assert list(random_run.path.parent.glob("*.key")) == []  # no local key when a recipient is given
    assert "no --recipient given" not in random_run.run.stderr
    doc = random_run.inspect_json()
    assert doc["run_id"] == random_run.run_id
    assert doc["agent"]["name"] == "ale-random"
    # Only the recipient opens it.
    proc = ale("inspect", str(random_run.path), "--identity", str(demo.identity))
    assert proc.returncode == 1
    assert "decrypt_failed" in proc.stderr


def test_random_agent_scores_worse_than_demo(random_run: Bundle, demo: Bundle) -> None:
    random_doc, demo_doc = random_run.inspect_json(), demo.inspect_json()
    (random_task,) = random_doc["tasks"]
    assert random_task["status"] == "completed"  # the baseline does leave a policy
    (random_score,) = random_doc["scores"]
    (demo_score,) = demo_doc["scores"]
    assert random_score["measured"] < demo_score["measured"]
    assert random_score["final"] < demo_score["final"]
    assert random_doc["aggregate"]["macro_mean"] < demo_doc["aggregate"]["macro_mean"]
