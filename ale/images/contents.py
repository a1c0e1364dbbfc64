"""What a built image holds of Python, read from its OCI layout's layers (no engine, no container):
the distributions installed in a ``site-packages`` folder (each ``*.dist-info/METADATA``'s name and
version), the project modules under it, and the interpreter a path names with the Debian package
that installed it (``/var/lib/dpkg/status``). The OCI runtimes describe the agent container's
Python environment with it in the bundle manifest (``agent.environment``, docs/formats.md).

A later layer's entry replaces an earlier one's at the same path (the builder never writes the
same path twice, and writes no whiteouts). Reading is bounded: only headers are walked, and only
the few small files named above are read, each at most :data:`MAX_FILE` bytes.
"""

from __future__ import annotations

import posixpath
import re
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from email.parser import HeaderParser
from pathlib import Path

from ale.images import layout

MAX_FILE = 1024 * 1024  # a METADATA's headers or the dpkg status file
MAX_LINKS = 16
DPKG_STATUS = "var/lib/dpkg/status"
_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,198}[A-Za-z0-9])?")
_VERSION = re.compile(r"[A-Za-z0-9.+!_-]{1,64}")


class ContentsError(ValueError):
    """A layout whose Python environment cannot be read (the message says what is missing)."""


@dataclass(frozen=True)
class PythonEnvironment:
    """An image's Python environment at ``site``, and its interpreter."""

    executable: str  # the path asked for (for example /ale/python/bin/python3)
    resolved: str  # the file it names, symbolic links followed (/usr/bin/python3.11)
    version: str  # the interpreter's upstream version (3.11.2), from its Debian package's
    package: str  # that package and its Debian version: "python3.11-minimal 3.11.2-6+deb12u6"
    modules: tuple[str, ...]  # the project's modules in site, dotted, sorted ("ale", "ale.client", ...)
    distributions: tuple[str, ...]  # name==version, sorted by name


def _members(path: Path) -> Iterator[tuple[tarfile.TarFile, tarfile.TarInfo]]:
    with tarfile.open(path, mode="r:") as archive:
        while (member := archive.next()) is not None:
            yield archive, member


def _read(archive: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    f = archive.extractfile(member)
    return b"" if f is None else f.read(MAX_FILE)


def _distribution(metadata: bytes) -> str | None:
    headers = HeaderParser().parsestr(metadata.decode("utf-8", errors="replace"), headersonly=True)
    name, version = headers.get("Name", "").strip(), headers.get("Version", "").strip()
    if not _NAME.fullmatch(name) or not _VERSION.fullmatch(version):
        return None
    return f"{re.sub(r'[-_.]+', '-', name).lower()}=={version}"


def _module(relative: str) -> str | None:
    """``ale/client/_rpc.py`` -> ``ale.client._rpc``; ``ale/__init__.py`` -> ``ale``; else None."""
    if not relative.endswith(".py"):
        return None
    parts = relative[: -len(".py")].split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts) if parts and all(p.isidentifier() for p in parts) else None


def _package_version(status: bytes, package: str) -> str | None:
    for paragraph in status.decode("utf-8", errors="replace").split("\n\n"):
        fields = dict(line.split(": ", 1) for line in paragraph.splitlines() if ": " in line and line[:1] != " ")
        if fields.get("Package") == package and "Version" in fields:
            return fields["Version"].strip()
    return None


def _resolve(links: dict[str, str], path: str) -> str:
    """``path`` (no leading slash) with the image's symbolic links followed, also in its folders."""
    for _ in range(MAX_LINKS):
        parts = path.split("/")
        for i in range(1, len(parts) + 1):
            prefix = "/".join(parts[:i])
            if prefix in links:
                target = links[prefix]
                base = "" if target.startswith("/") else posixpath.dirname(prefix)
                joined = posixpath.normpath(posixpath.join("/", base, target, *parts[i:])).lstrip("/")
                path = joined
                break
        else:
            return path
    raise ContentsError(f"/{path}: too many levels of symbolic links")


@dataclass
class _Found:
    """What a walk over the layers collected."""

    distributions: dict[str, str]
    modules: set[str]
    links: dict[str, str]
    files: set[str]
    status: bytes = b""


def _scan(root: Path, site: str, project: tuple[str, ...]) -> _Found:
    site_rel = site.strip("/") + "/"
    found = _Found({}, set(), {}, set())
    for path in layout.layer_paths(root):
        for archive, member in _members(path):
            name = member.name.rstrip("/")
            if member.issym():
                found.links[name] = member.linkname
                continue
            if member.isfile():
                found.files.add(name)
            if name == DPKG_STATUS and member.isfile():
                found.status = _read(archive, member)
            elif name.startswith(site_rel) and member.isfile():
                inner = name[len(site_rel) :]
                top, _, rest = inner.partition("/")
                if top.endswith(".dist-info") and rest == "METADATA":
                    if (dist := _distribution(_read(archive, member))) is not None:
                        found.distributions[dist.partition("==")[0]] = dist
                elif top in project and (module := _module(inner)) is not None:
                    found.modules.add(module)
    return found


def python_environment(
    root: Path, *, site: str, executable: str, project: tuple[str, ...] = ("ale",)
) -> PythonEnvironment:
    """The Python environment of the image whose layout is ``root``: the distributions and the
    ``project`` packages' modules in ``site``, the interpreter ``executable`` names."""
    try:
        found = _scan(root, site, project)
    except (layout.LayoutError, OSError, tarfile.TarError) as exc:
        raise ContentsError(f"{root}: cannot read the image's layers: {exc}") from None
    resolved = "/" + _resolve(found.links, executable.lstrip("/"))
    if resolved[1:] not in found.files:
        raise ContentsError(f"{root}: {executable} ({resolved}) is not a file of the image")
    interpreter = posixpath.basename(resolved)  # python3.11
    if not re.fullmatch(r"python3\.[0-9]{1,2}", interpreter):
        raise ContentsError(f"{root}: {executable} is {resolved}, not a python3.X interpreter")
    package = f"{interpreter}-minimal"  # Debian's package of /usr/bin/python3.X
    debian_version = _package_version(found.status, package)
    if debian_version is None:
        raise ContentsError(f"{root}: the image's dpkg status has no {package} ({executable} is {resolved})")
    upstream = debian_version.partition(":")[2] or debian_version  # after an epoch, if any
    return PythonEnvironment(
        executable=executable,
        resolved=resolved,
        version=upstream.partition("-")[0].partition("+")[0],
        package=f"{package} {debian_version}",
        modules=tuple(sorted(found.modules)),
        distributions=tuple(found.distributions[k] for k in sorted(found.distributions)),
    )
