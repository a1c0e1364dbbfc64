"""The agent's own Python environment: the client library and what it needs to run, nothing else.

The sandbox must not show the agent the host's Python installation: with an editable install that
is the whole checkout (the release manifest with the paper targets, every task's paper, the bundled
agents, the harness and the evaluator). The agent gets a folder of its own instead, mounted
read-only at :data:`MOUNT_POINT`, assembled from the host's installed files:

1. the ``ale`` modules of the client library (:data:`CLIENT_MODULES` and every ``ale`` module
   their import statements reach), plus a bundled agent's own modules when the agent is one;
2. the distributions those modules import (found by the files they own) and everything they
   require (``Requires-Dist`` without extras, markers evaluated for this interpreter), file by
   file from their RECORD, hard-linked where possible, else copied;
3. ``bin/python3``, a symlink to the host interpreter's binary, beside a ``pyvenv.cfg`` that makes
   the folder the interpreter's prefix, so only its own site-packages is on ``sys.path``.

The interpreter's standard library and shared libraries are bound read-only at their own paths
(:class:`Interpreter`), the base installation's site-packages (and any project code) hidden
behind an empty folder.

The folder is named by a digest of what goes into it (the ale modules' contents; each
distribution file's name, size and modification time; the interpreter) and built once per
machine under ``$XDG_CACHE_HOME/ale/agent-env``: in a temporary folder, then renamed into place,
so concurrent runs never see half an environment.
"""

from __future__ import annotations

import ast
import compileall
import hashlib
import json
import os
import platform
import re
import shutil
import site
import stat
import sys
import sysconfig
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from importlib import metadata
from importlib.util import find_spec
from pathlib import Path

import attrs
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

import ale
from ale.core.parse import ParseError, parse_json

FORMAT = 1  # bump when the layout changes: a new digest, a new folder
MOUNT_POINT = "/ale/python"
PYTHON = f"{MOUNT_POINT}/bin/python3"
#: The agent-facing library: the gym client, the wire codecs, the policy-artifact writer, the
#: Stable-Baselines3 adapter (which works once the agent brings SB3: docs/agent-contract.md), and
#: the relay to the gateway socket that a runtime starts before the command (``ale._relay``).
CLIENT_MODULES = ("ale.client", "ale.protocol", "ale.policy", "ale.client.sb3", "ale._relay")
#: Host trees the sandbox binds read-only anyway (the system: shell, coreutils, the C library).
SYSTEM_TREES = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64")
#: The project's own top-level packages: never visible to the agent except the modules above.
PROJECT_PACKAGES = ("ale", "ale_evaluator", "ale_verify", "ale_site")
#: CPython 3.11's parser is not safe to run in two threads at once ("AST constructor recursion
#: depth mismatch"); runs in separate processes need no lock (their builds race by rename).
_PARSE_LOCK = threading.Lock()
STALE_BUILD_S = 24 * 3600  # a temporary build folder this old belongs to a crashed build
UNUSED_ENV_S = 30 * 24 * 3600  # an environment no run has used for this long is removed


class AgentEnvError(RuntimeError):
    """The agent's environment cannot be assembled from this installation; the text says why."""


@attrs.frozen
class Interpreter:
    """The host interpreter the sandbox runs, and what of its installation the sandbox shows."""

    executable: str  # the real binary
    version: str  # "3.11"
    binds: tuple[str, ...]  # bound read-only at their own paths (those outside SYSTEM_TREES)
    hidden: tuple[str, ...]  # folders inside the visible trees covered by an empty folder


@attrs.frozen
class AgentEnv:
    """A built environment: the host folder the sandbox mounts at :data:`MOUNT_POINT`."""

    root: Path
    digest: str
    interpreter: Interpreter
    modules: tuple[str, ...]  # the ale modules it holds
    distributions: tuple[str, ...]  # name==version

    @property
    def empty(self) -> Path:
        """An empty read-only folder, mounted over what :attr:`Interpreter.hidden` names."""
        return self.root / "empty"


