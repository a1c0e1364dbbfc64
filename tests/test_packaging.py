"""Every package folder is installed under its import name; the pure core does no I/O."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SETUPTOOLS = PYPROJECT["tool"]["setuptools"]

# What the pure core may import: the standard library's pure parts and codec libraries.
FORBIDDEN_IN_CORE = {
    "grpc", "trio", "quart", "sqlite3", "sqlite_utils", "subprocess", "socket", "os", "shutil",
    "pathlib", "httpx", "asyncio", "threading", "hypercorn", "tempfile", "urllib", "psycopg", "psycopg_pool",
}  # fmt: skip


def _import_name(folder: Path) -> str:
    rel = folder.relative_to(ROOT).parts
    for name, src in SETUPTOOLS["package-dir"].items():
        if rel[: len(Path(src).parts)] == Path(src).parts:
            return ".".join([name, *rel[len(Path(src).parts) :]])
    raise AssertionError(f"{folder} is outside every package-dir mapping")


def test_every_package_folder_is_listed() -> None:
    listed = set(SETUPTOOLS["packages"])
    found = set()
    for src in SETUPTOOLS["package-dir"].values():
        for init in (ROOT / src).rglob("__init__.py"):
            found.add(_import_name(init.parent))
    assert found == listed, f"pyproject packages differ from the folders: {sorted(found ^ listed)}"


def test_core_imports_no_io_modules() -> None:
    for path in sorted((ROOT / "ale/core").rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                assert top not in FORBIDDEN_IN_CORE, f"{path.relative_to(ROOT)} imports {name}"
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                assert node.func.id != "open", f"{path.relative_to(ROOT)} calls open()"


def test_console_scripts_resolve() -> None:
    import importlib

    for script, target in PYPROJECT["project"]["scripts"].items():
        module, func = target.split(":")
        assert callable(getattr(importlib.import_module(module), func)), script
