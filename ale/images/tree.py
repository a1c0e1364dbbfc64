"""A layer's file tree, normalised, and its one byte form as a tar archive.

A :class:`Tree` maps paths (relative to ``/``, no ``./``) to entries whose metadata is already
normalised: owner 0:0, no user or group names, one modification time for every entry
(``SOURCE_DATE_EPOCH``), modes reduced to 0755/0644 for files, 0755 for folders unless a
definition asks for another (``/tmp``'s 1777), no setuid, setgid or device files. File bodies
live in a content-addressed :class:`Store` on disk, so a tree of a few hundred megabytes costs
little memory.

:func:`write_tar` writes the entries sorted by path (bytes of UTF-8), each folder before what
it holds, with a tar header written here byte by byte (ustar; a pax ``path``/``linkpath``
record only for names longer than 100 bytes) rather than by :mod:`tarfile`, whose header
details may change between Python versions: the same tree gives the same bytes in any
interpreter, which is what lets a Nix build and a plain build agree.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO, Literal

Kind = Literal["dir", "file", "symlink", "hardlink"]
BLOCK = 512
_CHUNK = 1024 * 1024


class TreeError(ValueError):
    """Two sources disagree about a path, or a path leaves the tree."""


@dataclass(frozen=True)
class Entry:
    kind: Kind
    mode: int  # permission bits only (and the sticky bit)
    size: int = 0
    sha256: str = ""  # a file's body in the store
    target: str = ""  # a symlink's target as written; a hardlink's path in the tree


def normalise(path: str) -> str:
    """``path`` relative to the image's root without ``./`` or a trailing slash; refuses ``..``."""
    parts = [p for p in PurePosixPath(path.lstrip("/")).parts if p != "."]
    if not parts or ".." in parts or any("\0" in p for p in parts):
        raise TreeError(f"{path!r} is not a path inside the image")
    return "/".join(parts)


def file_mode(mode: int) -> int:
    """0755 when anyone may execute it, else 0644."""
    return 0o755 if mode & 0o111 else 0o644


class Store:
    """File bodies by SHA-256 in a folder of its own (removed by :meth:`close`)."""

    def __init__(self, parent: Path | None = None) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="ale-images-store-", dir=parent))

    def put_stream(self, stream: BinaryIO) -> tuple[str, int]:
        """Store what ``stream`` holds; its SHA-256 and size."""
        h, size = hashlib.sha256(), 0
        fd, tmp = tempfile.mkstemp(dir=self.root)
        with os.fdopen(fd, "wb") as out:
            while chunk := stream.read(_CHUNK):
                h.update(chunk)
                size += len(chunk)
                out.write(chunk)
        digest = h.hexdigest()
        os.replace(tmp, self.root / digest)
        return digest, size

    def put_bytes(self, data: bytes) -> tuple[str, int]:
        digest = hashlib.sha256(data).hexdigest()
        path = self.root / digest
        if not path.exists():
            path.write_bytes(data)
        return digest, len(data)

    def put_file(self, source: Path) -> tuple[str, int]:
        with source.open("rb") as stream:
            return self.put_stream(stream)

    def open(self, sha256: str) -> BinaryIO:
        return (self.root / sha256).open("rb")

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


class Tree:
    """The entries of one layer, by normalised path."""

    def __init__(self) -> None:
        self.entries: dict[str, Entry] = {}

    def _parents(self, path: str) -> None:
        parts = path.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            parent = "/".join(parts[:i])
            existing = self.entries.get(parent)
            if existing is None:
                self.entries[parent] = Entry("dir", 0o755)
            elif existing.kind != "dir":
                raise TreeError(f"{parent} is a {existing.kind}, but {path} is inside it")

    def _put(self, path: str, entry: Entry, origin: str) -> None:
        path = normalise(path)
        self._parents(path)
        existing = self.entries.get(path)
        if existing is not None and existing != entry:
            raise TreeError(f"/{path}: {origin} gives a {entry.kind} where there is a different {existing.kind}")
        self.entries[path] = entry

    def add_dir(self, path: str, mode: int = 0o755, origin: str = "") -> None:
        """A folder; a mode given again (a definition's ``/tmp``) replaces the earlier one."""
        path = normalise(path)
        self._parents(path)
        existing = self.entries.get(path)
        if existing is not None and existing.kind != "dir":
            raise TreeError(f"/{path}: {origin} gives a folder where there is already a {existing.kind}")
        self.entries[path] = Entry("dir", mode & 0o1777)

    def add_file(self, path: str, sha256: str, size: int, mode: int, origin: str = "") -> None:
        self._put(path, Entry("file", file_mode(mode), size=size, sha256=sha256), origin)

    def add_symlink(self, path: str, target: str, origin: str = "") -> None:
        if not target or "\0" in target:
            raise TreeError(f"/{path}: a symlink needs a target")
        self._put(path, Entry("symlink", 0o777, target=target), origin)

    def add_hardlink(self, path: str, target: str, origin: str = "") -> None:
        """A second name for a file of this tree (its mode is the file's, set by :meth:`settle_hardlinks`)."""
        self._put(path, Entry("hardlink", 0, target=normalise(target)), origin)

    def remove(self, path: str) -> None:
        del self.entries[normalise(path)]

    def settle_hardlinks(self) -> None:
        """Make each hard-linked group's first path (in tar order) the file, the rest links to it.

        Extraction needs a link's target earlier in the archive; sorting by path alone could
        put it later. A link whose target is not a file of this tree is an error.
        """
        groups: dict[str, list[str]] = {}
        for path, entry in self.entries.items():
            if entry.kind == "hardlink":
                body = self.entries.get(entry.target)
                if body is None or body.kind != "file":
                    raise TreeError(f"/{path} is a hard link to /{entry.target}, which is not a file here")
                groups.setdefault(entry.target, []).append(path)
        for target, links in groups.items():
            members = sorted([target, *links], key=_sort_key)
            leader = members[0]
            self.entries[leader] = self.entries[target]
            for other in members[1:]:
                self.entries[other] = Entry("hardlink", self.entries[leader].mode, target=leader)

    def sorted_paths(self) -> list[str]:
        return sorted(self.entries, key=_sort_key)

    def size(self) -> int:
        return sum(e.size for e in self.entries.values() if e.kind == "file")