@attrs.frozen
class _Plan:
    digest: str
    interpreter: Interpreter
    modules: tuple[str, ...]
    ale_files: tuple[tuple[str, Path], ...]  # (path under site-packages, host file)
    distributions: tuple[str, ...]
    dist_files: tuple[tuple[str, str], ...]  # (path under site-packages, host file)


# --- the interpreter ----------------------------------------------------------------------------


def _under(path: str, roots: Iterable[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def _fold(paths: Iterable[str]) -> tuple[str, ...]:
    """The paths without those inside another one, sorted."""
    ordered = sorted(set(paths), key=lambda p: (p.count("/"), p))
    kept: list[str] = []
    for p in ordered:
        if not _under(p, kept):
            kept.append(p)
    return tuple(sorted(kept))


def _project_folders() -> list[str]:
    """Where the project's packages (and, for an editable install, its checkout) are on this host."""
    found = []
    for name in PROJECT_PACKAGES:
        spec = find_spec(name)
        for location in (spec.submodule_search_locations or []) if spec else []:
            found.append(os.path.realpath(location))
    package = Path(ale.__file__).resolve().parent
    if (package.parent / "pyproject.toml").is_file():
        found.append(str(package.parent))
    return found


def interpreter() -> Interpreter:
    """This interpreter: its binary, the trees it needs bound, what to hide inside the visible ones."""
    executable = os.path.realpath(getattr(sys, "_base_executable", "") or sys.executable)
    # The standard library (os.py's folder), its extension modules, the shared libpython: all of
    # the base installation (in a virtual environment sysconfig's "platstdlib" is the venv's).
    needed = {executable, os.path.dirname(os.__file__), str(sysconfig.get_config_var("DESTSHARED") or "")}
    if sysconfig.get_config_var("Py_ENABLE_SHARED"):
        needed.add(str(sysconfig.get_config_var("LIBDIR")))
    real = {os.path.realpath(p) for p in needed if p and os.path.exists(p)}
    binds = _fold(p for p in real if not _under(p, SYSTEM_TREES))
    visible = (*SYSTEM_TREES, *binds)
    candidates = [
        *site.getsitepackages([sys.base_prefix, sys.base_exec_prefix, sys.prefix]),
        site.getusersitepackages(),
        *_project_folders(),
    ]
    hidden = _fold(r for r in (os.path.realpath(c) for c in candidates) if os.path.isdir(r) and _under(r, visible))
    for path in sorted(real):
        if _under(path, hidden):
            raise AgentEnvError(f"the interpreter's {path} lies inside {next(h for h in hidden if _under(path, [h]))}")
    return Interpreter(
        executable=executable, version=f"{sys.version_info[0]}.{sys.version_info[1]}", binds=binds, hidden=hidden
    )


# --- the ale modules ----------------------------------------------------------------------------


def _package_root() -> Path:
    return Path(ale.__file__).resolve().parent


def _module_file(root: Path, name: str) -> Path | None:
    """The source of ``ale`` module ``name`` under the package folder ``root``, if it is a module."""
    parts = name.split(".")[1:]
    if not parts:
        return root / "__init__.py"
    base = root.joinpath(*parts)
    for candidate in (base / "__init__.py", base.with_name(base.name + ".py")):
        if candidate.is_file():
            return candidate
    return None


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


_IMPORT_ERRORS = frozenset({"ImportError", "ModuleNotFoundError"})


def _guards_import(node: ast.AST) -> bool:
    """Whether ``node`` is a ``try`` with a handler that names ImportError or ModuleNotFoundError."""
    if not isinstance(node, ast.Try | ast.TryStar):
        return False
    names: list[ast.expr] = []
    for handler in node.handlers:
        kind = handler.type
        names.extend(kind.elts if isinstance(kind, ast.Tuple) else [kind] if kind is not None else [])
    return any(isinstance(n, ast.Name) and n.id in _IMPORT_ERRORS for n in names)


def _imports(tree: ast.Module, name: str, is_package: bool) -> Iterator[tuple[str, bool]]:
    """The dotted names a module imports at run time (``if TYPE_CHECKING:`` bodies left out), each
    with whether it is optional: in the body of a ``try`` that catches ImportError.

    ``from a import b`` gives ``a`` and ``a.b`` (``b`` may be a submodule or an attribute).
    """
    stack: list[tuple[ast.AST, bool]] = [(tree, False)]
    while stack:
        node, optional = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend((child, optional) for child in node.orelse)
            continue
        # Import statements sit in statement lists only: no need to visit expressions.
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            block = getattr(node, field, None)
            if isinstance(block, list):
                guarded = optional or (field == "body" and _guards_import(node))
                stack.extend((child, guarded) for child in block)
        if isinstance(node, ast.Import):
            yield from ((alias.name, optional) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = name if is_package else name.rpartition(".")[0]
                for _ in range(node.level - 1):
                    package = package.rpartition(".")[0]
                base = f"{package}.{base}" if base else package
            yield base, optional
            yield from ((f"{base}.{alias.name}", optional) for alias in node.names if alias.name != "*")


def ale_closure(roots: Sequence[str]) -> tuple[dict[str, Path], set[str]]:
    """The ale modules ``roots`` reach by import statements (name -> source), and the other
    non-standard-library names they import. An optional import (guarded by ``except ImportError``)
    of another distribution is not one of them: the module works without it, so the environment
    does not bring it (``ale.client.sb3`` and Stable-Baselines3)."""
    package = _package_root()
    modules: dict[str, Path] = {}
    external: set[str] = set()
    with _PARSE_LOCK:
        _walk_imports(package, roots, modules, external)
    return modules, external


def _walk_imports(package: Path, roots: Sequence[str], modules: dict[str, Path], external: set[str]) -> None:
    for root in roots:
        if root.split(".")[0] != "ale" or _module_file(package, root) is None:
            raise AgentEnvError(f"{root!r} is not a module of the ale package")
    todo = [(root, False) for root in roots]
    while todo:
        name, optional = todo.pop()
        top = name.split(".")[0]
        if top != "ale":
            if top and top not in sys.stdlib_module_names and not optional:
                external.add(name)
            continue
        if name in modules or (path := _module_file(package, name)) is None:
            continue  # seen, or an attribute (`from ale.x import Name`)
        modules[name] = path
        todo.append((name.rpartition(".")[0], False))
        tree = ast.parse(path.read_bytes(), filename=str(path))
        todo.extend(_imports(tree, name, path.name == "__init__.py"))


def _ale_files(modules: dict[str, Path]) -> list[tuple[str, Path]]:
    package = _package_root()
    files: set[Path] = set(modules.values())
    files |= {p.with_suffix(".pyi") for p in modules.values() if p.with_suffix(".pyi").is_file()}
    if (package / "py.typed").is_file():
        files.add(package / "py.typed")
    return sorted((f"ale/{p.relative_to(package).as_posix()}", p) for p in files)


# --- the distributions --------------------------------------------------------------------------


def _record(d: _Dist) -> list[str]:
    """The paths a distribution's RECORD lists, relative to its site-packages folder."""
    text = d.dist.read_text("RECORD")
    if text is None:
        raise AgentEnvError(f"{d.name} {d.version} has no RECORD: its files cannot be told apart")
    return [row.rsplit(",", 2)[0].strip('"') for row in text.splitlines() if row.strip()]


def _module_names(paths: Iterable[str]) -> Iterator[str]:
    """Importable names of files (``a.b`` for ``a/b.py``, ``a/b/__init__.py``, ``a/b.*.so``), three levels deep."""
    for rel in paths:
        parts = rel.split("/")
        if parts[0] == ".." or parts[0].endswith(".dist-info") or "__pycache__" in parts:
            continue
        stem, _, suffix = parts[-1].partition(".")
        if suffix not in ("py", "pyi") and not suffix.endswith(("so", "pyd")):
            continue
        names = parts[:-1] if stem == "__init__" else [*parts[:-1], stem]
        for depth in range(1, min(len(names), 3) + 1):
            yield ".".join(names[:depth])


_TOP_LEVEL = re.compile(r"^([^/,.\n]+)", re.MULTILINE)


def installed(tops: Iterable[str] = ()) -> tuple[dict[str, metadata.Distribution], dict[str, str]]:
    """The installed distributions by canonical name (the first on ``sys.path`` wins), and the
    distribution that owns each module name up to three levels deep, for the top-level names
    ``tops`` (all when empty).

    Read from the ``*.dist-info`` folders on ``sys.path`` directly (their names and RECORDs):
    parsing every METADATA file, as :func:`importlib.metadata.distributions` does, costs more
    than the rest of a warm :func:`ensure`.
    """
    wanted = set(tops)
    dists: dict[str, metadata.Distribution] = {}
    owners: dict[str, str] = {}
    for entry in sys.path:
        try:
            children = sorted(os.listdir(entry or "."))
        except OSError:
            continue
        for child in children:
            if not child.endswith(".dist-info"):
                continue
            name = canonicalize_name(child.removesuffix(".dist-info").rpartition("-")[0])
            if not name or name in dists:
                continue
            dist = metadata.PathDistribution(Path(entry or ".", child))
            dists[name] = dist
            text = dist.read_text("RECORD") or ""
            if wanted and wanted.isdisjoint(_TOP_LEVEL.findall(text)):
                continue
            for module in _module_names(row.rsplit(",", 2)[0].strip('"') for row in text.splitlines()):
                owners.setdefault(module, name)
    return dists, owners


def _owner(name: str, owners: dict[str, str]) -> str | None:
    parts = name.split(".")
    for depth in range(min(len(parts), 3), 0, -1):
        if (owner := owners.get(".".join(parts[:depth]))) is not None:
            return owner
    return None


@attrs.frozen
class _Dist:
    name: str
    version: str
    dist: metadata.Distribution


def distribution_closure(imports: Iterable[str], packages: Iterable[str] = ()) -> list[_Dist]:
    """The distributions that provide ``imports``, the distributions named ``packages`` (requirement
    strings such as ``openai`` or ``httpx[http2]``), and everything they require, by name."""
    imports = sorted(imports)
    dists, owners = installed({name.split(".")[0] for name in imports})
    todo: list[tuple[str, frozenset[str], str]] = []
    for name in imports:
        owner = _owner(name, owners)
        if owner is None:
            raise AgentEnvError(f"no installed distribution provides {name!r}, which the client library imports")
        todo.append((owner, frozenset(), f"import {name}"))
    for raw in sorted(packages):
        req = _package(raw)
        todo.append((canonicalize_name(req.name), frozenset(req.extras), f"the agent's package {raw!r}"))
    wanted: dict[str, set[str]] = {}
    found: dict[str, _Dist] = {}
    while todo:
        name, extras, why = todo.pop()
        if name not in dists:
            raise AgentEnvError(f"{why} needs the distribution {name!r}, which is not installed")
        seen = wanted.setdefault(name, set())
        new = (set(extras) | {""}) - seen
        if not new:
            continue
        seen |= new
        md = dists[name].metadata  # parsed on every access: once per distribution
        found[name] = _Dist(name=md["Name"], version=md["Version"], dist=dists[name])
        for raw in md.get_all("Requires-Dist") or ():
            try:
                req = Requirement(raw)
            except InvalidRequirement as exc:
                raise AgentEnvError(f"{name} has an unreadable requirement {raw!r}: {exc}") from None
            if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in sorted(new)):
                todo.append((canonicalize_name(req.name), frozenset(req.extras), f"{name} ({raw})"))
    return [found[n] for n in sorted(found)]


def _package(raw: str) -> Requirement:
    """A package the agent asks for: a distribution name with extras, no version or marker (the
    harness's installed version is what it gets)."""
    try:
        req = Requirement(raw)
    except InvalidRequirement as exc:
        raise AgentEnvError(f"the agent's package {raw!r} is not a distribution name: {exc}") from None
    if req.specifier or req.marker or req.url:
        raise AgentEnvError(
            f"the agent's package {raw!r}: name a distribution (and extras) only; the version is the installed one"
        )
    if canonicalize_name(req.name) in {canonicalize_name(p) for p in ("ale-robotics", *PROJECT_PACKAGES)}:
        raise AgentEnvError(f"the agent's package {raw!r} is the project itself, which the agent never sees")
    return req


def _dist_files(d: _Dist) -> Iterator[tuple[str, str, os.stat_result]]:
    """(path under site-packages, host file, its stat) of each installed file of ``d`` in site-packages."""
    name, base = d.name, str(d.dist.locate_file(""))
    for rel in _record(d):
        parts = rel.split("/")
        if parts[0] == ".." or rel.startswith("/") or ".." in parts:
            continue  # scripts and data outside site-packages
        path = os.path.join(base, rel)
        if parts[-1].startswith("__editable__") or (parts[-1] == "direct_url.json" and _editable(path)):
            raise AgentEnvError(f"{name} is an editable install; the agent's environment needs a regular one")
        if parts[-1] == "direct_url.json":
            continue  # names a host path, and nothing imports it
        try:
            st = os.stat(path)
        except OSError:
            continue  # listed, but removed since
        if stat.S_ISREG(st.st_mode):
            yield rel, path, st


def _editable(path: str) -> bool:
    """Whether a distribution's ``direct_url.json`` (PEP 610) says it is an editable install."""
    try:
        info = parse_json(Path(path).read_bytes(), what="direct_url.json")
    except (OSError, ParseError):
        return False  # unreadable: nothing says it is editable
    dir_info = info.get("dir_info") if isinstance(info, dict) else None
    return isinstance(dir_info, dict) and dir_info.get("editable") is True


# --- the plan and its digest --------------------------------------------------------------------


def plan(modules: Sequence[str] = (), packages: Sequence[str] = ()) -> _Plan:
    """What goes into the environment for an agent that needs ``modules`` besides the client, and the
    installed distributions ``packages`` (with what they require)."""
    for name in modules:
        if name.split(".")[0] != "ale":
            raise AgentEnvError(f"{name!r}: only modules of the ale package are bundled into the agent's environment")
    ale_modules, external = ale_closure((*CLIENT_MODULES, *modules))
    ale_files = _ale_files(ale_modules)
    dists = distribution_closure(external, packages)
    listed = sorted({rel: (path, st) for d in dists for rel, path, st in _dist_files(d)}.items())
    interp = interpreter()
    h = hashlib.sha256(json.dumps(["ale-agent-env", FORMAT, MOUNT_POINT, sys.version, attrs.asdict(interp)]).encode())
    for rel, path in ale_files:
        h.update(f"\nale\0{rel}\0{hashlib.sha256(path.read_bytes()).hexdigest()}".encode())
    for rel, (_path, st) in listed:
        h.update(f"\ndist\0{rel}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_mode & 0o7777:o}".encode())
    return _Plan(
        digest=h.hexdigest(),
        interpreter=interp,
        modules=tuple(sorted(ale_modules)),
        ale_files=tuple(ale_files),
        distributions=tuple(f"{d.name}=={d.version}" for d in dists),
        dist_files=tuple((rel, path) for rel, (path, _st) in listed),
    )


# --- building -----------------------------------------------------------------------------------


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "ale" / "agent-env"


def ensure(modules: Sequence[str] = (), *, packages: Sequence[str] = (), cache_dir: Path | None = None) -> AgentEnv:
    """The environment for an agent that needs ``modules`` besides the client and the installed
    distributions ``packages`` (``ale run --agent-package``), built if missing."""
    p = plan(modules, packages)
    cache = cache_dir or default_cache_dir()
    final = cache / p.digest
    try:
        cache.mkdir(parents=True, exist_ok=True)
        _check_owner(cache)
        if not (final / "pyvenv.cfg").is_file():
            _build(p, final)
            _prune(cache, keep=p.digest)
        _check_owner(final)
        os.utime(final)  # last used, for _prune
    except OSError as exc:
        raise AgentEnvError(f"cannot build the agent's environment in {cache}: {exc}") from None
    return AgentEnv(
        root=final, digest=p.digest, interpreter=p.interpreter, modules=p.modules, distributions=p.distributions
    )


def _check_owner(path: Path) -> None:
    """``path`` must be ours (another user's folder could hold anything); writable by us alone."""
    st = path.stat()
    if st.st_uid != os.geteuid():
        raise AgentEnvError(f"{path} belongs to uid {st.st_uid}, not to this user (uid {os.geteuid()})")
    if st.st_mode & 0o022:
        os.chmod(path, stat.S_IMODE(st.st_mode) & ~0o022)


def _site_packages(version: str) -> str:
    return f"lib/python{version}/site-packages"


def _place(src: Path, dst: Path, *, link: bool) -> None:
    """Hard-link ``src`` to ``dst`` when it is readable by anyone, else copy it readable."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    mode = src.stat().st_mode
    if link and mode & 0o004 and (mode & 0o001 or not mode & 0o100):
        try:
            os.link(src, dst)
            return
        except OSError:
            pass  # another filesystem, or protected_hardlinks: copy
    shutil.copy2(src, dst)
    os.chmod(dst, 0o755 if mode & 0o100 else 0o644)


def _build(p: _Plan, final: Path) -> None:
    tmp = Path(tempfile.mkdtemp(prefix=f".build-{p.digest[:16]}-", dir=final.parent))
    try:
        site_dir = tmp / _site_packages(p.interpreter.version)
        for rel, host in p.dist_files:
            _place(Path(host), site_dir / rel, link=True)
        for rel, source in p.ale_files:
            _place(source, site_dir / rel, link=False)
        compileall.compile_dir(
            site_dir, quiet=2, ddir=f"{MOUNT_POINT}/{_site_packages(p.interpreter.version)}", workers=1
        )
        (tmp / "bin").mkdir()
        os.symlink(p.interpreter.executable, tmp / "bin" / "python3")
        for alias in ("python", f"python{p.interpreter.version}"):
            os.symlink("python3", tmp / "bin" / alias)
        (tmp / "pyvenv.cfg").write_text(
            f"home = {os.path.dirname(p.interpreter.executable)}\n"
            "include-system-site-packages = false\n"
            f"version = {platform.python_version()}\n"
        )
        description = {
            "format": FORMAT,
            "digest": p.digest,
            "python": p.interpreter.version,
            "modules": list(p.modules),
            "distributions": list(p.distributions),
        }
        (tmp / "agent-env.json").write_text(json.dumps(description, indent=2) + "\n")
        (tmp / "empty").mkdir()
        for folder, _dirs, files in os.walk(tmp):
            os.chmod(folder, 0o755)
            for name in files:
                path = os.path.join(folder, name)
                if not os.path.islink(path) and not os.stat(path).st_mode & 0o004:
                    os.chmod(path, 0o644)  # written by compileall or here
        os.chmod(tmp / "empty", 0o555)
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / "pyvenv.cfg").is_file():
                raise
            # Another run built the same environment first: use theirs.
    finally:
        if tmp.exists():
            _remove(tmp)


def _remove(path: Path) -> None:
    for folder, _dirs, _files in os.walk(path):
        os.chmod(folder, 0o755)
    shutil.rmtree(path, ignore_errors=True)


def _prune(cache: Path, *, keep: str) -> None:
    """Remove crashed builds and environments no run has used for a month."""
    now = time.time()
    for entry in cache.iterdir():
        try:
            age = now - entry.lstat().st_mtime
        except OSError:
            continue
        if not stat.S_ISDIR(entry.lstat().st_mode) or entry.name == keep:
            continue
        if (entry.name.startswith(".build-") and age > STALE_BUILD_S) or (
            len(entry.name) == 64 and all(c in "0123456789abcdef" for c in entry.name) and age > UNUSED_ENV_S
        ):
            _remove(entry)
