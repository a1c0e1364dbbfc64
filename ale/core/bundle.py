"""The submission bundle codec: ``age(zstd(tar))`` of exactly the allow-listed files.

A bundle is **canonical or refused**: exactly one age payload, exactly one zstd frame, and one
tar archive in exactly the layout :func:`build_tar` writes (docs/formats.md, "The bundle", states
it byte by byte), with nothing after any of them. So the verifier and the standard tools (``age``,
``zstd``, ``tar``, ``tar -i``) always see the same eight files.

Packing is deterministic for the same files and recipient key: the ustar archive of
:func:`build_tar` (GNU tar 1.34 writes the same bytes with the flags of docs/formats.md), zstd
level 19 with a checksum and the content size, then age (X25519) through pyrage; decryption is
:mod:`ale.core.age`'s (OpenSSL's ChaCha20-Poly1305, a 64 KiB chunk at a time). (age uses a
fresh file key each time, so the *ciphertext* differs run to run; the tar and the zstd frame do
not.)

Unpacking is the verifier's first half of the pipeline, each step raising :class:`BundleError`
with a stable :class:`~ale.core.reasons.Reason`: the age header's grammar and stanza limit
(:func:`parse_age_header`), decryption, the zstd frame's structure (:func:`zstd_frame_end`) and
bounded decompression, the tar's safety and then its canonical layout (:func:`inspect_tar`), and
the allow-list.
"""

from __future__ import annotations

import base64
import binascii
import io
import re
from collections.abc import Callable, Iterator, Mapping

import attrs
import pyrage
import zstandard

from ale.core import age
from ale.core.reasons import Reason, VerificationError

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
MAX_AGE_HEADER = 64 * 1024
_ZSTD_LEVEL = 19
MiB = 1024 * 1024


@attrs.frozen
class Limits:
    """The verifier's limits (docs/formats.md, "Limits"); sizes in bytes (MiB = 1,048,576)."""

    max_ciphertext: int = 20 * MiB
    max_decompressed: int = 64 * MiB
    max_files: int = 16
    max_file_bytes: int = 48 * MiB
    max_stanzas: int = 8  # X25519 recipient stanzas; other stanza types are not counted


class BundleError(VerificationError):
    """A bundle refused at one of the container steps (age, zstd, tar, allow-list)."""


# -- age --------------------------------------------------------------------------------------


@attrs.frozen
class Stanza:
    args: tuple[str, ...]  # args[0] is the stanza's type, e.g. "X25519"
    body: bytes


@attrs.frozen
class AgeHeader:
    stanzas: tuple[Stanza, ...]
    mac: bytes  # 32 bytes (HMAC-SHA256 over the header; pyrage checks it)
    payload_offset: int  # where the payload (nonce and STREAM chunks) begins

    @property
    def x25519(self) -> int:
        return sum(1 for s in self.stanzas if s.args[0] == "X25519")


_ARG = re.compile(rb"[\x21-\x7e]+")
_B64_LINE = 64
_MAC_B64 = 43  # the MAC line's base64: 32 bytes, unpadded


