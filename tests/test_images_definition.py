"""The image definitions: they parse, bad ones fail with the key named, and each image's project
files are exactly what its entry points import (plus the evaluator's task data), nothing of the
harness."""

from __future__ import annotations

import ast
import contextlib
import json
from pathlib import Path

import pytest
from fuzzing import fuzz_settings
from hypothesis import given
from hypothesis import strategies as st

from ale.images import definition
from ale.images.attest import describe
from ale.images.build import project_files
from ale.runner import agent_env

ROOT = Path(__file__).resolve().parents[1]
IMAGES = ROOT / "images"
GOOD = (IMAGES / "evaluator.toml").read_text()


def _parse(text: str, name: str = "evaluator") -> definition.Definition:
    return definition.parse(text.encode(), Path(f"/x/{name}.toml"))


def test_committed_definitions_parse_and_are_pinned() -> None:
    found = definition.find(IMAGES)
    assert set(found) == {"evaluator", "agent-base", "verifier"}
    for name, path in found.items():
        d = definition.load(path)
        assert d.name == name
        assert d.debian.packages, f"{name}: no Debian packages pinned (run ale images pin)"
        assert d.python.wheels, f"{name}: no wheels pinned (run ale images pin)"
        assert d.user.uid != 0
        json.dumps(describe(d))


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda t: t.replace('name = "evaluator"', 'name = "other"'), "must be the file's name"),
        (lambda t: t.replace("format = 1", "format = 2"), "format: this builder reads format 1"),
        (lambda t: t.replace("format = 1", 'format = "1"'), "format: must be a int"),
        (lambda t: t.replace("uid = 10001", "uid = 0"), r"image\.user\.uid: must be a non-root id"),
        (lambda t: t.replace('workdir = "/"', 'workdir = "tmp"'), "image.workdir"),
        (lambda t: t.replace('"ale/__init__.py",', '"../etc/passwd",'), r"project\.files\[0\]"),
        (lambda t: t.replace('"ale/__init__.py",', '"ale/**/*.py",'), "without \\*\\*"),
        (lambda t: t.replace("\n[project]\n", "\n[project]\nextra = 1\n"), "project.extra: unknown key"),
        (lambda t: t.replace('snapshot = "20261201T000000Z"', 'snapshot = "yesterday"'), "debian.snapshot"),
        (lambda t: t.replace('archive = "debian",', 'archive = "elsewhere",', 1), r"packages\[0\]\.archive"),
        (lambda t: t.replace('sha256 = "', 'sha256 = "x', 1), r"wheels\[0\]\.sha256"),
        (lambda t: t.replace('path = "pool/', 'path = "../pool/', 1), r"packages\[0\]\.path"),
        (lambda t: t.replace('url = "https://', 'url = "http://', 1), r"wheels\[0\]\.url"),
        (lambda t: t.replace("\n[image]\n", "\n[image]\nbogus = true\n"), "image.bogus: unknown key"),
        (lambda t: t.replace('PYTHONNOUSERSITE = "1"', '"BAD NAME" = "1"'), "is not a variable name"),
        (lambda t: t.replace('mode = "1777"', 'mode = "rwx"'), r"folders\[0\]\.mode"),
    ],
)
def test_bad_definitions_name_the_key(edit: object, match: str) -> None:
    text = edit(GOOD)  # type: ignore[operator]
    assert text != GOOD
    with pytest.raises(definition.DefinitionError, match=match):
        _parse(text)


def test_unsorted_pins_are_refused() -> None:
    lines = GOOD.split("\n")
    start = lines.index("packages = [") + 1
    lines[start], lines[start + 1] = lines[start + 1], lines[start]
    with pytest.raises(definition.DefinitionError, match="sorted by name"):
        _parse("\n".join(lines))


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        (b"\xff\xfe not utf-8", "not a TOML file"),
        (b"name = [", "not a TOML file"),
        (b"a = " + b"[" * 20000 + b"]" * 20000, "nested too deeply"),
        (b"a = " + b"{b = " * 5000 + b"1" + b"}" * 5000, "nested too deeply"),
        (b"#" * (definition.MAX_BYTES + 1), "larger than"),
        (b"", "format: missing"),
    ],
)
def test_garbage_definitions_give_definition_errors(raw: bytes, match: str) -> None:
    with pytest.raises(definition.DefinitionError, match=match):
        definition.parse(raw, Path("/x/evaluator.toml"))


def test_definition_20k_nested_arrays_gives_definition_error_not_recursion_error() -> None:
    raw = b"format = 1\nx = " + b"[" * 20000 + b"]" * 20000
    with pytest.raises(definition.DefinitionError):
        definition.parse(raw, Path("/x/evaluator.toml"))


