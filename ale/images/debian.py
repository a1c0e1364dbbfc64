"""Debian packages without dpkg: unpack a ``.deb`` into a :class:`~ale.images.tree.Tree`.

A ``.deb`` is an ``ar`` archive holding ``control.tar.*`` (its control file) and ``data.tar.*``
(its files). :func:`unpack` reads ``data.tar`` member by member into the tree, with the
metadata normalised (:mod:`ale.images.tree`) and the merged-``/usr`` layout of Debian 12 applied
as dpkg would through the root's symlinks: ``/bin``, ``/sbin``, ``/lib``, ``/lib64`` are
symlinks into ``/usr``, so a package's ``./bin/sh`` lands in ``usr/bin/sh``.

Maintainer scripts are never run: an image is a set of unpacked files. What a script would
have generated that an image needs (``/etc/passwd``, ``cc``'s alternative symlink) the
definition asks for explicitly. :func:`status_file` writes ``/var/lib/dpkg/status`` from the
control files, so the usual scanners can tell which package versions an image holds.
"""

from __future__ import annotations

import fnmatch
import io
import lzma
import tarfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import BinaryIO, cast

from ale.images.tree import Store, Tree, TreeError, normalise

#: Root folders that Debian 12's merged /usr makes symlinks (path -> target).
MERGED_USR = {"bin": "usr/bin", "sbin": "usr/sbin", "lib": "usr/lib", "lib64": "usr/lib64"}
_AR_MAGIC = b"!<arch>\n"
MAX_CONTROL = 1024 * 1024


class DebError(ValueError):
    """A file that is not a .deb this unpacker reads (the message names the package)."""


def ar_members(stream: BinaryIO, what: str) -> Iterator[tuple[str, BinaryIO]]:
    """(name, body) of each member of an ``ar`` archive; each body is read before the next."""
    if stream.read(8) != _AR_MAGIC:
        raise DebError(f"{what}: not an ar archive")
    while header := stream.read(60):
        if len(header) != 60 or header[58:60] != b"`\n":
            raise DebError(f"{what}: a damaged ar member header")
        name = header[:16].decode("ascii", "replace").strip().rstrip("/")
        try:
            size = int(header[48:58].decode("ascii").strip())
        except ValueError:
            raise DebError(f"{what}: an ar member with an unreadable size") from None
        body = stream.read(size)
        if len(body) != size:
            raise DebError(f"{what}: truncated in member {name}")
        if size % 2:
            stream.read(1)
        yield name, io.BytesIO(body)


def _decompressed(name: str, body: BinaryIO, what: str) -> BinaryIO:
    if name.endswith(".tar"):
        return body
    if name.endswith(".tar.xz"):
        return cast("BinaryIO", lzma.LZMAFile(body))
    if name.endswith(".tar.gz"):
        import gzip

        return cast("BinaryIO", gzip.GzipFile(fileobj=body))
    if name.endswith(".tar.zst"):
        try:
            import zstandard
        except ImportError:
            raise DebError(f"{what}: {name} needs the zstandard module") from None
        return cast("BinaryIO", zstandard.ZstdDecompressor().stream_reader(body))
    raise DebError(f"{what}: {name}: an unknown compression")


def merged_usr(path: str) -> str:
    """Where ``path`` (normalised) lands once the root's merged-/usr symlinks are followed."""
    top, _, rest = path.partition("/")
    if top in MERGED_USR:
        return f"{MERGED_USR[top]}/{rest}" if rest else MERGED_USR[top]
    return path


def _dropped(path: str, drop: Sequence[str], keep: Sequence[str]) -> bool:
    if not any(path == d.rstrip("/") or path.startswith(d.rstrip("/") + "/") for d in drop):
        return False
    return not any(fnmatch.fnmatchcase(path, pattern) for pattern in keep)


def _add_member(tree: Tree, store: Store, member: tarfile.TarInfo, stream: tarfile.TarFile, origin: str) -> None:
    path = merged_usr(normalise(member.name))
    if member.isdir():
        # 1777 (/var/tmp) stays; any other folder is 0755
        tree.add_dir(path, 0o1777 if member.mode & 0o1777 == 0o1777 else 0o755, origin)
    elif member.isreg():
        body = stream.extractfile(member)
        if body is None:
            raise DebError(f"{origin}: {member.name} has no body")
        sha, size = store.put_stream(body)  # type: ignore[arg-type]
        tree.add_file(path, sha, size, member.mode, origin)
    elif member.issym():
        tree.add_symlink(path, member.linkname, origin)
    elif member.islnk():
        tree.add_hardlink(path, merged_usr(normalise(member.linkname)), origin)
    else:
        raise DebError(f"{origin}: {member.name} is a device, FIFO or other special file")


def unpack(
    deb: Path, tree: Tree, store: Store, *, origin: str, drop: Sequence[str] = (), keep: Sequence[str] = ()
) -> bytes:
    """Unpack the files of ``deb`` into ``tree`` (those under ``drop`` left out unless they match
    ``keep``); its control file's bytes."""
    control: bytes | None = None
    data_seen = False
    with deb.open("rb") as raw:
        for name, body in ar_members(raw, origin):
            if name.startswith("control.tar"):
                control = _control(_decompressed(name, body, origin), origin)
            elif name.startswith("data.tar"):
                data_seen = True
                with tarfile.open(fileobj=_decompressed(name, body, origin), mode="r|") as stream:
                    for member in stream:
                        if member.name in (".", "./"):
                            continue
                        try:
                            path = merged_usr(normalise(member.name))
                        except TreeError as exc:
                            raise DebError(f"{origin}: {exc}") from None
                        if _dropped(path, drop, keep):
                            continue
                        _add_member(tree, store, member, stream, origin)
    if control is None or not data_seen:
        raise DebError(f"{origin}: no control.tar or data.tar member")
    return control


def _control(body: BinaryIO, what: str) -> bytes:
    with tarfile.open(fileobj=body, mode="r|") as stream:
        for member in stream:
            if member.isreg() and member.name.lstrip("./") == "control":
                if member.size > MAX_CONTROL:
                    raise DebError(f"{what}: a control file of {member.size} bytes")
                f = stream.extractfile(member)
                if f is not None:
                    return f.read()
    raise DebError(f"{what}: control.tar has no control file")


def add_merged_usr_links(tree: Tree) -> None:
    """The root's symlinks into /usr (Debian 12's merged /usr), as relative links."""
    for path, target in MERGED_USR.items():
        tree.add_symlink(path, target, "merged /usr")


def status_file(controls: dict[str, bytes]) -> bytes:
    """``/var/lib/dpkg/status`` for the unpacked packages (name -> control file), sorted by name."""
    out = []
    for name in sorted(controls):
        lines = controls[name].decode("utf-8", "replace").strip("\n").split("\n")
        if not lines or not lines[0].startswith("Package:"):
            raise DebError(f"{name}: its control file does not start with Package:")
        out.append("\n".join([lines[0], "Status: install ok installed", *lines[1:]]) + "\n")
    return "\n".join(out).encode("utf-8")
