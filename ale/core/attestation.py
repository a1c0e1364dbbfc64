"""What the local runtime attests in place of an image digest (``docs/formats.md``, manifest.json).

Pure functions over names and bytes; the runtime gathers the installed files and distributions.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable

_SEPARATORS = re.compile(r"[-_.]+")


def normalize_name(name: str) -> str:
    """A distribution name normalised as PEP 503 says: runs of ``-``, ``_``, ``.`` become ``-``, lowercase."""
    return _SEPARATORS.sub("-", name).lower()


def dependency_lock(distributions: Iterable[tuple[str, str]]) -> bytes:
    """The dependency lock text: one ``name==version`` line per installed distribution (name
    normalised, version as the distribution states it), sorted by byte order, joined by ``\\n``,
    with no newline after the last line."""
    return "\n".join(sorted(f"{normalize_name(name)}=={version}" for name, version in distributions)).encode("utf-8")


def dependency_lock_sha256(distributions: Iterable[tuple[str, str]]) -> str:
    return hashlib.sha256(dependency_lock(distributions)).hexdigest()


def code_sha256(files: Iterable[tuple[str, bytes]]) -> str:
    """SHA-256 over ``UTF-8(path) || 0x00 || SHA-256(content)`` for each file, in the order given
    (the runtime gives them sorted, each path as ``<package>/<relative posix path>``)."""
    digest = hashlib.sha256()
    for path, content in files:
        digest.update(path.encode("utf-8") + b"\0")
        digest.update(hashlib.sha256(content).digest())
    return digest.hexdigest()
