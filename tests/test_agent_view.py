"""What an agent can read (docs/agent-contract.md, "What the agent can read"), from inside real runs.

An agent walks every path it can read (``os.walk`` from ``/``, no symlinks followed, every
readable regular file up to 1 MiB; /proc, /sys and /dev left out) and looks for two kinds of
needles from the harness-only files on the host:

* marker strings: lines of the release manifests (the paper targets), of the other tasks'
  papers, the bundled agents, the harness, the evaluator, the verifier, the checkout and host
  packages outside the client's closure, and random strings planted in the output folder, the
  working folder and the run folder's parent (they reach the agent hex-encoded, so its own
  command line never holds them);
* whole files: every harness-only file of the project (64 bytes or more) by size and SHA-256.

It finds none, while controls prove the walk would have: a line of its own paper and of the
client library (and of the bundled agents, for a bundled agent) are found. Two agents walk: a
custom ``--agent-cmd`` one through the ``ale`` CLI, and one that runs as a bundled agent would
(its environment holds the demo's modules) through the harness. Then the bundled demo agent
solves an interactive task through ``ale run`` (its policy script run by the sandbox's python).

Last, the same whole-file check through the runtime interface alone, against every backend of the
conformance suite (tests/sandbox_tools.py): the backend's default environment (the client library
alone) and a bundled agent's, each given only a ``SandboxSpec``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import os
import re
import secrets
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
import zstandard
from sandbox_box import Box, Lines
from sandbox_tools import backends, make_runtime, need_bwrap

import ale
from ale import catalog
from ale.core.bundle import unpack
from ale.runner import agent_env
from ale.runner.harness import Harness
from ale.runner.inspect import read_identity
from ale.runner.local import LocalRuntime
from ale.runner.options import AgentSpec, RunOptions
from ale.runner.progress import PlainProgress

TASK = "cartpole-balance"
CHECKOUT = Path(__file__).resolve().parents[1]
PACKAGE = Path(ale.__file__).resolve().parent
REPORT_PREFIX = "ALE-VIEW-REPORT "
WALK_CAP = 1 << 20
MIN_MARKER = 40
VERSION = f"{sys.version_info[0]}.{sys.version_info[1]}"

WALKER = r"""
import hashlib, json, os, stat, sys

MARKERS = {k: [bytes.fromhex(h) for h in v] for k, v in json.loads(bytes.fromhex(__MARKERS__)).items()}
FILES = {(size, digest): name for name, size, digest in __FILES__}
SIZES = {size for size, _ in FILES}
CAP = __CAP__
SKIP = {"/proc", "/sys", "/dev"}
hits = {k: [] for k in MARKERS}
whole_files = []
seen, files, nbytes, unreadable, read_under = set(), 0, 0, 0, set()
for root, dirs, names in os.walk("/", onerror=lambda e: None):
    dirs[:] = sorted(d for d in dirs if os.path.join(root, d) not in SKIP)
    for name in names:
        path = os.path.join(root, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) in seen:
            continue
        seen.add((st.st_dev, st.st_ino))
        try:
            with open(path, "rb") as fh:
                data = fh.read(CAP)
        except OSError:
            unreadable += 1
            continue
        files += 1
        nbytes += len(data)
        read_under.add("/".join(path.split("/")[:3]))
        for key, needles in MARKERS.items():
            if len(hits[key]) < 5 and any(n in data for n in needles):
                hits[key].append(path)
        if st.st_size in SIZES and st.st_size <= CAP:
            name = FILES.get((st.st_size, hashlib.sha256(data).hexdigest()))
            if name is not None:
                whole_files.append([path, name])

imports = {}
for module in ("ale.client", "ale.policy", "ale.protocol", "ale.runner", "ale.agents.demo", "ale.core.release",
               "ale_evaluator", "ale_verify", "trio", "mujoco", "quart"):
    try:
        __import__(module)
        imports[module] = "ok"
    except ImportError as exc:
        imports[module] = type(exc).__name__

