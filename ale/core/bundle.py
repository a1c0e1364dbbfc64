"""The submission bundle codec: ``age(zstd(tar))`` of exactly the allow-listed files.

Packing is deterministic for the same files and recipient key: a ustar archive with names in
ascending byte order, mtime 0, uid and gid 0, empty user and group names, mode 0644, regular
files only; zstd level 19 with a checksum and the content size; then age (X25519) through
pyrage. (age itself uses a fresh file key each time, so the *ciphertext* differs run to run;
the plaintext tar and zstd frame do not.) The reference ``age``, ``zstd`` and ``tar`` CLIs
open a bundle.

Unpacking is the verifier's first half of the pipeline, each step its own error with a stable
reason code: age header limits, decryption, bounded decompression, safe tar inspection
(traversal, absolute paths, links, devices, FIFOs, directories, duplicates), and the
allow-list (no extra, no missing files).
"""

from __future__ import annotations

import io
import re
import tarfile
from collections.abc import Callable, Mapping

import attrs
import pyrage
import zstandard

ALLOWED_FILES = (
    "artifacts_manifest.json",
    "events.jsonl.zst",
    "faithfulness.json",
    "integrity.json",
    "manifest.json",
    "network_summary.json",
    "score_breakdown.json",
    "task_results.json",
)
BUNDLE_SUFFIX = ".ale"
AGE_MAGIC = b"age-encryption.org/v1\n"
_ZSTD_LEVEL = 19


@attrs.frozen
class Limits:
    max_ciphertext: int = 20 * 1024 * 1024
    max_decompressed: int = 64 * 1024 * 1024
    max_files: int = 16
    max_file_bytes: int = 48 * 1024 * 1024
    max_stanzas: int = 8


class BundleError(ValueError):
    """A bundle refused at one step; ``reason`` is a stable code stored and returned by the verifier."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def build_tar(files: Mapping[str, bytes]) -> bytes:
    """The deterministic ustar archive of ``files`` (flat names only)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name in sorted(files, key=lambda n: n.encode()):
            if "/" in name or name in ("", ".", "..") or "\x00" in name:
                raise ValueError(f"bundle member names are flat file names, not {name!r}")
            data = files[name]
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.type = tarfile.REGTYPE
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def compress(data: bytes) -> bytes:
    return zstandard.ZstdCompressor(level=_ZSTD_LEVEL, write_checksum=True, write_content_size=True).compress(data)


def pack(files: Mapping[str, bytes], recipients: list[str]) -> bytes:
    """Encrypt ``age(zstd(tar(files)))`` to the age X25519 recipients (``age1...`` strings)."""
    if set(files) != set(ALLOWED_FILES):
        raise ValueError(f"a bundle holds exactly {', '.join(ALLOWED_FILES)}")
    try:
        keys = [pyrage.x25519.Recipient.from_str(r) for r in recipients]
    except pyrage.RecipientError as exc:
        raise ValueError(f"not an age X25519 recipient: {exc}") from None
    if not keys:
        raise ValueError("at least one recipient is needed")
    return bytes(pyrage.encrypt(compress(build_tar(files)), keys))


# -- unpacking (the verifier's order) -----------------------------------------------------------

_STANZA = re.compile(rb"^-> ")


def check_age_header(ciphertext: bytes, limits: Limits) -> None:
    """Refuse what is not an age v1 file, or has more recipient stanzas than allowed."""
    if not ciphertext.startswith(AGE_MAGIC):
        raise BundleError("not_age", "not an age-encrypted file (no age-encryption.org/v1 header)")
    end = ciphertext.find(b"\n---", 0, 64 * 1024)
    if end < 0:
        raise BundleError("bad_age_header", "the age header is missing its MAC line or is too long")
    stanzas = sum(1 for line in ciphertext[:end].split(b"\n") if _STANZA.match(line))
    if stanzas == 0:
        raise BundleError("bad_age_header", "the age header has no recipient stanza")
    if stanzas > limits.max_stanzas:
        raise BundleError("too_many_stanzas", f"{stanzas} recipient stanzas; at most {limits.max_stanzas}")


