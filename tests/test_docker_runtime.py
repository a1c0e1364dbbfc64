"""The docker runtime on a real engine: the docker CLI against ``podman system service`` as
``DOCKER_HOST`` (.ci/run starts one). The conformance suite and the isolation tests run against it
from the registry (tests/test_runtime_conformance.py and the others); these are what only the
docker path shows: what the engine adds that the runtime takes away again, and what it leaves."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from oci_images import prepare
from sandbox_tools import missing

from ale.runner import oci
from ale.runner.conformance import Box, Lines
from ale.runner.oci import DockerRuntime

ROOT = Path(__file__).resolve().parents[1]


def test_ci_installs_the_docker_cli_and_serves_it_podmans_engine() -> None:
    """The docker tests must not skip in CI: .ci/run installs docker.io (its engine kept from starting)
    and points DOCKER_HOST at a podman system service it starts."""
    ci = (ROOT / ".ci" / "run").read_text()
    install = next(line for line in ci.splitlines() if line.strip().startswith("for pkg in"))
    assert "docker.io" in install.replace(";", " ").split()
    assert "exit 101" in ci  # policy-rc.d: no daemon starts on install
    assert "podman system service --time=0 unix:///run/ale-ci/podman.sock &" in ci
    assert "export DOCKER_HOST=unix:///run/ale-ci/podman.sock" in ci


@pytest.fixture(scope="module")
def docker_runtime() -> Iterator[DockerRuntime]:
    if (why := prepare("docker")) is not None:
        missing(why)
    runtime = DockerRuntime()
    runtime.check()
    yield runtime
    runtime.close()


@pytest.fixture
def box() -> Iterator[Box]:
    folder = Path(tempfile.mkdtemp(prefix="ale-dk-"))
    made = Box(folder)
    try:
        yield made
    finally:
        made.close()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.slow
def test_docker_attests_the_cli_and_the_engine_behind_it(docker_runtime: DockerRuntime) -> None:
    att = docker_runtime.attestation()
    assert att["runtime"] == att["sandbox"] == "docker"
    engine = att["engine"]
    assert engine["name"] == "docker"
    assert engine["version"]
    assert engine["server"].startswith("Podman Engine ")
    assert engine["oci_runtime"].startswith("runc")
    assert set(att["images"]["images"]) == {"agent-base", "evaluator"}


WRITABLE = r"""
import json, os
r = {}
for path in ("/run", "/var/tmp", "/tmp", "/workspace", "/", "/etc", "/ale"):
    try:
        with open(os.path.join(path, "probe"), "w") as fh:
            fh.write("x")
        r[path] = "written"
    except OSError as exc:
        r[path] = type(exc).__name__
r["env"] = sorted(os.environ)
print("REPORT " + json.dumps(r), flush=True)
"""


@pytest.mark.slow
async def test_docker_sandbox_has_no_writable_place_but_workspace_and_tmp(
    docker_runtime: DockerRuntime, box: Box
) -> None:
    """The engine mounts writable tmpfs on /run and /var/tmp of a read-only container and adds its own
    variables (container, TERM, HOSTNAME, the image's ENV): the runtime covers the one and drops the other."""
    lines = Lines()
    result = await docker_runtime.run_sandboxed(box.spec(WRITABLE), lines)
    assert result.exit_status == 0, lines.lines
    report = lines.report()
    assert report.pop("env") == ["ALE_EVENT_FD", "ALE_TEST", "HOME", "PATH"]
    assert report == {
        "/run": "OSError", "/var/tmp": "OSError", "/tmp": "written", "/workspace": "written", "/": "OSError",
        "/etc": "OSError", "/ale": "OSError",
    }  # fmt: skip


@pytest.mark.slow
async def test_docker_exit_status_survives_the_container_removal(docker_runtime: DockerRuntime, box: Box) -> None:
    """``docker run --rm`` against podman's service reports 0 for a container that exited 7: the runtime
    removes its containers itself, after the status is in."""
    for status in (0, 7, 255):
        result = await docker_runtime.run_sandboxed(box.spec(f"import sys; sys.exit({status})"), Lines())
        assert result.exit_status == status


def _container_names() -> list[str]:
    listed = subprocess.run(["docker", "ps", "--all", "--format", "{{json .Names}}"], capture_output=True, text=True)
    return [str(json.loads(line)) for line in listed.stdout.splitlines() if line.strip()]


@pytest.mark.slow
async def test_docker_leaves_no_container_or_folder_behind(docker_runtime: DockerRuntime, box: Box) -> None:
    docker_runtime.close()  # what it ran before is gone; other runtimes of this process may still be removing theirs
    pid = f"-{os.getpid()}-"
    before = {n for n in _container_names() if pid in n} | {p.name for p in oci.STATE_DIR.iterdir() if pid in p.name}
    await docker_runtime.run_sandboxed(box.spec("print('hello')"), Lines())
    docker_runtime.prestart_evaluator()
    docker_runtime.close()
    after = {n for n in _container_names() if pid in n} | {p.name for p in oci.STATE_DIR.iterdir() if pid in p.name}
    assert after - before == set()
