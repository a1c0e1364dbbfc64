"""What the agent can read (docs/agent-contract.md, "What is mounted where"): none of the harness's files.

A probe inside a real sandbox walks every readable path (the Python installation included) and
hashes each regular file whose size matches one of the harness-only files on the host: every
release manifest (the paper targets), every task's paper and definition, the harness, the
evaluator and verifier packages, the bundled agents (the reference solutions, unless the agent
is one of them) and the checkout. It must find none of them, and ``ale.client`` must still import.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from importlib import util
from pathlib import Path
from typing import Any

import pytest
import trio
from sandbox_box import Box, Lines
from sandbox_tools import backends, make_runtime

import ale

PACKAGE = Path(ale.__file__).resolve().parent
CHECKOUT = Path(__file__).resolve().parents[1]
MIN_BYTES = 64  # smaller files (empty __init__.py, one-line stubs) are not distinctive

PROBE = r"""
import hashlib, importlib, json, os, stat
NEEDLES = __NEEDLES__
SIZES = {size for size, _ in NEEDLES.values()}
WANTED = {digest: name for name, (_, digest) in NEEDLES.items()}
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
        if digest in WANTED:
            hits.append([path, WANTED[digest]])
imports = {}
for module in ("ale.client", "ale.policy", "ale.protocol", "ale.runner.harness", "ale.agents.demo",
               "ale_evaluator", "ale_verify"):
    try:
        importlib.import_module(module)
        imports[module] = "ok"
    except Exception as exc:
        imports[module] = type(exc).__name__
print("REPORT " + json.dumps({"hits": hits, "files": files, "imports": imports}), flush=True)
"""


def _harness_only(*, bundled_agent: bool) -> dict[str, tuple[int, str]]:
    """name -> (size, sha256) of every harness-only file on the host."""
    roots = [PACKAGE / "releases", PACKAGE / "tasks", PACKAGE / "runner"]
    if not bundled_agent:
        roots.append(PACKAGE / "agents")
    for name in ("ale_evaluator", "ale_verify", "ale_site"):
        spec = util.find_spec(name)
        if spec is not None and spec.submodule_search_locations:
            roots += [Path(p) for p in spec.submodule_search_locations]
    files = [p for r in roots for p in r.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    files += [CHECKOUT / n for n in ("README.md", "pyproject.toml", "Makefile", "tests/test_agent_view.py")]
    needles = {}
    for path in files:
        data = path.read_bytes()
        if len(data) >= MIN_BYTES:
            needles[str(path)] = (len(data), hashlib.sha256(data).hexdigest())
    return needles


@pytest.fixture(scope="module", params=[False, True], ids=["own-agent", "bundled-agent"])
def seen(request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    bundled = request.param
    backend = backends()[0]
    runtime = make_runtime(backend)
    needles = _harness_only(bundled_agent=bundled)
    assert any("/releases/" in n for n in needles), "nothing to look for"
    assert any("/tasks/" in n for n in needles), "nothing to look for"
    box = Box()
    try:
        code = PROBE.replace("__NEEDLES__", repr(needles))
        lines = Lines()
        spec = box.spec(code, sees_bundled_agents=bundled)
        trio.run(lambda: runtime.run_sandboxed(spec, lines))
        for line in lines.of("stdout"):
            if line.startswith("REPORT "):
                yield {"bundled": bundled, **json.loads(line[7:])}
                return
        pytest.fail(f"no report: {lines.lines!r}"[:5000])
    finally:
        box.close()


def test_the_agent_reads_none_of_the_harness_only_files(seen: dict[str, Any]) -> None:
    assert seen["files"] > 1000, "the walk read the Python installation"
    assert seen["hits"] == []


def test_the_client_library_imports_and_the_harness_does_not(seen: dict[str, Any]) -> None:
    imports = seen["imports"]
    assert imports["ale.client"] == imports["ale.policy"] == imports["ale.protocol"] == "ok"
    for module in ("ale.runner.harness", "ale_evaluator", "ale_verify"):
        assert imports[module] == "ModuleNotFoundError", (module, imports)
    assert imports["ale.agents.demo"] == ("ok" if seen["bundled"] else "ModuleNotFoundError")