from ale.client import AleEnvClient

client = AleEnvClient(os.environ["ALE_EVALUATOR"])
served = client.get_spec().task_id
client.close()
report = {"hits": hits, "whole_files": whole_files[:20], "files": files, "bytes": nbytes, "unreadable": unreadable,
          "read_under": sorted(read_under), "imports": imports, "served": served, "executable": sys.executable,
          "prefix": sys.prefix, "path": sys.path}
print(__PREFIX__ + json.dumps(report), flush=True)
"""


# --- the markers ------------------------------------------------------------------------------------


def _longest_lines(path: Path, n: int, allowed: str) -> list[str]:
    """The ``n`` longest distinct lines of a file (stripped, long enough, not comments: those repeat
    across projects), none of which an allowed file holds."""
    lines = {line.strip() for line in path.read_text(encoding="utf-8").splitlines()}
    lines = {ln for ln in lines if len(ln) >= MIN_MARKER and not ln.startswith("#") and ln not in allowed}
    fit = sorted(lines, key=lambda ln: (-len(ln), ln))
    assert fit, f"{path} has no line to take a marker from"
    return fit[:n]


def _allowed_text() -> str:
    """What the agent may read of the project: its task's files and the client library's modules."""
    env = agent_env.ensure()
    parts = [catalog.get_task(TASK).paper]
    site = env.root / f"lib/python{env.interpreter.version}/site-packages"
    parts += [p.read_text(encoding="utf-8") for p in (site / "ale").rglob("*.py*") if p.suffix in (".py", ".pyi")]
    return "\n".join(parts)


def _module_file(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    assert spec is not None, f"{name} is not installed"
    assert spec.origin, f"{name} has no file"
    return Path(spec.origin)


def forbidden_markers(planted: dict[str, Path], *, bundled: bool) -> dict[str, list[str]]:
    """Marker strings of harness-only files, by what they stand for."""
    allowed = _allowed_text()
    markers: dict[str, list[str]] = {}
    release = [
        line.strip()
        for path in sorted((PACKAGE / "releases").glob("*.json"))
        for line in path.read_text().splitlines()
        if '"paper_value"' in line
    ]
    assert release, "no paper targets found in ale/releases"
    markers["release manifest (paper targets)"] = release
    for _ref, task in sorted(catalog.tasks().items()):
        if task.spec.id != TASK:
            markers[f"another task's paper ({task.spec.id})"] = _longest_lines(
                PACKAGE / "tasks" / task.spec.id / "paper.md", 1, allowed
            )
    if not bundled:
        markers["bundled agents (ale/agents)"] = _agent_markers(allowed)
    markers["harness (ale/runner)"] = [
        m
        for name in ("harness.py", "sandbox.py", "agent_env.py", "cli.py")
        for m in _longest_lines(PACKAGE / "runner" / name, 1, allowed)
    ]
    markers["harness-only core (ale/core)"] = [
        m for name in ("release.py", "scoring.py") for m in _longest_lines(PACKAGE / "core" / name, 1, allowed)
    ]
    evaluator = _module_file("ale_evaluator").parent
    markers["evaluator (ale_evaluator)"] = [
        m for name in ("seeds.py", "service.py", "batch.py") for m in _longest_lines(evaluator / name, 1, allowed)
    ]
    markers["verifier (ale_verify)"] = _longest_lines(_module_file("ale_verify").parent / "pipeline.py", 1, allowed)
    markers["the checkout"] = [
        m
        for name in ("pyproject.toml", "README.md", "Makefile", "tests/conftest.py")
        for m in _longest_lines(CHECKOUT / name, 1, allowed)
    ]
    markers["host packages outside the client's closure"] = [
        m
        for package, name in (("trio", "_core/_run.py"), ("mujoco", "minimize.py"), ("quart", "app.py"))
        for m in _longest_lines(_module_file(package).parent / name, 1, allowed)
    ]
    for what, path in planted.items():
        markers[what] = [path.read_text()]
    return markers


def _agent_markers(allowed: str) -> list[str]:
    return [
        m
        for name in ("_lqr.py", "demo.py", "_hopper.py")
        for m in _longest_lines(PACKAGE / "agents" / name, 1, allowed)
    ]


def control_markers(*, bundled: bool) -> dict[str, list[str]]:
    """Strings the agent must find: proof that its walk reads the task folder and its environment."""
    controls = {
        "control: its own paper": _longest_lines(PACKAGE / "tasks" / TASK / "paper.md", 1, ""),
        "control: the client library": _longest_lines(PACKAGE / "client" / "_remote.py", 1, ""),
    }
    if bundled:
        controls["control: its own bundled agent's code"] = _agent_markers("")
    return controls


def harness_only_files(*, bundled: bool) -> list[tuple[str, int, str]]:
    """(name, size, sha256) of every harness-only file of the project of 64 bytes or more: the
    package's folders and modules outside the client's closure (the bundled agents unless the
    agent is one), the other packages of the distribution, the checkout's own files."""
    in_package = [PACKAGE / n for n in ("releases", "runner", "schemas", "catalog.py")]
    in_package += [p for p in (PACKAGE / "tasks").iterdir() if p.name != TASK]  # its own paper is its to read
    in_package += [p for p in (PACKAGE / "core").iterdir() if p.name not in ("__init__.py", "parse.py")]
    if not bundled:
        in_package.append(PACKAGE / "agents")
    packages = [_module_file(n).parent for n in ("ale_evaluator", "ale_verify", "ale_site")]
    checkout = [CHECKOUT / n for n in ("README.md", "pyproject.toml", "Makefile", "docs", "tests", "proto", "bench")]
    found = []
    for root in [*in_package, *packages, *checkout]:
        for path in [root] if root.is_file() else sorted(root.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.stat().st_size >= 64:
                data = path.read_bytes()
                found.append((str(path), len(data), hashlib.sha256(data).hexdigest()))
    return found


# --- the runs -------------------------------------------------------------------------------------------


def _ale(*args: str, cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ale.runner.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _bundle_files(proc: subprocess.CompletedProcess[str]) -> dict[str, bytes]:
    assert proc.returncode == 0, proc.stderr
    bundle = Path(proc.stdout.strip().splitlines()[-1])
    key = bundle.with_name(bundle.name.removesuffix(".ale") + ".key")
    return unpack(bundle.read_bytes(), read_identity(key))


def _events(files: dict[str, bytes]) -> list[dict[str, Any]]:
    raw = zstandard.ZstdDecompressor().decompressobj().decompress(files["events.jsonl.zst"])
    return [json.loads(line) for line in raw.splitlines()]


def _report(texts: Iterator[str]) -> dict[str, Any]:
    for text in texts:
        if text.startswith(REPORT_PREFIX):
            return dict(json.loads(text[len(REPORT_PREFIX) :]))
    return {}


class _Walk:
    def __init__(self, bundled: bool) -> None:
        self.bundled = bundled
        self.report: dict[str, Any] = {}
        self.markers: dict[str, list[str]] = {}
        self.controls: dict[str, list[str]] = {}
        self.files: list[tuple[str, int, str]] = []


def _walker_code(walk: _Walk) -> str:
    everything = {**walk.markers, **walk.controls}
    encoded = json.dumps({k: [m.encode().hex() for m in v] for k, v in everything.items()}).encode().hex()
    code = (
        WALKER.replace("__MARKERS__", repr(encoded))
        .replace("__FILES__", repr([list(f) for f in walk.files]))
        .replace("__CAP__", str(WALK_CAP))
        .replace("__PREFIX__", repr(REPORT_PREFIX))
    )
    for marker in (m for ms in everything.values() for m in ms):
        assert marker not in code, "the agent's command line holds a marker"
    return code


def _walk_as_custom_agent(walk: _Walk, base: Path) -> None:
    """``ale run --agent-cmd`` as a user runs it, with markers planted in its folders."""
    out, cwd, tmp = base / "out", base / "cwd", base / "tmp"
    planted = {}
    for what, folder in (("the output folder", out), ("the working folder", cwd), ("the run folder's parent", tmp)):
        folder.mkdir()
        path = folder / "planted-marker.txt"
        path.write_text(f"ale-view-marker-{secrets.token_hex(16)}")
        path.chmod(0o644)
        planted[what] = path
    walk.markers = forbidden_markers(planted, bundled=False)
    command = f"python3 -c {shlex.quote(_walker_code(walk))}"
    env = {k: v for k, v in os.environ.items() if k not in ("ALE_RECIPIENT", "CI")}
    env["TMPDIR"] = str(tmp)
    proc = _ale(
        "run", TASK, "--plain", "--out", str(out), "--episodes", "1", "--agent-time", "600",
        "--agent-cmd", command, cwd=cwd, env=env, timeout=900,
    )  # fmt: skip
    events = _events(_bundle_files(proc))
    walk.report = _report(e["data"].get("text", "") for e in events if e["kind"] == "stdout")
    if not walk.report:
        pytest.fail(f"the walking agent printed no report:\n{proc.stderr}")


def _walk_as_bundled_agent(walk: _Walk, base: Path) -> None:
    """The harness runs the walker with a bundled agent's environment (the demo's modules in it)."""
    run_parent = base / "runs"
    run_parent.mkdir()
    planted = run_parent / "planted-marker.txt"
    planted.write_text(f"ale-view-marker-{secrets.token_hex(16)}")
    planted.chmod(0o644)
    walk.markers = forbidden_markers({"the run folder's parent": planted}, bundled=True)
    release, sha = catalog.release()
    options = RunOptions(
        tasks=(TASK,),
        agent=AgentSpec(
            name="walker-as-demo",
            command=(agent_env.PYTHON, "-c", _walker_code(walk)),
            modules=("ale.agents.demo",),
        ),
        release=release,
        release_sha256=sha,
        release_name=release.release,
        episodes=1,
        agent_time_s=600,
        workdir=run_parent,
    )
    record = trio.run(Harness(options, LocalRuntime(), PlainProgress(out=io.StringIO())).run)
    try:
        lines = record.trajectory.read_text(encoding="utf-8").splitlines()
    finally:
        shutil.rmtree(record.root, ignore_errors=True)
    events = [json.loads(line) for line in lines]
    walk.report = _report(e["data"].get("text", "") for e in events if e["kind"] == "stdout")
    if not walk.report:
        pytest.fail(f"the walking agent printed no report: {[e['data'] for e in events][-20:]}")


@pytest.fixture(scope="module", params=[False, True], ids=["custom-agent-cmd", "as-bundled-agent"])
def walk(request: pytest.FixtureRequest) -> Iterator[_Walk]:
    need_bwrap()
    result = _Walk(bundled=request.param)
    result.controls = control_markers(bundled=result.bundled)
    result.files = harness_only_files(bundled=result.bundled)
    assert any("/releases/" in name for name, _, _ in result.files), "nothing to look for"
    base = Path(tempfile.mkdtemp(prefix="ale-view-"))
    base.chmod(0o755)
    try:
        (_walk_as_bundled_agent if result.bundled else _walk_as_custom_agent)(result, base)
        yield result
    finally:
        shutil.rmtree(base, ignore_errors=True)


# --- what it read --------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_walk_read_every_tree_the_sandbox_shows(walk: _Walk) -> None:
    report = walk.report
    assert report["files"] > 10_000, report["files"]  # the system tree (/usr) was read, not just the task
    under = set(report["read_under"])
    env = agent_env.ensure()
    expected = {"/usr/bin", "/usr/lib", "/task/paper.md", "/ale/python", "/etc/ld.so.cache"}
    expected |= {"/".join(b.split("/")[:3]) for b in env.interpreter.binds}
    assert expected <= under, expected - under


@pytest.mark.slow
def test_the_walk_finds_its_own_paper_and_the_client(walk: _Walk) -> None:
    hits = walk.report["hits"]
    assert hits["control: its own paper"] == ["/task/paper.md"]
    site = f"{agent_env.MOUNT_POINT}/lib/python{VERSION}/site-packages"
    assert hits["control: the client library"] == [f"{site}/ale/client/_remote.py"]
    if walk.bundled:
        assert sorted(hits["control: its own bundled agent's code"]) == [
            f"{site}/ale/agents/{name}" for name in ("_hopper.py", "_lqr.py", "demo.py")
        ]


@pytest.mark.slow
def test_no_harness_only_file_is_readable(walk: _Walk) -> None:
    """Not the release manifest, other tasks, the bundled agents (unless it is one), the harness,
    the evaluator, the checkout, the output folder, the host's other packages: none of their
    markers is anywhere, and no file the agent can read is one of the project's harness-only files."""
    hits = {what: walk.report["hits"][what] for what in walk.markers}
    assert {what: paths for what, paths in hits.items() if paths} == {}
    assert walk.report["whole_files"] == []
    assert len(walk.markers) >= (10 if walk.bundled else 14)  # every group above was looked for
    assert len(walk.files) > 100


@pytest.mark.slow
def test_the_client_works_and_nothing_else_of_the_project_imports(walk: _Walk) -> None:
    report = walk.report
    assert report["served"] == TASK
    assert report["executable"] == agent_env.PYTHON
    assert report["prefix"] == agent_env.MOUNT_POINT
    imports = report["imports"]
    expected = {"ale.client", "ale.policy", "ale.protocol"} | ({"ale.agents.demo"} if walk.bundled else set())
    assert {m for m, r in imports.items() if r == "ok"} == expected, imports
    site_paths = [p for p in report["path"] if p.endswith("-packages")]
    assert site_paths == [f"{agent_env.MOUNT_POINT}/lib/python{VERSION}/site-packages"]


# --- the bundled demo agent ------------------------------------------------------------------------


def test_bundled_demo_solves_an_interactive_task_through_ale_run(tmp_path: Path) -> None:
    """pendulum-lqr: the demo identifies a model and leaves a policy script whose ``#!`` line is the
    sandbox's interpreter; the official evaluation runs it in the sandbox and every episode passes."""
    need_bwrap()
    env = {k: v for k, v in os.environ.items() if k not in ("ALE_RECIPIENT", "CI")}
    proc = _ale(
        "run", "pendulum-lqr", "--plain", "--out", str(tmp_path / "out"), "--episodes", "4",
        cwd=tmp_path, env=env, timeout=600,
    )  # fmt: skip
    files = _bundle_files(proc)
    results = json.loads(files["task_results.json"])
    (task,) = results["tasks"]
    assert task["status"] == "completed", task
    assert task["result"]["passed_episodes"] == 4
    events = _events(files)
    agent_out = "\n".join(e["data"]["text"] for e in events if e["kind"] == "stdout")
    assert "8/8 episodes kept the pole up" in agent_out, agent_out[-3000:]
    (finished,) = [e for e in events if e["kind"] == "policy_finished"]
    assert finished["data"]["exit_status"] == 0
    manifest = json.loads(files["manifest.json"])
    assert manifest["agent"]["command"][0] == agent_env.PYTHON


def test_a_bundled_agents_environment_holds_its_own_modules_only() -> None:
    demo = agent_env.ensure(("ale.agents.demo",))
    random_agent = agent_env.ensure(("ale.agents.random_agent",))
    client = agent_env.ensure()
    agents = {m for m in demo.modules if m.startswith("ale.agents")}
    assert {"ale.agents.demo", "ale.agents._lqr", "ale.agents._hopper", "ale.agents.random_agent"} <= agents
    assert {m for m in random_agent.modules if m.startswith("ale.agents")} == {
        "ale.agents",
        "ale.agents._common",
        "ale.agents.random_agent",
    }
    assert not any(m.startswith("ale.agents") for m in client.modules)
    assert len({demo.digest, random_agent.digest, client.digest}) == 3
    for env in (demo, random_agent, client):
        assert not any(re.match(r"ale\.(runner|core\.(release|scoring|bundle))", m) for m in env.modules)
        site = env.root / f"lib/python{env.interpreter.version}/site-packages"
        on_disk = {p.relative_to(site).as_posix() for p in (site / "ale").rglob("*.py")}
        assert on_disk == {
            ("/".join(m.split(".")) + ("/__init__.py" if (PACKAGE.parent / m.replace(".", "/")).is_dir() else ".py"))
            for m in env.modules
        }


# --- through the runtime interface, on every backend ----------------------------------------------

PROBE = r"""
import hashlib, importlib, json, os, stat
FILES = {(size, digest): name for name, size, digest in __FILES__}
SIZES = {size for size, _ in FILES}
hits, files = [], 0
for root, dirs, names in os.walk("/", onerror=lambda e: None):
    dirs[:] = [d for d in dirs if os.path.join(root, d) not in ("/proc", "/sys", "/dev")]
    for name in names:
        path = os.path.join(root, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode):
            continue
        files += 1
        if st.st_size not in SIZES:
            continue
        try:
            with open(path, "rb") as fh:
                digest = hashlib.sha256(fh.read()).hexdigest()
        except OSError:
            continue
        if (st.st_size, digest) in FILES:
            hits.append([path, FILES[(st.st_size, digest)]])
imports = {}
for module in ("ale.client", "ale.policy", "ale.protocol", "ale.runner.harness", "ale.agents.demo",
               "ale_evaluator", "ale_verify"):
    try:
        importlib.import_module(module)
        imports[module] = "ok"
    except Exception as exc:
        imports[module] = type(exc).__name__
print(__PREFIX__ + json.dumps({"hits": hits, "files": files, "imports": imports}), flush=True)
"""


@pytest.fixture(
    scope="module",
    params=[(b, bundled) for b in backends() for bundled in (False, True)],
    ids=lambda p: f"{p[0].id}-{'bundled-agent' if p[1] else 'default-env'}",
)
def probed(request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    """A probe given only a SandboxSpec: the backend's own default environment, or a bundled agent's."""
    backend, bundled = request.param
    runtime = make_runtime(backend)
    files = harness_only_files(bundled=bundled)
    assert any("/releases/" in name for name, _, _ in files), "nothing to look for"
    box = Box()
    try:
        code = PROBE.replace("__FILES__", repr([list(f) for f in files])).replace("__PREFIX__", repr(REPORT_PREFIX))
        env = agent_env.ensure(("ale.agents.demo",)) if bundled else None  # None: the backend's default
        lines = Lines()
        trio.run(lambda: runtime.run_sandboxed(box.spec(code, agent_env=env), lines))
        report = _report(iter(lines.of("stdout")))
        if not report:
            pytest.fail(f"no report: {lines.lines!r}"[:5000])
        yield {"bundled": bundled, **report}
    finally:
        box.close()


@pytest.mark.slow
def test_no_backend_shows_a_harness_only_file(probed: dict[str, Any]) -> None:
    assert probed["files"] > 5_000, "the walk read the system tree (an OCI agent image holds about 9,000 files)"
    assert probed["hits"] == []


@pytest.mark.slow
def test_every_backend_imports_the_client_library_and_not_the_harness(probed: dict[str, Any]) -> None:
    imports = probed["imports"]
    assert imports["ale.client"] == imports["ale.policy"] == imports["ale.protocol"] == "ok"
    for module in ("ale.runner.harness", "ale_evaluator", "ale_verify"):
        assert imports[module] == "ModuleNotFoundError", (module, imports)
    assert imports["ale.agents.demo"] == ("ok" if probed["bundled"] else "ModuleNotFoundError")