def _b64_canonical(text: bytes, what: str) -> bytes:
    """Decode unpadded canonical base64 (RFC 4648 standard alphabet), as age writes it."""
    try:
        raw = base64.b64decode(text + b"=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise BundleError(Reason.BAD_AGE_HEADER, f"the age header's {what} is not base64") from None
    if base64.b64encode(raw).rstrip(b"=") != text:
        raise BundleError(Reason.BAD_AGE_HEADER, f"the age header's {what} is not canonical unpadded base64")
    return raw


def _line(data: bytes, pos: int) -> tuple[bytes, int]:
    end = data.find(b"\n", pos, MAX_AGE_HEADER)
    if end < 0:
        raise BundleError(Reason.BAD_AGE_HEADER, f"the age header is cut short or longer than {MAX_AGE_HEADER} bytes")
    return data[pos:end], end + 1


def _stanza(data: bytes, pos: int, first: bytes) -> tuple[Stanza, int]:
    args = first[3:].split(b" ")
    if not all(_ARG.fullmatch(a) for a in args):
        raise BundleError(Reason.BAD_AGE_HEADER, "an age stanza's arguments are not printable ASCII words")
    body = b""
    while True:
        line, pos = _line(data, pos)
        if len(line) > _B64_LINE:
            raise BundleError(Reason.BAD_AGE_HEADER, "an age stanza body line is longer than 64 columns")
        body += line
        if len(line) < _B64_LINE:
            break
    return Stanza(tuple(a.decode("ascii") for a in args), _b64_canonical(body, "stanza body")), pos


def parse_age_header(data: bytes) -> AgeHeader:
    """The age v1 header (age-encryption.org/v1): the version line, stanzas, the MAC line.

    Each stanza is ``-> `` and space-separated printable-ASCII arguments, then its body in
    canonical unpadded base64, 64 columns a line, ended by a shorter (possibly empty) line; the
    MAC line is ``--- `` and 43 base64 characters. The whole header is at most 64 KiB."""
    if not data.startswith(AGE_MAGIC):
        raise BundleError(Reason.NOT_AGE, "not an age-encrypted file (no age-encryption.org/v1 header)")
    pos, stanzas = len(AGE_MAGIC), []
    while True:
        line, pos = _line(data, pos)
        if line.startswith(b"-> "):
            stanza, pos = _stanza(data, pos, line)
            stanzas.append(stanza)
        elif line.startswith(b"--- "):
            mac = _b64_canonical(line[4:], "MAC")
            if len(mac) != 32:
                raise BundleError(Reason.BAD_AGE_HEADER, "the age header's MAC is not 32 bytes")
            return AgeHeader(tuple(stanzas), mac, pos)
        else:
            raise BundleError(Reason.BAD_AGE_HEADER, "an age header line is neither a stanza nor the MAC line")


def check_age_header(ciphertext: bytes, limits: Limits) -> AgeHeader:
    """Refuse what is not an age v1 file, or has no or too many X25519 recipient stanzas.

    Only X25519 stanzas count against ``max_stanzas``: they are what the site tries its key
    on. Other stanzas (the random "grease" stanza rage and pyrage add, which every age
    implementation skips) are not counted, so the same 8 recipients pass from any encoder."""
    header = parse_age_header(ciphertext)
    for s in header.stanzas:
        if s.args[0] == "X25519" and (len(s.args) != 2 or len(s.body) != 32):
            raise BundleError(Reason.BAD_AGE_HEADER, "an X25519 stanza is not a share and a 32-byte body")
    if header.x25519 == 0:
        raise BundleError(Reason.BAD_AGE_HEADER, "the age header has no X25519 recipient stanza")
    if header.x25519 > limits.max_stanzas:
        raise BundleError(
            Reason.TOO_MANY_STANZAS, f"{header.x25519} X25519 recipient stanzas; at most {limits.max_stanzas}"
        )
    return header


def decrypt(ciphertext: bytes, identity: str, limits: Limits) -> bytes:
    """The age payload. age's STREAM marks its last chunk, so bytes after it (a second age
    payload included) fail decryption like any other change."""
    return b"".join(decrypt_chunks(ciphertext, identity, limits))


def decrypt_chunks(ciphertext: bytes, identity: str, limits: Limits) -> Iterator[bytes]:
    """:func:`decrypt`'s payload a 64 KiB chunk at a time, each authenticated before it is
    yielded: work on the chunks (decompression) may start before the last one, and must be
    dropped if this raises. The size, the header and the file key are checked before the first."""
    if len(ciphertext) > limits.max_ciphertext:
        raise BundleError(Reason.TOO_LARGE, f"{len(ciphertext)} bytes; the limit is {limits.max_ciphertext}")
    header = check_age_header(ciphertext, limits)
    try:
        key = age.Identity.from_str(identity)
    except ValueError:
        raise ValueError("the site identity is not an age X25519 identity") from None  # our bug, not theirs
    mac_end = header.payload_offset - len(b" \n") - _MAC_B64  # the MAC covers the header up to "---"
    try:
        file_key = age.file_key(
            [(s.args, s.body) for s in header.stanzas], header.mac, memoryview(ciphertext)[:mac_end], key
        )
        yield from age.payload_chunks(ciphertext, header.payload_offset, file_key)
    except age.AgeError as exc:
        raise BundleError(Reason.DECRYPT_FAILED, f"cannot decrypt with the site key: {exc}") from None


# -- zstd -------------------------------------------------------------------------------------

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_FCS_BYTES = (0, 2, 4, 8)  # by Frame_Content_Size_flag (flag 0 with Single_Segment: 1 byte)


def _need(data: bytes, end: int, what: str) -> None:
    if end > len(data):
        raise BundleError(Reason.TRUNCATED_ZSTD, f"the zstd frame is cut short in its {what}")


def _frame_header_end(data: bytes) -> tuple[int, bool]:
    """Where the frame header ends, and whether a 4-byte checksum follows the last block."""
    if len(data) < 4:
        if data and ZSTD_MAGIC.startswith(data):
            raise BundleError(Reason.TRUNCATED_ZSTD, "the zstd frame is cut short in its magic number")
        raise BundleError(Reason.BAD_ZSTD, "not a zstd frame (no zstd magic number)")
    if data[:4] != ZSTD_MAGIC:
        raise BundleError(Reason.BAD_ZSTD, "not a zstd frame (no zstd magic number; skippable frames are refused)")
    _need(data, 5, "header")
    fhd = data[4]
    single_segment, checksum, dict_flag, fcs_flag = fhd & 0x20, bool(fhd & 0x04), fhd & 0x03, fhd >> 6
    if fhd & 0x08:
        raise BundleError(Reason.BAD_ZSTD, "the zstd frame header sets a reserved bit")
    if dict_flag:
        raise BundleError(Reason.BAD_ZSTD, "the zstd frame needs a dictionary")
    fcs = _FCS_BYTES[fcs_flag] or (1 if single_segment else 0)
    end = 5 + (0 if single_segment else 1) + fcs
    _need(data, end, "header")
    return end, checksum


def zstd_frame_end(data: bytes) -> int:
    """The length of the zstd frame at the start of ``data`` (RFC 8878, section 3.1.1), found
    from its block headers without decompressing: so a cut frame and bytes after it are told
    apart from corrupt content, and what follows the frame is never read as more of it."""
    pos, checksum = _frame_header_end(data)
    n = len(data)
    while True:  # one 3-byte little-endian header a block: last (1 bit), type (2 bits), size (21 bits)
        if pos + 3 > n:
            _need(data, pos + 3, "block headers")
        b0 = data[pos]
        kind = (b0 >> 1) & 3
        if kind == 3:
            raise BundleError(Reason.BAD_ZSTD, "a zstd block has the reserved block type")
        # an RLE block (type 1) holds one byte, repeated size times
        pos += 4 if kind == 1 else 3 + ((b0 >> 3) | (data[pos + 1] << 5) | (data[pos + 2] << 13))
        if b0 & 1:
            break
    _need(data, pos, "blocks")
    if checksum:
        pos += 4
        _need(data, pos, "checksum")
    return pos


def check_single_frame(data: bytes) -> None:
    """Exactly one zstd frame and nothing after it."""
    end = zstd_frame_end(data)
    if end != len(data):
        raise BundleError(
            Reason.ZSTD_TRAILING_DATA, f"{len(data) - end} bytes after the zstd frame (one frame and nothing else)"
        )


def compress(data: bytes) -> bytes:
    return zstandard.ZstdCompressor(level=_ZSTD_LEVEL, write_checksum=True, write_content_size=True).compress(data)


def decompress(
    data: bytes, limits: Limits, on_block: Callable[[bytes], None] | None = None, *, keep: bool = True
) -> bytes:
    """Decompress exactly one zstd frame to at most ``max_decompressed`` bytes.

    A cut frame (``truncated_zstd``), bytes after the frame (``zstd_trailing_data``), a corrupt
    one (``bad_zstd``) and a bomb (``decompressed_too_large``) are refused. ``on_block`` sees each
    decompressed block as it comes (within the limit), so work on the stream can start before its
    end: the caller must drop that work if this raises. With ``keep=False`` the blocks are only
    handed on, and the result is empty."""
    check_single_frame(data)
    out = io.BytesIO()
    size = 0
    try:
        with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data), read_across_frames=False) as reader:
            while chunk := reader.read(MiB):
                size += len(chunk)
                if size > limits.max_decompressed:
                    raise BundleError(
                        Reason.DECOMPRESSED_TOO_LARGE,
                        f"decompresses beyond the limit of {limits.max_decompressed} bytes",
                    )
                if keep:
                    out.write(chunk)
                if on_block is not None:
                    on_block(chunk)
    except zstandard.ZstdError as exc:
        raise BundleError(Reason.BAD_ZSTD, f"not a valid zstd frame: {exc}") from None
    return out.getvalue()