@pytest.mark.fuzz
@fuzz_settings
@given(st.binary(max_size=300) | st.text(max_size=300).map(str.encode))
def test_fuzz_definition_parser_raises_only_definition_errors(raw: bytes) -> None:
    with contextlib.suppress(definition.DefinitionError):
        definition.parse(raw, Path("/x/evaluator.toml"))


@pytest.mark.fuzz
@fuzz_settings
@given(st.data())
def test_fuzz_mutated_definition_raises_only_definition_errors(data: st.DataObject) -> None:
    text = GOOD
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(text)))
        j = data.draw(st.integers(i, min(len(text), i + 20)))
        text = text[:i] + data.draw(st.text(max_size=10)) + text[j:]
    with contextlib.suppress(definition.DefinitionError):
        _parse(text)


# --- what each image's project layer holds ------------------------------------------------------

ROOTS = {"ale": ROOT / "ale", "ale_evaluator": ROOT / "evaluator"}


def _module_file(name: str) -> Path | None:
    top, *rest = name.split(".")
    base = ROOTS[top].joinpath(*rest)
    for candidate in (base / "__init__.py", base.with_name(base.name + ".py")):
        if candidate.is_file():
            return candidate
    return None


def _closure(roots: list[str]) -> set[str]:
    """The project files the modules ``roots`` reach through import statements (checkout paths)."""
    seen: dict[str, Path] = {}
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name.split(".")[0] not in ROOTS or name in seen or (path := _module_file(name)) is None:
            continue
        seen[name] = path
        todo.append(name.rpartition(".")[0])
        tree = ast.parse(path.read_bytes())
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                todo.extend(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    pkg = name if is_pkg else name.rpartition(".")[0]
                    for _ in range(node.level - 1):
                        pkg = pkg.rpartition(".")[0]
                    base = f"{pkg}.{base}" if base else pkg
                todo.append(base)
                todo.extend(f"{base}.{a.name}" for a in node.names)
    return {p.relative_to(ROOT).as_posix() for p in seen.values()}


def _python_files(name: str) -> set[str]:
    d = definition.load(IMAGES / f"{name}.toml")
    return {src.relative_to(ROOT).as_posix() for _dest, src in project_files(d, ROOT)}


def test_evaluator_image_holds_exactly_the_evaluators_import_closure_and_the_tasks() -> None:
    files = _python_files("evaluator")
    code = {f for f in files if f.endswith(".py")}
    # every module of the evaluator's package (ale_evaluator's command line reaches them all)
    assert code == _closure(["ale_evaluator", "ale_evaluator.__main__", "ale_evaluator.cli"]) | {
        f.relative_to(ROOT).as_posix() for f in (ROOT / "evaluator").glob("*.py")
    }
    data = files - code
    assert data == {"ale/py.typed"} | {
        p.relative_to(ROOT).as_posix() for t in (ROOT / "ale/tasks").iterdir() for p in t.iterdir()
    }


def test_agent_base_image_holds_exactly_the_client_library() -> None:
    files = _python_files("agent-base")
    modules, _external = agent_env.ale_closure(agent_env.CLIENT_MODULES)
    expected = {p.resolve().relative_to(ROOT).as_posix() for p in modules.values()}
    assert {f for f in files if f.endswith(".py")} == expected
    assert {f for f in files if not f.endswith(".py")} <= {"ale/py.typed", *(f[:-3] + ".pyi" for f in expected)}


FORBIDDEN = {
    "evaluator": ("ale/runner/", "ale/agents/", "ale/releases/", "ale/schemas/", "verify/", "static-site/"),
    "agent-base": (
        "ale/runner/", "ale/agents/", "ale/releases/", "ale/schemas/", "ale/tasks/", "ale/catalog.py",
        "ale/core/release.py", "ale/core/scoring.py", "evaluator/", "verify/", "static-site/",
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(FORBIDDEN))
def test_definitions_name_nothing_of_the_harness(name: str) -> None:
    for f in _python_files(name):
        assert not f.startswith(FORBIDDEN[name]), f"{name} would hold {f}"


def test_agent_base_wants_no_simulator() -> None:
    d = definition.load(IMAGES / "agent-base.toml")
    names = {w.name for w in d.python.wheels}
    assert not names & {"mujoco", "mujoco-core", "mujoco-studio", "glfw", "pyopengl"}, names


def test_image_interpreter_is_the_one_the_wheels_are_for() -> None:
    for path in definition.find(IMAGES).values():
        d = definition.load(path)
        debs = {p.name: p.version for p in d.debian.packages}
        assert f"python{d.python.version}" in debs, f"{d.name}: no Debian python{d.python.version}"
        assert d.python.abi == f"cp{d.python.version.replace('.', '')}"
        assert debs["libc6"].startswith(d.python.glibc + "-"), "manylinux tags must match the C library"