def decrypt(ciphertext: bytes, identity: str, limits: Limits) -> bytes:
    if len(ciphertext) > limits.max_ciphertext:
        raise BundleError("too_large", f"{len(ciphertext)} bytes; the limit is {limits.max_ciphertext}")
    check_age_header(ciphertext, limits)
    try:
        key = pyrage.x25519.Identity.from_str(identity)
    except pyrage.IdentityError:
        raise ValueError("the site identity is not an age X25519 identity") from None  # our bug, not theirs
    try:
        return bytes(pyrage.decrypt(ciphertext, [key]))
    except pyrage.DecryptError as exc:
        raise BundleError("decrypt_failed", f"cannot decrypt with the site key: {exc}") from None


def decompress(
    data: bytes, limits: Limits, on_block: Callable[[bytes], None] | None = None, *, keep: bool = True
) -> bytes:
    """zstd-decompress at most ``max_decompressed`` bytes; a bomb or corrupt frame is refused.

    ``on_block`` sees each decompressed block as it comes (within the limit), so work on the
    stream can start before its end: the caller must drop that work if this raises. With
    ``keep=False`` the blocks are only handed on, and the result is empty."""
    dctx = zstandard.ZstdDecompressor()
    out = io.BytesIO()
    size = 0
    try:
        with dctx.stream_reader(io.BytesIO(data), read_across_frames=False) as reader:
            while True:
                chunk = reader.read(1 << 20)
                if not chunk:
                    break
                size += len(chunk)
                if size > limits.max_decompressed:
                    raise BundleError(
                        "decompressed_too_large", f"decompresses beyond the limit of {limits.max_decompressed} bytes"
                    )
                if keep:
                    out.write(chunk)
                if on_block is not None:
                    on_block(chunk)
    except zstandard.ZstdError as exc:
        raise BundleError("bad_zstd", f"not a valid zstd frame: {exc}") from None
    return out.getvalue()


def inspect_tar(data: bytes, limits: Limits) -> dict[str, bytes]:
    """Read a tar without extracting anything to disk; refuse anything but flat regular files."""
    files: dict[str, bytes] = {}
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
            for count, member in enumerate(tar, start=1):
                if count > limits.max_files:
                    raise BundleError("too_many_files", f"more than {limits.max_files} members")
                _check_member(member, limits)
                if member.name in files:
                    raise BundleError("duplicate_member", f"{member.name!r} appears twice")
                fh = tar.extractfile(member)
                if fh is None:  # pragma: no cover - regular files always have data
                    raise BundleError("bad_member", f"{member.name!r} has no data")
                files[member.name] = fh.read()
    except tarfile.TarError as exc:
        raise BundleError("bad_tar", f"not a valid tar archive: {exc}") from None
    if not files:
        raise BundleError("bad_tar", "the archive is empty")
    return files


def _check_member(member: tarfile.TarInfo, limits: Limits) -> None:
    name = member.name
    if name.startswith("/") or re.match(r"^[A-Za-z]:", name):
        raise BundleError("absolute_path", f"absolute path {name!r}")
    if ".." in name.split("/") or "\\" in name:
        raise BundleError("path_traversal", f"path traversal in {name!r}")
    if member.issym():
        raise BundleError("symlink", f"{name!r} is a symbolic link")
    if member.islnk():
        raise BundleError("hardlink", f"{name!r} is a hard link")
    if member.isdev():
        raise BundleError("device", f"{name!r} is a device or FIFO")
    if member.isdir():
        raise BundleError("directory", f"{name!r} is a directory")
    if not member.isreg():
        raise BundleError("bad_member", f"{name!r} is not a regular file")
    if "/" in name or "\x00" in name or not name:
        raise BundleError("bad_member", f"{name!r} is not a flat file name")
    if member.size > limits.max_file_bytes:
        raise BundleError("file_too_large", f"{name!r} is {member.size} bytes; at most {limits.max_file_bytes}")


def check_allowlist(files: Mapping[str, bytes]) -> None:
    extra = sorted(set(files) - set(ALLOWED_FILES))
    missing = sorted(set(ALLOWED_FILES) - set(files))
    if extra:
        raise BundleError("unexpected_file", f"files outside the allow-list: {', '.join(extra)}")
    if missing:
        raise BundleError("missing_file", f"missing files: {', '.join(missing)}")


def unpack(ciphertext: bytes, identity: str, limits: Limits | None = None) -> dict[str, bytes]:
    """Decrypt, decompress and inspect a bundle; return its eight files or raise BundleError."""
    limits = limits or Limits()
    files = inspect_tar(decompress(decrypt(ciphertext, identity, limits), limits), limits)
    check_allowlist(files)
    return files