def decompress_into(
    data: bytes, limits: Limits, into: memoryview, on_block: Callable[[int, int], None] | None = None
) -> int:
    """:func:`decompress`, the stream written into ``into`` (``limits.max_decompressed`` bytes at
    least) from its start, a block at a time: no block is allocated, nor copied again (into a
    file's mapping, say). ``on_block(offset, length)`` after each block; the decompressed size.
    The same frames are refused for the same reasons; a bomb is found by trying to read one byte
    past the limit, so ``on_block`` may see the stream up to the limit before this raises."""
    check_single_frame(data)
    limit = limits.max_decompressed
    if len(into) < limit:
        raise ValueError(f"a buffer of {len(into)} bytes cannot hold the {limit} the limit allows")
    size = 0
    try:
        with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data), read_across_frames=False) as reader:
            while size < limit:
                length = reader.readinto(into[size : min(limit, size + MiB)])
                if not length:
                    return size
                if on_block is not None:
                    on_block(size, length)
                size += length
            if reader.read(1):
                raise BundleError(Reason.DECOMPRESSED_TOO_LARGE, f"decompresses beyond the limit of {limit} bytes")
    except zstandard.ZstdError as exc:
        raise BundleError(Reason.BAD_ZSTD, f"not a valid zstd frame: {exc}") from None
    return size


