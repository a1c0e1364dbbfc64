"""An image's definition: one TOML file under ``images/`` (docs/images.md, "Definitions").

A definition says what goes into an image and nothing about how: the Debian packages (each
pinned by version and SHA-256), the Python wheels (each pinned by URL and SHA-256), the project's
own files, a few generated files and folders, and the image's user, entrypoint and environment.
The same file is read by the builder here (:mod:`ale.images.build`) and by ``flake.nix``
(``builtins.fromTOML``), so both build from one list.

This module parses and checks a definition; it does no other I/O than reading the file. Every
problem is a :class:`DefinitionError` naming the file and the key.

Standard library only (dataclasses, tomllib): the builder must run in a bare interpreter too,
inside a Nix build.
"""

from __future__ import annotations

import hashlib
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

FORMAT = 1
NAME = re.compile(r"^[a-z][a-z0-9-]{0,62}$")
SHA256 = re.compile(r"^[0-9a-f]{64}$")
DEBIAN_NAME = re.compile(r"^[a-z0-9][a-z0-9+.-]+$")
DEBIAN_VERSION = re.compile(r"^[0-9A-Za-z.+~:-]+$")
# a POSIX timestamp of snapshot.debian.org: 20261201T000000Z
SNAPSHOT = re.compile(r"^[0-9]{8}T[0-9]{6}Z$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MAX_BYTES = 1024 * 1024  # a definition is a small text file


def canonical_name(name: str) -> str:
    """A distribution's name as PEP 503 compares it."""
    return re.sub(r"[-_.]+", "-", name).lower()


class DefinitionError(ValueError):
    """A definition that cannot be built from; the message names the file and the key."""


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    gid: int
    home: str


@dataclass(frozen=True)
class DebianPackage:
    name: str
    version: str
    archive: str  # a key of Debian.archives
    path: str  # the pool path in that archive
    sha256: str
    size: int


@dataclass(frozen=True)
class Debian:
    suites: tuple[str, ...]
    archives: Mapping[str, str]  # name -> mirror URL
    snapshot: str  # snapshot.debian.org timestamp: the second place each .deb is fetched from
    want: tuple[str, ...]  # what `ale images pin` resolves
    exclude: tuple[str, ...]  # dependencies taken as satisfied without installing them
    drop: tuple[str, ...]  # path prefixes not installed (documentation, manual pages)
    keep: tuple[str, ...]  # exceptions to drop (glob patterns: the copyright files)
    packages: tuple[DebianPackage, ...]


@dataclass(frozen=True)
class Wheel:
    name: str
    version: str
    url: str
    sha256: str


@dataclass(frozen=True)
class Python:
    version: str  # the interpreter's "3.11", from the Debian packages
    abi: str  # "cp311"
    glibc: str  # "2.36": the newest manylinux wheels the image's C library runs
    site: str  # absolute: where wheels and the project's packages go
    bin: str  # absolute: where console scripts go
    want: tuple[str, ...]  # requirements `ale images pin` resolves
    wheels: tuple[Wheel, ...]


@dataclass(frozen=True)
class Project:
    files: tuple[str, ...]  # glob patterns relative to the checkout
    rename: Mapping[str, str]  # checkout folder -> import name (pyproject's package-dir)


@dataclass(frozen=True)
class Folder:
    path: str
    mode: int


@dataclass(frozen=True)
class Definition:
    name: str
    description: str
    source: Path  # the file it was read from
    sha256: str  # of the file's bytes
    user: User
    entrypoint: tuple[str, ...]
    cmd: tuple[str, ...]
    workdir: str
    env: Mapping[str, str]
    labels: Mapping[str, str]
    debian: Debian
    python: Python
    project: Project
    folders: tuple[Folder, ...]
    symlinks: Mapping[str, str]  # absolute path -> target
    texts: Mapping[str, str]  # absolute path -> the contents of a small file (mode 0644)


# --- reading ------------------------------------------------------------------------------------


class _Reader:
    """Typed access to one table of the TOML document, with errors that name the key."""

    def __init__(self, table: Mapping[str, Any], where: str, file: Path) -> None:
        self.table, self.where, self.file = table, where, file

    def fail(self, key: str, why: str) -> DefinitionError:
        dotted = f"{self.where}.{key}" if self.where else key
        return DefinitionError(f"{self.file}: {dotted}: {why}")

    def get(self, key: str, kind: type, default: Any = None) -> Any:
        if key not in self.table:
            if default is None:
                raise self.fail(key, "missing")
            return default
        value = self.table[key]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise self.fail(key, f"must be a {kind.__name__}, not {type(value).__name__}")
        return value

    def text(self, key: str, default: str | None = None, pattern: re.Pattern[str] | None = None) -> str:
        value: str = self.get(key, str, default)
        if pattern is not None and not pattern.fullmatch(value):
            raise self.fail(key, f"{value!r} does not match {pattern.pattern}")
        return value

    def texts(self, key: str, default: tuple[str, ...] | None = None) -> tuple[str, ...]:
        value = self.get(key, list, list(default) if default is not None else None)
        for i, item in enumerate(value):
            if not isinstance(item, str):
                raise self.fail(f"{key}[{i}]", "must be a string")
        return tuple(value)

    def mapping(self, key: str, default: Mapping[str, str] | None = None) -> dict[str, str]:
        value = self.get(key, dict, dict(default) if default is not None else None)
        for k, v in value.items():
            if not isinstance(v, str):
                raise self.fail(f"{key}.{k}", "must be a string")
        return dict(value)

    def sub(self, key: str) -> _Reader:
        return _Reader(self.get(key, dict), f"{self.where}.{key}" if self.where else key, self.file)

    def rows(self, key: str) -> list[_Reader]:
        value = self.get(key, list, [])
        rows = []
        for i, item in enumerate(value):
            if not isinstance(item, dict):
                raise self.fail(f"{key}[{i}]", "must be a table")
            rows.append(_Reader(item, f"{self.where}.{key}[{i}]", self.file))
        return rows

    def unknown(self, known: set[str]) -> None:
        extra = sorted(set(self.table) - known)
        if extra:
            raise self.fail(extra[0], f"unknown key (known: {', '.join(sorted(known))})")


def _absolute(r: _Reader, key: str, value: str, *, root: bool = False) -> str:
    """``value`` if it is a normalised absolute path (``/`` itself only where ``root``)."""
    p = PurePosixPath(value)
    if not p.is_absolute() or ".." in p.parts or str(p) != value or (value == "/" and not root):
        raise r.fail(key, f"{value!r} must be a normalised absolute path")
    return value


def _user(r: _Reader) -> User:
    r.unknown({"name", "uid", "gid", "home"})
    uid, gid = r.get("uid", int), r.get("gid", int)
    for key, value in (("uid", uid), ("gid", gid)):
        if not 1 <= value < 2**31:
            raise r.fail(key, "must be a non-root id (1 to 2^31-1)")
    home = _absolute(r, "home", r.text("home"), root=True)
    return User(name=r.text("name", pattern=NAME), uid=uid, gid=gid, home=home)


def _debian_package(r: _Reader, archives: Mapping[str, str]) -> DebianPackage:
    r.unknown({"name", "version", "archive", "path", "sha256", "size"})
    archive = r.text("archive")
    if archive not in archives:
        raise r.fail("archive", f"{archive!r} is not one of [debian].archives")
    path = r.text("path")
    if not path.startswith("pool/") or ".." in path.split("/") or not path.endswith(".deb"):
        raise r.fail("path", f"{path!r} is not a pool path of a .deb")
    size = r.get("size", int)
    if size <= 0:
        raise r.fail("size", "must be positive")
    return DebianPackage(
        name=r.text("name", pattern=DEBIAN_NAME),
        version=r.text("version", pattern=DEBIAN_VERSION),
        archive=archive,
        path=path,
        sha256=r.text("sha256", pattern=SHA256),
        size=size,
    )


def _debian(r: _Reader) -> Debian:
    r.unknown({"suites", "archives", "snapshot", "want", "exclude", "drop", "keep", "packages"})
    archives = r.mapping("archives")
    for name, url in archives.items():
        if not NAME.fullmatch(name) or not url.startswith(("http://", "https://")) or url.endswith("/"):
            raise r.fail(f"archives.{name}", f"{url!r}: a name and an http(s) URL without a trailing slash")
    packages = tuple(_debian_package(row, archives) for row in r.rows("packages"))
    names = [p.name for p in packages]
    if names != sorted(set(names)):
        raise r.fail("packages", "must be sorted by name, each name once")
    for key in ("drop", "keep"):
        for prefix in r.texts(key, ()):
            if prefix.startswith("/") or ".." in prefix.split("/"):
                raise r.fail(key, f"{prefix!r} must be relative to / and stay inside it")
    return Debian(
        suites=r.texts("suites"),
        archives=archives,
        snapshot=r.text("snapshot", pattern=SNAPSHOT),
        want=r.texts("want"),
        exclude=r.texts("exclude", ()),
        drop=r.texts("drop", ()),
        keep=r.texts("keep", ()),
        packages=packages,
    )


def _wheel(r: _Reader) -> Wheel:
    r.unknown({"name", "version", "url", "sha256"})
    url = r.text("url")
    if not url.startswith("https://") or not url.endswith(".whl"):
        raise r.fail("url", f"{url!r} is not an https URL of a wheel")
    return Wheel(name=r.text("name"), version=r.text("version"), url=url, sha256=r.text("sha256", pattern=SHA256))


def _python(r: _Reader) -> Python:
    r.unknown({"version", "abi", "glibc", "site", "bin", "want", "wheels"})
    wheels = tuple(_wheel(row) for row in r.rows("wheels"))
    names = [canonical_name(w.name) for w in wheels]
    if names != sorted(set(names)):
        raise r.fail("wheels", "must be sorted by name, each name once")
    return Python(
        version=r.text("version", pattern=re.compile(r"3\.[0-9]+")),
        abi=r.text("abi", pattern=re.compile(r"cp3[0-9]+")),
        glibc=r.text("glibc", pattern=re.compile(r"2\.[0-9]+")),
        site=_absolute(r, "site", r.text("site")),
        bin=_absolute(r, "bin", r.text("bin")),
        want=r.texts("want"),
        wheels=wheels,
    )


def _project(r: _Reader) -> Project:
    r.unknown({"files", "rename"})
    files = r.texts("files")
    for i, pattern in enumerate(files):
        if pattern.startswith("/") or ".." in pattern.split("/") or "**" in pattern:
            raise r.fail(f"files[{i}]", f"{pattern!r}: a relative glob inside the checkout, without **")
    rename = r.mapping("rename", {})
    for folder, name in rename.items():
        if "/" in folder or not re.fullmatch(r"[a-z_][a-z0-9_]*", name):
            raise r.fail(f"rename.{folder}", f"{name!r}: a top-level folder and an import name")
    return Project(files=files, rename=rename)


def _folders(r: _Reader) -> tuple[Folder, ...]:
    out = []
    for row in r.rows("folders"):
        row.unknown({"path", "mode"})
        mode = row.text("mode", pattern=re.compile(r"[0-7]{3,4}"))
        out.append(Folder(path=_absolute(row, "path", row.text("path")), mode=int(mode, 8)))
    return tuple(out)


def _symlinks(r: _Reader) -> dict[str, str]:
    links = r.mapping("symlinks", {})
    for path, target in links.items():
        _absolute(r, f"symlinks.{path}", path)
        if not target or "\0" in target:
            raise r.fail(f"symlinks.{path}", "needs a target")
    return links


def _texts(r: _Reader) -> dict[str, str]:
    texts = r.mapping("text", {})
    for path in texts:
        _absolute(r, f"text.{path}", path)
    return texts


def _env(r: _Reader) -> dict[str, str]:
    env = r.mapping("env", {})
    for key in env:
        if not ENV_NAME.fullmatch(key):
            raise r.fail(f"env.{key}", "is not a variable name")
    return env


def _toml(raw: bytes, source: Path) -> dict[str, Any]:
    if len(raw) > MAX_BYTES:
        raise DefinitionError(f"{source}: larger than {MAX_BYTES} bytes")
    try:
        return tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise DefinitionError(f"{source}: not a TOML file: {exc}") from None
    except RecursionError:
        # tomllib parses nested arrays and inline tables recursively; a definition nests three deep
        raise DefinitionError(f"{source}: nested too deeply to be a definition") from None


def parse(raw: bytes, source: Path) -> Definition:
    """The definition in ``raw`` (the bytes of ``source``)."""
    doc = _toml(raw, source)
    r = _Reader(doc, "", source)
    r.unknown({"format", "name", "description", "image", "debian", "python", "project", "files"})
    if r.get("format", int) != FORMAT:
        raise r.fail("format", f"this builder reads format {FORMAT}")
    image = r.sub("image")
    image.unknown({"user", "entrypoint", "cmd", "workdir", "env", "labels"})
    files = r.sub("files") if "files" in doc else _Reader({}, "files", source)
    files.unknown({"folders", "symlinks", "text"})
    name = r.text("name", pattern=NAME)
    if source.name != f"{name}.toml":
        raise r.fail("name", f"{name!r} must be the file's name ({source.name})")
    return Definition(
        name=name,
        description=r.text("description"),
        source=source,
        sha256=hashlib.sha256(raw).hexdigest(),
        user=_user(image.sub("user")),
        entrypoint=image.texts("entrypoint", ()),
        cmd=image.texts("cmd", ()),
        workdir=_absolute(image, "workdir", image.text("workdir"), root=True),
        env=_env(image),
        labels=image.mapping("labels", {}),
        debian=_debian(r.sub("debian")),
        python=_python(r.sub("python")),
        project=_project(r.sub("project")),
        folders=_folders(files),
        symlinks=_symlinks(files),
        texts=_texts(files),
    )


@dataclass(frozen=True)
class SourcePackage:
    """A distribution the Nix build compiles from its source release instead of using its wheel."""

    name: str
    version: str
    url: str
    sha256: str
    cargo_lock: str  # a file beside the environment's definition: the release's Cargo.lock


@dataclass(frozen=True)
class Environment:
    """A Python environment that is not an image: the ``ale`` package ``flake.nix`` builds
    (``images/env/*.toml``): hash-pinned wheels for nixpkgs' interpreter, and the distributions
    built from source instead."""

    name: str
    description: str
    source: Path
    python: Python
    from_source: tuple[SourcePackage, ...]


def _source_package(r: _Reader, name: str, folder: Path) -> SourcePackage:
    r.unknown({"version", "url", "sha256", "cargo_lock"})
    url, lock = r.text("url"), r.text("cargo_lock")
    if not url.startswith("https://") or not url.endswith(".tar.gz"):
        raise r.fail("url", f"{url!r} is not an https URL of a source release")
    if "/" in lock or not (folder / lock).is_file():
        raise r.fail("cargo_lock", f"{lock!r} is not a file beside {r.file.name}")
    return SourcePackage(
        name=name, version=r.text("version"), url=url, sha256=r.text("sha256", pattern=SHA256), cargo_lock=lock
    )


def parse_env(raw: bytes, source: Path) -> Environment:
    """The environment definition in ``raw`` (the bytes of ``source``)."""
    doc = _toml(raw, source)
    r = _Reader(doc, "", source)
    r.unknown({"format", "name", "description", "python", "from_source"})
    if r.get("format", int) != FORMAT:
        raise r.fail("format", f"this builder reads format {FORMAT}")
    name = r.text("name", pattern=NAME)
    if source.name != f"{name}.toml":
        raise r.fail("name", f"{name!r} must be the file's name ({source.name})")
    table = r.sub("from_source") if "from_source" in doc else _Reader({}, "from_source", source)
    packages = tuple(_source_package(table.sub(k), k, source.parent) for k in sorted(table.table))
    return Environment(
        name=name, description=r.text("description"), source=source, python=_python(r.sub("python")),
        from_source=packages,
    )  # fmt: skip


def load_env(path: Path) -> Environment:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise DefinitionError(f"{path}: cannot read: {exc.strerror}") from None
    return parse_env(raw, path)


def load(path: Path) -> Definition:
    """Read and check the definition at ``path``."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise DefinitionError(f"{path}: cannot read: {exc.strerror}") from None
    return parse(raw, path)


def find(folder: Path) -> dict[str, Path]:
    """The definitions in ``folder`` (``images/``): name -> file, sorted by name."""
    found = {p.stem: p for p in sorted(folder.glob("*.toml"))}
    if not found:
        raise DefinitionError(f"{folder}: no image definitions (*.toml)")
    return found
