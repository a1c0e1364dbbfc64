"""The harness's snapshot of the agent's workspace (the I/O half; the rules are
:func:`ale.core.judge_input.snapshot_events`).

The workspace is the agent's: anything may be in it. The walk never follows a symbolic link,
opens every file with ``O_NOFOLLOW | O_NONBLOCK`` and checks it is still the regular file it
listed, reads at most :data:`~ale.core.judge_input.SNAPSHOT_FILE_BYTES` of it, enters at most
:data:`~ale.core.judge_input.SNAPSHOT_MAX_DEPTH` folders deep, skips caches
(:data:`~ale.core.judge_input.SKIPPED_DIRS`) and stops listing after
:data:`~ale.core.judge_input.SNAPSHOT_MAX_LISTED` entries (the rest are counted). Names that are
not UTF-8 are shown with backslash escapes. Blocking: the harness runs it in a worker thread.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ale.core.judge_input import (
    SKIPPED_DIRS,
    SNAPSHOT_FILE_BYTES,
    SNAPSHOT_MAX_DEPTH,
    SNAPSHOT_MAX_LISTED,
    FileEntry,
)

#: entries looked at in all (listed or not), so that a workspace of a million files ends the walk
MAX_SCANNED = 20_000


def _name(raw: bytes) -> str:
    return raw.decode("utf-8", "backslashreplace")


def _read(path: bytes, size: int) -> tuple[bytes | None, str]:
    """The file's bytes if it is still a regular file within the cap, else None and why."""
    if size > SNAPSHOT_FILE_BYTES:
        return None, ""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        return None, f"unreadable: {exc.strerror}"
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None, "changed while it was read"
        chunks, left = [], SNAPSHOT_FILE_BYTES + 1
        while left > 0:
            chunk = os.read(fd, min(left, 65536))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
    except OSError as exc:
        return None, f"unreadable: {exc.strerror}"
    finally:
        os.close(fd)
    if len(data) > SNAPSHOT_FILE_BYTES:
        return None, "grew while it was read"
    return data, ""


def walk(workspace: Path) -> tuple[list[FileEntry], int]:
    """Every entry of the workspace (up to the caps) and how many more were found but not listed."""
    entries: list[FileEntry] = []
    unlisted = scanned = 0
    stack: list[tuple[bytes, str, int]] = [(os.fsencode(workspace), "", 0)]
    while stack:
        folder, prefix, depth = stack.pop()
        try:
            with os.scandir(folder) as it:
                found = sorted(it, key=lambda e: e.name)
        except OSError:
            continue
        subfolders = []
        for entry in found:
            scanned += 1
            if scanned > MAX_SCANNED:
                return entries, unlisted + 1
            name = prefix + _name(entry.name)
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(info.st_mode):
                if entry.name.decode("utf-8", "replace") in SKIPPED_DIRS:
                    continue
                if depth + 1 > SNAPSHOT_MAX_DEPTH:
                    unlisted += 1
                    continue
                subfolders.append((entry.path, name + "/", depth + 1))
                continue
            if len(entries) >= SNAPSHOT_MAX_LISTED:
                unlisted += 1
                continue
            entries.append(_entry(entry.path, name, info))
        stack.extend(reversed(subfolders))
    return entries, unlisted


def _entry(path: bytes, name: str, info: os.stat_result) -> FileEntry:
    executable = bool(info.st_mode & 0o111)
    if stat.S_ISLNK(info.st_mode):
        return FileEntry(name, "symlink", info.st_size, note="not followed")
    if not stat.S_ISREG(info.st_mode):
        return FileEntry(name, "special", 0, note="not a regular file")
    content, note = _read(path, info.st_size)
    return FileEntry(name, "file", info.st_size if content is None else len(content), executable, content, note)