# -- tar: the canonical layout ----------------------------------------------------------------

BLOCK = 512
RECORD = 20 * BLOCK  # GNU tar's default blocking factor; the archive is padded to whole records
_ZERO = bytes(BLOCK)
_MAX_NAME = 100
#: (offset, length) of the ustar header fields (POSIX.1-1988 ustar, IEEE Std 1003.1)
FIELDS = {
    "name": (0, 100), "mode": (100, 8), "uid": (108, 8), "gid": (116, 8), "size": (124, 12),
    "mtime": (136, 12), "chksum": (148, 8), "typeflag": (156, 1), "linkname": (157, 100),
    "magic": (257, 6), "version": (263, 2), "uname": (265, 32), "gname": (297, 32),
    "devmajor": (329, 8), "devminor": (337, 8), "prefix": (345, 155), "pad": (500, 12),
}  # fmt: skip
#: The fixed fields of every member's header, exactly as written.
CANONICAL_FIELDS = {
    "mode": b"0000644\0", "uid": b"0000000\0", "gid": b"0000000\0", "mtime": b"00000000000\0",
    "typeflag": b"0", "linkname": bytes(100), "magic": b"ustar\0", "version": b"00",
    "uname": bytes(32), "gname": bytes(32), "devmajor": b"0000000\0", "devminor": b"0000000\0",
    "prefix": bytes(155), "pad": bytes(12),
}  # fmt: skip


def _field(header: bytes, name: str) -> bytes:
    offset, length = FIELDS[name]
    return header[offset : offset + length]


def _header(name: bytes, size: int) -> bytes:
    header = bytearray(BLOCK)
    for field, value in CANONICAL_FIELDS.items():
        offset, _ = FIELDS[field]
        header[offset : offset + len(value)] = value
    header[0 : len(name)] = name
    header[124:136] = b"%011o\0" % size
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header)
    return bytes(header)