def _sort_key(path: str) -> bytes:
    return path.encode("utf-8")


# --- tar ----------------------------------------------------------------------------------------


def _octal(value: int, width: int) -> bytes:
    digits = f"{value:o}".encode()
    if len(digits) > width - 1:
        raise TreeError(f"{value} does not fit a {width}-byte tar field")
    return digits.rjust(width - 1, b"0") + b"\0"


def _field(value: bytes, width: int) -> bytes:
    if len(value) > width:
        raise TreeError(f"{value!r} does not fit a {width}-byte tar field")
    return value.ljust(width, b"\0")


_TYPES: dict[str, bytes] = {"file": b"0", "hardlink": b"1", "symlink": b"2", "dir": b"5"}


def _header(name: bytes, typeflag: bytes, mode: int, size: int, mtime: int, linkname: bytes = b"") -> bytes:
    head = b"".join(
        [
            _field(name, 100),
            _octal(mode, 8),
            _octal(0, 8),  # uid
            _octal(0, 8),  # gid
            _octal(size, 12),
            _octal(mtime, 12),
            b" " * 8,  # checksum, computed over the header with this field as spaces
            typeflag,
            _field(linkname, 100),
            b"ustar\x0000",
            _field(b"", 32),  # uname: empty, so that no tool maps owners by name
            _field(b"", 32),  # gname
            _octal(0, 8),  # devmajor
            _octal(0, 8),  # devminor
            _field(b"", 155),  # prefix (long names go in a pax record instead)
            b"\0" * 12,
        ]
    )
    checksum = f"{sum(head):06o}".encode() + b"\0 "
    return head[:148] + checksum + head[156:]


def _pax_record(key: str, value: bytes) -> bytes:
    body = b" " + key.encode() + b"=" + value + b"\n"
    length = len(body) + 1
    while len(str(length).encode()) + len(body) != length:
        length += 1
    return str(length).encode() + body


def _pad(size: int) -> bytes:
    return b"\0" * (-size % BLOCK)


def _entry_blocks(path: str, entry: Entry, mtime: int) -> bytes:
    """The header blocks of one entry (a pax header first when a name is too long)."""
    name = path.encode("utf-8") + (b"/" if entry.kind == "dir" else b"")
    link = entry.target.encode("utf-8") if entry.kind in ("symlink", "hardlink") else b""
    records = b""
    if len(name) > 100:
        records += _pax_record("path", name)
        name = name[:99]
    if len(link) > 100:
        records += _pax_record("linkpath", link)
        link = link[:99]
    out = b""
    if records:
        out += _header(b"././@PaxHeader", b"x", 0o644, len(records), mtime) + records + _pad(len(records))
    size = entry.size if entry.kind == "file" else 0
    return out + _header(name, _TYPES[entry.kind], entry.mode, size, mtime, link)


def tar_chunks(tree: Tree, store: Store, mtime: int) -> Iterator[bytes]:
    """The tree as a tar archive, in pieces."""
    for path in tree.sorted_paths():
        entry = tree.entries[path]
        yield _entry_blocks(path, entry, mtime)
        if entry.kind == "file":
            with store.open(entry.sha256) as body:
                while chunk := body.read(_CHUNK):
                    yield chunk
            yield _pad(entry.size)
    yield b"\0" * (2 * BLOCK)


def write_tar(tree: Tree, store: Store, out: BinaryIO, mtime: int) -> tuple[str, int]:
    """Write the tree to ``out`` as a tar archive; its SHA-256 and size."""
    h, size = hashlib.sha256(), 0
    for chunk in tar_chunks(tree, store, mtime):
        h.update(chunk)
        size += len(chunk)
        out.write(chunk)
    return h.hexdigest(), size
