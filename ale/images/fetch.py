"""Downloads pinned by SHA-256, kept in a content-addressed cache.

``cache/sha256/<hex>`` holds a file whose SHA-256 is ``<hex>``; it is checked again on every
use, so a damaged cache is noticed, never built from. A file not in the cache is fetched from
each of its URLs in turn (a Debian mirror, then snapshot.debian.org; PyPI) into a temporary
file beside its final place, checked, then renamed: two builds sharing a cache never see half a
file. Offline (``--offline``, and always inside a Nix build, whose fetchers fill the cache) a
missing file is an error naming it.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

TIMEOUT_S = 120
MAX_BYTES = 2 * 1024**3
_CHUNK = 1024 * 1024


class FetchError(RuntimeError):
    """A pinned file could not be had (not cached offline, unreachable, or a different hash)."""


def default_cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "ale" / "images"


def _hash_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def cached(cache: Path, sha256: str) -> Path | None:
    """The cached file with this SHA-256, if present and intact (a damaged one is removed)."""
    path = cache / "sha256" / sha256
    if not path.is_file():
        return None
    if _hash_file(path) != sha256:
        path.unlink(missing_ok=True)
        return None
    return path


def _download(url: str, sha256: str, folder: Path) -> Path:
    fd, tmp_name = tempfile.mkstemp(prefix=".part-", dir=folder)
    tmp = Path(tmp_name)
    h, size = hashlib.sha256(), 0
    try:
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:
            while chunk := response.read(_CHUNK):
                size += len(chunk)
                if size > MAX_BYTES:
                    raise FetchError(f"{url}: larger than {MAX_BYTES} bytes")
                h.update(chunk)
                out.write(chunk)
        if h.hexdigest() != sha256:
            raise FetchError(f"{url}: SHA-256 {h.hexdigest()}, but the definition pins {sha256}")
        final = folder / sha256
        os.replace(tmp, final)
        return final
    finally:
        tmp.unlink(missing_ok=True)


def fetch(urls: Sequence[str], sha256: str, cache: Path, *, offline: bool, what: str) -> Path:
    """The file pinned by ``sha256``: from the cache, else from the first URL that serves it."""
    if (hit := cached(cache, sha256)) is not None:
        return hit
    if offline:
        raise FetchError(f"{what} (sha256 {sha256}) is not in the cache {cache} and the build is offline")
    folder = cache / "sha256"
    folder.mkdir(parents=True, exist_ok=True)
    failures = []
    for url in urls:
        try:
            return _download(url, sha256, folder)
        except (OSError, urllib.error.URLError, FetchError) as exc:
            failures.append(f"{url}: {exc}")
    raise FetchError(f"{what}: no source served it: " + "; ".join(failures))