def _padded(size: int, unit: int) -> int:
    return -(-size // unit) * unit


def build_tar(files: Mapping[str, bytes]) -> bytes:
    """The canonical ustar archive of ``files`` (flat names of at most 100 UTF-8 bytes).

    Members in ascending byte order of their names, each a 512-byte header (:data:`FIELDS`,
    :data:`CANONICAL_FIELDS`, the size as 11 octal digits and a NUL, the checksum as 6 octal
    digits, a NUL and a space) and its data padded with zeros to a multiple of 512 bytes; then
    two zero blocks, and zeros up to a multiple of 10240 bytes."""
    out = bytearray()
    for name in sorted(files, key=lambda n: n.encode()):
        raw = name.encode()
        if "/" in name or name in ("", ".", "..") or "\x00" in name or len(raw) > _MAX_NAME:
            raise ValueError(f"bundle member names are flat file names of at most 100 bytes, not {name!r}")
        data = files[name]
        out += _header(raw, len(data)) + data + bytes(_padded(len(data), BLOCK) - len(data))
    out += bytes(2 * BLOCK)
    return bytes(out + bytes(_padded(len(out), RECORD) - len(out)))


@attrs.frozen
class _Member:
    name: str
    header: bytes
    offset: int  # of the header
    size: int


_OCTAL = re.compile(rb" *([0-7]+)[ \x00]*")
_TYPES = {
    b"1": (Reason.HARDLINK, "is a hard link"),
    b"2": (Reason.SYMLINK, "is a symbolic link"),
    b"3": (Reason.DEVICE, "is a character device"),
    b"4": (Reason.DEVICE, "is a block device"),
    b"5": (Reason.DIRECTORY, "is a directory"),
    b"6": (Reason.DEVICE, "is a FIFO"),
    b"x": (Reason.TAR_NOT_CANONICAL, "is a pax extended header (the layout is plain ustar)"),
    b"g": (Reason.TAR_NOT_CANONICAL, "is a pax global header (the layout is plain ustar)"),
    b"L": (Reason.TAR_NOT_CANONICAL, "is a GNU long-name header (the layout is plain ustar)"),
    b"K": (Reason.TAR_NOT_CANONICAL, "is a GNU long-link header (the layout is plain ustar)"),
}
_REGULAR = (b"0", b"\0", b"7")  # what tar extracts as a regular file ('\0' and '7' are refused later)


def _octal(raw: bytes) -> int | None:
    m = _OCTAL.fullmatch(raw)
    return int(m.group(1), 8) if m else None


def _name(header: bytes) -> str:
    """The member's name as tar reads it: prefix/name when the header is ustar."""
    name = _field(header, "name").split(b"\0", 1)[0]
    prefix = _field(header, "prefix").split(b"\0", 1)[0]
    if _field(header, "magic") == b"ustar\0" and prefix:
        name = prefix + b"/" + name
    try:
        return name.decode("utf-8")
    except UnicodeDecodeError:
        raise BundleError(Reason.BAD_MEMBER, f"member name {name[:120]!r} is not UTF-8") from None


def _check_header(header: bytes, limits: Limits) -> tuple[str, int]:
    """Step one for a member: a valid header of a safe, flat, regular file. Returns name and size."""
    stored = _octal(_field(header, "chksum"))
    unsigned = sum(header[:148]) + 8 * 32 + sum(header[156:])
    if stored is None or stored != unsigned:
        raise BundleError(Reason.BAD_TAR, "not a valid tar archive: a header's checksum is wrong")
    name = _name(header)
    shown = repr(name[:120])
    if name.startswith("/") or re.match(r"^[A-Za-z]:", name):
        raise BundleError(Reason.ABSOLUTE_PATH, f"absolute path {shown}")
    if ".." in name.split("/") or "\\" in name:
        raise BundleError(Reason.PATH_TRAVERSAL, f"path traversal in {shown}")
    typeflag = _field(header, "typeflag")
    if typeflag not in _REGULAR:
        reason, what = _TYPES.get(typeflag, (Reason.BAD_MEMBER, f"is not a regular file (type {typeflag!r})"))
        raise BundleError(reason, f"{shown} {what}")
    if "/" in name or "\x00" in name or not name:
        raise BundleError(Reason.BAD_MEMBER, f"{shown} is not a flat file name")
    mode = _octal(_field(header, "mode"))
    if mode is not None and mode & 0o7000:
        raise BundleError(Reason.UNSAFE_MODE, f"{shown} has mode {mode:o}: setuid, setgid or sticky bits")
    size_field = _field(header, "size")
    if not re.fullmatch(rb"[0-7]{11}\x00", size_field):
        raise BundleError(Reason.BAD_TAR, f"{shown}: the size field is not 11 octal digits and a NUL")
    size = int(size_field[:11], 8)
    if size > limits.max_file_bytes:
        raise BundleError(Reason.FILE_TOO_LARGE, f"{shown} is {size} bytes; at most {limits.max_file_bytes}")
    return name, size


def _walk(data: bytes, limits: Limits) -> tuple[list[_Member], int]:
    """Every member's header up to the first zero block (where tar stops); and that offset."""
    members: list[_Member] = []
    seen: set[str] = set()
    pos = 0
    while True:
        if pos + BLOCK > len(data):
            what = "has no end-of-archive blocks" if pos == len(data) else "is cut short in a header"
            raise BundleError(Reason.BAD_TAR, f"not a valid tar archive: it {what}")
        header = data[pos : pos + BLOCK]
        if header == _ZERO:
            return members, pos
        if len(members) == limits.max_files:
            raise BundleError(Reason.TOO_MANY_FILES, f"more than {limits.max_files} members")
        name, size = _check_header(header, limits)
        if name in seen:
            raise BundleError(Reason.DUPLICATE_MEMBER, f"{name!r} appears twice")
        if pos + BLOCK + size > len(data):
            raise BundleError(Reason.BAD_TAR, f"not a valid tar archive: {name!r} is cut short")
        seen.add(name)
        members.append(_Member(name, header, pos, size))
        pos += BLOCK + _padded(size, BLOCK)


def _check_member_layout(data: bytes, m: _Member) -> None:
    """One member's header and padding are exactly build_tar's."""
    for field, value in CANONICAL_FIELDS.items():
        if _field(m.header, field) != value:
            raise BundleError(Reason.TAR_NOT_CANONICAL, f"{m.name!r}: the {field} field is not {value!r}")
    if _field(m.header, "name") != m.name.encode().ljust(_MAX_NAME, b"\0"):
        raise BundleError(Reason.TAR_NOT_CANONICAL, f"{m.name!r}: the name field is not the name and NULs")
    if _field(m.header, "chksum")[6:] != b"\0 ":
        raise BundleError(Reason.TAR_NOT_CANONICAL, f"{m.name!r}: the checksum is not 6 digits, a NUL, a space")
    if m.header != _header(m.name.encode(), m.size):  # pragma: no cover - the checks above, as a whole
        raise BundleError(Reason.TAR_NOT_CANONICAL, f"{m.name!r}: the header is not the canonical header")
    start = m.offset + BLOCK + m.size
    if data.count(0, start, m.offset + BLOCK + _padded(m.size, BLOCK)) != -m.size % BLOCK:
        raise BundleError(Reason.TAR_NOT_CANONICAL, f"{m.name!r}: the padding after its data is not zeros")


def _check_layout(data: bytes, members: list[_Member], end: int) -> None:
    """Step two: the exact layout of build_tar, and nothing after the end-of-archive blocks."""
    previous = b""
    for m in members:
        _check_member_layout(data, m)
        if m.name.encode() <= previous:
            raise BundleError(Reason.TAR_NOT_CANONICAL, f"{m.name!r}: members are not in ascending byte order")
        previous = m.name.encode()
    if data.count(0, end) != len(data) - end:
        raise BundleError(
            Reason.TAR_TRAILING_DATA,
            "bytes after the end-of-archive block (another archive, or anything else): tar -i would read them",
        )
    if len(data) != _padded(end + 2 * BLOCK, RECORD):
        raise BundleError(
            Reason.TAR_NOT_CANONICAL, f"the archive ends at {len(data)} bytes, not after two zero blocks padded "
            f"to a multiple of {RECORD} ({_padded(end + 2 * BLOCK, RECORD)})"
        )  # fmt: skip


def inspect_tar(data: bytes, limits: Limits) -> dict[str, bytes]:
    """Read the archive in memory (nothing is extracted to disk) and return its files.

    First each member's safety (a valid header; a flat, relative name; a regular file; no
    setuid, setgid or sticky bit; within the size limits; no name twice), then the canonical
    layout (:func:`build_tar`'s exact bytes, nothing after the end). The archive must be exactly
    ``build_tar`` of its files, so the same bytes can only mean the same files to any reader."""
    members, end = _walk(data, limits)
    if not members:
        raise BundleError(Reason.BAD_TAR, "the archive is empty")
    _check_layout(data, members, end)  # every header is build_tar's, every padding byte zero: data is build_tar(files)
    return {m.name: data[m.offset + BLOCK : m.offset + BLOCK + m.size] for m in members}


# -- the whole container ----------------------------------------------------------------------


def check_allowlist(files: Mapping[str, bytes]) -> None:
    extra = sorted(set(files) - set(ALLOWED_FILES))
    missing = sorted(set(ALLOWED_FILES) - set(files))
    if extra:
        raise BundleError(Reason.UNEXPECTED_FILE, f"files outside the allow-list: {', '.join(extra)}")
    if missing:
        raise BundleError(Reason.MISSING_FILE, f"missing files: {', '.join(missing)}")


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


def unpack(ciphertext: bytes, identity: str, limits: Limits | None = None) -> dict[str, bytes]:
    """Decrypt, decompress and inspect a bundle; return its eight files or raise BundleError."""
    limits = limits or Limits()
    files = inspect_tar(decompress(decrypt(ciphertext, identity, limits), limits), limits)
    check_allowlist(files)
    return files
