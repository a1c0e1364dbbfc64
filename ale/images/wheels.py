"""Installing a wheel into a :class:`~ale.images.tree.Tree`, as an installer would, minus pip.

A wheel is a zip archive laid out like a site-packages folder (PEP 427). Its members go under
the definition's ``site``; ``NAME.data/purelib`` and ``platlib`` there too, ``scripts`` into
``bin`` (a ``#!python`` line made ``#!/usr/bin/pythonX.Y``), ``data`` under the prefix (the
folder above ``lib/``), ``headers`` under the prefix's ``include/``. Console scripts from
``entry_points.txt`` get a small launcher each. Modes come from the zip's Unix attributes
(executable or not); nothing else of the zip (times, order, compression) reaches the tree.

No byte code is compiled: the marshal format is not reproducible from build to build, and the
images' root is read-only, so Python compiles in memory (docs/images.md, "What is not in an image").
"""

from __future__ import annotations

import configparser
import re
import zipfile
from pathlib import Path, PurePosixPath

from ale.images.tree import Store, Tree, TreeError, normalise

MAX_MEMBER = 1024**3
_ENTRY = re.compile(r"^([A-Za-z_][\w.]*)\s*:\s*([A-Za-z_][\w.]*)\s*(\[.*\])?$")


class WheelError(ValueError):
    """A file that is not a wheel this installer reads (the message names it)."""


def _prefix(site: str) -> str:
    """``/usr/local`` for ``/usr/local/lib/python3.11/dist-packages``."""
    parts = PurePosixPath(site).parts
    if "lib" not in parts:
        raise WheelError(f"{site}: a site folder has a lib/ component")
    return str(PurePosixPath(*parts[: parts.index("lib")]))


def _destination(name: str, data_dir: str, site: str, bin_dir: str, python: str) -> tuple[str, bool]:
    """Where a member goes, and whether it is a script whose #! line is rewritten."""
    if not name.startswith(data_dir + "/"):
        return f"{site}/{name}", False
    scheme, _, rest = name[len(data_dir) + 1 :].partition("/")
    if not rest:
        raise WheelError(f"{name}: a .data member outside a scheme folder")
    if scheme in ("purelib", "platlib"):
        return f"{site}/{rest}", False
    if scheme == "scripts":
        return f"{bin_dir}/{rest}", True
    if scheme == "data":
        return f"{_prefix(site)}/{rest}", False
    if scheme == "headers":
        return f"{_prefix(site)}/include/python{python}/{rest}", False
    raise WheelError(f"{name}: an unknown .data scheme {scheme!r}")


def _script(body: bytes, python: str) -> bytes:
    first, sep, rest = body.partition(b"\n")
    if first.startswith(b"#!python"):
        return f"#!/usr/bin/python{python}".encode() + first[len(b"#!python") :] + sep + rest
    return body


def _launchers(entry_points: str, what: str) -> dict[str, str]:
    parser = configparser.ConfigParser(interpolation=None, delimiters=("=",))
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    try:
        parser.read_string(entry_points)
    except configparser.Error as exc:
        raise WheelError(f"{what}: entry_points.txt: {exc}") from None
    if not parser.has_section("console_scripts"):
        return {}
    out = {}
    for script, target in parser.items("console_scripts"):
        m = _ENTRY.match(target.strip())
        if m is None or "/" in script:
            raise WheelError(f"{what}: console script {script!r} = {target!r}")
        out[script] = f"{m.group(1)}:{m.group(2)}"
    return out


def _launcher(target: str, python: str) -> bytes:
    module, _, attr = target.partition(":")
    head = attr.split(".")[0]
    return (
        f"#!/usr/bin/python{python}\nimport sys\nfrom {module} import {head}\n"
        f"if __name__ == '__main__':\n    sys.exit({attr}())\n"
    ).encode()


def install(wheel: Path, tree: Tree, store: Store, *, site: str, bin_dir: str, python: str, origin: str) -> None:
    """Install the files of ``wheel`` into ``tree``."""
    try:
        archive = zipfile.ZipFile(wheel)
    except (OSError, zipfile.BadZipFile) as exc:
        raise WheelError(f"{origin}: not a wheel: {exc}") from None
    with archive:
        infos = [i for i in archive.infolist() if not i.is_dir()]
        dist_infos = {i.filename.split("/")[0] for i in infos if i.filename.split("/")[0].endswith(".dist-info")}
        if len(dist_infos) != 1:
            raise WheelError(f"{origin}: {len(dist_infos)} .dist-info folders, not one")
        dist_info = dist_infos.pop()
        data_dir = dist_info.removesuffix(".dist-info") + ".data"
        for info in sorted(infos, key=lambda i: i.filename):
            if info.file_size > MAX_MEMBER:
                raise WheelError(f"{origin}: {info.filename} is {info.file_size} bytes")
            try:
                dest, is_script = _destination(normalise(info.filename), data_dir, site, bin_dir, python)
            except TreeError as exc:
                raise WheelError(f"{origin}: {exc}") from None
            body = archive.read(info)
            mode = (info.external_attr >> 16) & 0o777
            if is_script:
                body, mode = _script(body, python), 0o755
            sha, size = store.put_bytes(body)
            tree.add_file(dest, sha, size, mode, origin)
        if f"{dist_info}/entry_points.txt" in archive.namelist():
            text = archive.read(f"{dist_info}/entry_points.txt").decode("utf-8")
            for script, target in sorted(_launchers(text, origin).items()):
                sha, size = store.put_bytes(_launcher(target, python))
                tree.add_file(f"{bin_dir}/{script}", sha, size, 0o755, origin)
