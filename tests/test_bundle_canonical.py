"""A bundle is canonical or refused: one age payload, one zstd frame, one tar in exactly the
documented layout, nothing after any of them (docs/formats.md, "The bundle").

Each hostile container below differs from a canonical one in exactly the defect it is named for
(``verifier_helpers.tar_header`` writes every other field as documented); bundles made with the
reference ``age``, ``zstd`` and GNU ``tar`` CLIs are accepted when they follow the documented
recipe and refused, with the same reason, when they do not.
"""

from __future__ import annotations

import hashlib
import io
import shutil
import subprocess
import tarfile
from collections.abc import Callable
from pathlib import Path

import pyrage
import pytest
import verifier_helpers as h
import zstandard

from ale.core import bundle
from ale.core.bundle import ALLOWED_FILES, BundleError, Limits, build_tar, compress, inspect_tar, pack, unpack
from ale.core.reasons import Reason

IDENTITY = pyrage.x25519.Identity.generate()
SECRET_KEY, PUBLIC_KEY = str(IDENTITY), str(IDENTITY.to_public())
FILES = {name: f"content of {name}\n".encode() for name in ALLOWED_FILES}
NAMES = sorted(ALLOWED_FILES)
needs_tools = pytest.mark.skipif(
    not all(shutil.which(t) for t in ("age", "zstd", "tar")), reason="needs the age, zstd and GNU tar CLIs"
)


def _refused(data: bytes, reason: Reason, check: Callable[[bytes], object]) -> BundleError:
    with pytest.raises(BundleError) as err:
        check(data)
    assert err.value.reason is reason, f"{err.value.reason}: {err.value}"
    return err.value


def _tar(data: bytes) -> object:
    return inspect_tar(data, Limits())


def _entries(**override: dict[str, bytes]) -> bytes:
    """The eight members in canonical order; ``override[name]`` replaces header fields of one."""
    return b"".join(h.tar_entry(n, FILES[n], **override.get(n, {})) for n in NAMES)


# -- tar ------------------------------------------------------------------------------------------


def test_canonical_tar_is_accepted_and_is_exactly_build_tar() -> None:
    tar = h.tar_end(_entries())
    assert tar == build_tar(FILES)  # an independent writer of the documented layout gives the same bytes
    assert _tar(tar) == FILES


SETUID = {"setuid": b"0004644\0", "setgid": b"0002644\0", "sticky": b"0001644\0", "all-special": b"0007777\0"}


@pytest.mark.parametrize("bits", sorted(SETUID))
def test_tar_member_with_special_mode_bits_is_unsafe_mode(bits: str) -> None:
    tar = h.tar_end(_entries(**{"manifest.json": {"mode": SETUID[bits]}}))
    _refused(tar, Reason.UNSAFE_MODE, _tar)


NOT_CANONICAL_FIELDS = {
    "mode-executable": {"mode": b"0000755\0"},
    "mode-spaces": {"mode": b"   644 \0"},
    "mtime-nonzero": {"mtime": b"14777777777\0"},
    "uid-1000": {"uid": b"0001750\0"},
    "gid-1000": {"gid": b"0001750\0"},
    "uname-root": {"uname": b"root"},
    "gname-root": {"gname": b"root"},
    "gnu-magic": {"magic": b"ustar ", "version": b" \0"},
    "v7-no-magic": {"magic": b"", "version": b""},
    "devmajor-empty-python-tarfile": {"devmajor": b"", "devminor": b""},
    "linkname-set": {"linkname": b"elsewhere"},
    "typeflag-old-nul": {"typeflag": b"\0"},
    "typeflag-contiguous": {"typeflag": b"7"},
    "pad-bytes": {"pad": b"hidden"},
    "checksum-7-digits": {},  # set below: a correct checksum written as 7 digits and a NUL
}


def _checksum_7_digits(entry: bytes) -> bytes:
    header = entry[:148] + b" " * 8 + entry[156:512]
    return header[:148] + b"%07o\0" % sum(header) + header[156:] + entry[512:]


@pytest.mark.parametrize("defect", sorted(NOT_CANONICAL_FIELDS))
def test_tar_header_field_not_as_documented_is_tar_not_canonical(defect: str) -> None:
    if defect == "checksum-7-digits":
        entries = [h.tar_entry(n, FILES[n]) for n in NAMES]
        entries[0] = _checksum_7_digits(entries[0])
        tar = h.tar_end(b"".join(entries))
    else:
        tar = h.tar_end(_entries(**{"manifest.json": NOT_CANONICAL_FIELDS[defect]}))
    _refused(tar, Reason.TAR_NOT_CANONICAL, _tar)


def test_tar_name_field_with_bytes_after_its_nul_is_tar_not_canonical() -> None:
    entries = [h.tar_entry(n, FILES[n]) for n in NAMES]
    entries[0] = h.tar_entry(NAMES[0], FILES[NAMES[0]], name=NAMES[0].encode() + b"\0../../etc/passwd")
    _refused(h.tar_end(b"".join(entries)), Reason.TAR_NOT_CANONICAL, _tar)


def test_tar_members_out_of_byte_order_are_tar_not_canonical() -> None:
    entries = [h.tar_entry(n, FILES[n]) for n in NAMES]
    entries[2], entries[3] = entries[3], entries[2]
    _refused(h.tar_end(b"".join(entries)), Reason.TAR_NOT_CANONICAL, _tar)


def test_tar_data_padding_that_is_not_zeros_is_tar_not_canonical() -> None:
    entries = [h.tar_entry(n, FILES[n]) for n in NAMES]
    entries[1] = entries[1][:-1] + b"X"  # the last byte of the member's zero padding
    _refused(h.tar_end(b"".join(entries)), Reason.TAR_NOT_CANONICAL, _tar)


def test_pax_extended_header_is_tar_not_canonical() -> None:
    pax = h.tar_entry("PaxHeader", b"30 path=artifacts_manifest.json\n", typeflag=b"x")
    _refused(h.tar_end(pax + _entries()), Reason.TAR_NOT_CANONICAL, _tar)


def test_gnu_long_name_header_is_tar_not_canonical() -> None:
    longname = h.tar_entry("././@LongLink", b"a" * 150 + b"\0", typeflag=b"L")
    _refused(h.tar_end(longname + _entries()), Reason.TAR_NOT_CANONICAL, _tar)


def test_ustar_prefix_makes_a_nested_name_and_is_bad_member() -> None:
    tar = h.tar_end(h.tar_entry("manifest.json", b"{}", prefix=b"sub") + _entries())
    _refused(tar, Reason.BAD_MEMBER, _tar)


def test_member_name_that_is_not_utf8_is_bad_member() -> None:
    tar = h.tar_end(h.tar_header(b"\xff\xfe.json", 0) + _entries())
    _refused(tar, Reason.BAD_MEMBER, _tar)


def test_header_with_a_wrong_checksum_is_bad_tar() -> None:
    _refused(h.tar_end(_entries(**{"manifest.json": {"chksum": b"0000000\0"}})), Reason.BAD_TAR, _tar)


def test_size_field_that_is_not_eleven_octal_digits_is_bad_tar() -> None:
    _refused(h.tar_end(_entries(**{"manifest.json": {"size": b"        26 "}})), Reason.BAD_TAR, _tar)


def test_member_data_cut_short_is_bad_tar() -> None:
    _refused(_entries()[:-300], Reason.BAD_TAR, _tar)


def test_archive_without_end_of_archive_blocks_is_bad_tar() -> None:
    _refused(_entries(), Reason.BAD_TAR, _tar)


def test_second_archive_after_the_end_is_tar_trailing_data() -> None:
    second = build_tar({"manifest.json": b'{"forged": true}\n'})
    _refused(build_tar(FILES) + second, Reason.TAR_TRAILING_DATA, _tar)


def test_member_hidden_in_the_record_padding_is_tar_trailing_data() -> None:
    """A header between the end-of-archive blocks and the end of the record: tar -i reads it."""
    body = _entries()
    hidden = h.tar_entry("manifest.json", b'{"forged": true}\n')
    tar = body + bytes(1024) + hidden
    tar += bytes(-len(tar) % 10240)
    _refused(tar, Reason.TAR_TRAILING_DATA, _tar)


def test_one_zero_block_then_a_member_is_tar_trailing_data() -> None:
    tar = h.tar_end(_entries() + bytes(512) + h.tar_entry("zz.json", b"{}"))
    _refused(tar, Reason.TAR_TRAILING_DATA, _tar)


def test_extra_zero_records_after_the_archive_are_tar_not_canonical() -> None:
    _refused(build_tar(FILES) + bytes(10240), Reason.TAR_NOT_CANONICAL, _tar)


def test_archive_not_padded_to_a_whole_record_is_tar_not_canonical() -> None:
    _refused(_entries() + bytes(1024), Reason.TAR_NOT_CANONICAL, _tar)


def test_python_tarfile_ustar_archive_is_refused_for_its_empty_device_fields() -> None:
    """Python's own ustar writer leaves devmajor/devminor empty: not the documented layout."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name in NAMES:
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(FILES[name]), 0o644
            tar.addfile(info, io.BytesIO(FILES[name]))
    err = _refused(buf.getvalue(), Reason.TAR_NOT_CANONICAL, _tar)
    assert "devmajor" in str(err)


@pytest.mark.parametrize("fmt", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT], ids=["pax", "gnu"])
def test_python_tarfile_pax_and_gnu_archives_are_tar_not_canonical(fmt: int) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        for name in NAMES:
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(FILES[name]), 0o644
            tar.addfile(info, io.BytesIO(FILES[name]))
    _refused(buf.getvalue(), Reason.TAR_NOT_CANONICAL, _tar)


# -- zstd -----------------------------------------------------------------------------------------


def _zstd(data: bytes) -> object:
    return bundle.decompress(data, Limits())


TAR = build_tar(FILES)
FRAME = compress(TAR)


def test_one_zstd_frame_is_accepted() -> None:
    assert bundle.zstd_frame_end(FRAME) == len(FRAME)
    assert _zstd(FRAME) == TAR


@pytest.mark.parametrize("cut", [1, 3, 4, 5, 8, len(FRAME) // 2, len(FRAME) - 5, len(FRAME) - 1])
def test_truncated_zstd_frame_is_truncated_zstd_not_bad_tar(cut: int) -> None:
    _refused(FRAME[:cut], Reason.TRUNCATED_ZSTD, _zstd)


def test_truncated_zstd_frame_in_a_bundle_is_truncated_zstd_not_bad_tar() -> None:
    ciphertext = h.encrypt(FRAME[: len(FRAME) - 40], PUBLIC_KEY)
    _refused(ciphertext, Reason.TRUNCATED_ZSTD, lambda c: unpack(c, SECRET_KEY))


@pytest.mark.parametrize(
    "after",
    [compress(b"x" * 1024), FRAME, b"\x50\x2a\x4d\x18\x04\x00\x00\x00skip", b"\0", b"garbage"],
    ids=["second-frame", "same-frame-again", "skippable-frame", "one-zero-byte", "garbage"],
)
def test_bytes_after_the_zstd_frame_are_zstd_trailing_data(after: bytes) -> None:
    _refused(FRAME + after, Reason.ZSTD_TRAILING_DATA, _zstd)


def test_skippable_frame_before_the_zstd_frame_is_bad_zstd() -> None:
    _refused(b"\x50\x2a\x4d\x18\x04\x00\x00\x00skip" + FRAME, Reason.BAD_ZSTD, _zstd)


def test_zstd_frame_header_with_the_reserved_bit_is_bad_zstd() -> None:
    _refused(FRAME[:4] + bytes([FRAME[4] | 0x08]) + FRAME[5:], Reason.BAD_ZSTD, _zstd)


def test_zstd_frame_needing_a_dictionary_is_bad_zstd() -> None:
    with_dict = zstandard.ZstdCompressor(dict_data=zstandard.ZstdCompressionDict(b"x" * 64)).compress(TAR)
    if not with_dict[4] & 0x03:  # a raw-content dictionary has no id; forge the dictionary-id flag
        with_dict = with_dict[:4] + bytes([with_dict[4] | 0x01]) + with_dict[5:]
    _refused(with_dict, Reason.BAD_ZSTD, _zstd)


def test_zstd_content_that_fails_its_checksum_is_bad_zstd() -> None:
    flipped = FRAME[:-1] + bytes([FRAME[-1] ^ 0xFF])
    _refused(flipped, Reason.BAD_ZSTD, _zstd)


def test_zstd_reserved_block_type_is_bad_zstd() -> None:
    frame = bundle.ZSTD_MAGIC + bytes([0x00, 0x50]) + bytes([0b111, 0, 0])  # last block, type 3
    _refused(frame, Reason.BAD_ZSTD, _zstd)


def test_zstd_frame_declaring_a_small_size_but_a_window_past_the_decoders_limit_is_bad_zstd() -> None:
    """A frame that declares its content size (within every limit) and a 1 GiB window: zstd's
    one-shot decoder would take it, the bounded streaming decoder refuses the window; the verdict
    is the streaming decoder's (docs/decisions.md, "Bounded decompression stays in zstd's
    streaming mode")."""
    content = hashlib.sha256(b"window").digest() * 62_500  # 2 MB: more than one read of the decoder
    params = zstandard.ZstdCompressionParameters.from_level(3, window_log=10, write_content_size=False)
    plain = zstandard.ZstdCompressor(compression_params=params).compress(content)
    assert plain[4] == 0  # no content size, not single-segment, then the window descriptor
    # the header again, declaring a 4-byte content size and a window of 2**(10 + 20) bytes
    forged = plain[:4] + bytes([0x80, 20 << 3]) + len(content).to_bytes(4, "little") + plain[6:]
    assert zstandard.get_frame_parameters(forged).window_size == 1 << 30
    assert zstandard.ZstdDecompressor().decompress(forged) == content  # what the one-shot decoder makes of it
    err = _refused(forged, Reason.BAD_ZSTD, _zstd)
    assert "too much memory" in str(err)


def test_not_zstd_at_all_is_bad_zstd() -> None:
    _refused(TAR, Reason.BAD_ZSTD, _zstd)
    _refused(b"", Reason.BAD_ZSTD, _zstd)


# -- age ------------------------------------------------------------------------------------------


def _recipients(n: int) -> list[str]:
    return [PUBLIC_KEY] + [str(pyrage.x25519.Identity.generate().to_public()) for _ in range(n - 1)]


def _stanza_types(ciphertext: bytes) -> list[str]:
    return [s.args[0] for s in bundle.parse_age_header(ciphertext).stanzas]


def test_pyrage_bundle_to_8_recipients_is_accepted_despite_its_grease_stanza() -> None:
    ciphertext = pack(FILES, _recipients(8))
    types = _stanza_types(ciphertext)
    assert types.count("X25519") == 8
    assert len(types) >= 8  # pyrage adds a random "grease" stanza beside them; it is not counted
    assert unpack(ciphertext, SECRET_KEY) == FILES


def test_pyrage_bundle_to_9_recipients_is_too_many_stanzas() -> None:
    _refused(pack(FILES, _recipients(9)), Reason.TOO_MANY_STANZAS, lambda c: unpack(c, SECRET_KEY))


@pytest.mark.skipif(not shutil.which("age"), reason="needs the age CLI")
@pytest.mark.parametrize(("count", "accepted"), [(8, True), (9, False)])
def test_age_cli_bundle_counts_like_pyrage(tmp_path: Path, count: int, accepted: bool) -> None:
    (tmp_path / "plain").write_bytes(FRAME)
    args = [a for r in _recipients(count) for a in ("-r", r)]
    subprocess.run(["age", *args, "-o", "b.ale", "plain"], check=True, cwd=tmp_path, timeout=60)
    ciphertext = (tmp_path / "b.ale").read_bytes()
    assert _stanza_types(ciphertext).count("X25519") == count
    if accepted:
        assert unpack(ciphertext, SECRET_KEY) == FILES
    else:
        _refused(ciphertext, Reason.TOO_MANY_STANZAS, lambda c: unpack(c, SECRET_KEY))


@pytest.mark.skipif(not shutil.which("age"), reason="needs the age CLI")
def test_armored_age_file_is_not_age(tmp_path: Path) -> None:
    (tmp_path / "plain").write_bytes(FRAME)
    subprocess.run(["age", "-a", "-r", PUBLIC_KEY, "-o", "b.ale", "plain"], check=True, cwd=tmp_path, timeout=60)
    _refused((tmp_path / "b.ale").read_bytes(), Reason.NOT_AGE, lambda c: unpack(c, SECRET_KEY))


def test_second_age_payload_after_the_first_is_decrypt_failed() -> None:
    one = pack(FILES, [PUBLIC_KEY])
    _refused(one + pack(FILES, [PUBLIC_KEY]), Reason.DECRYPT_FAILED, lambda c: unpack(c, SECRET_KEY))


def _header_of(ciphertext: bytes) -> tuple[bytes, bytes]:
    end = ciphertext.index(b"\n---") + 1
    mac_end = ciphertext.index(b"\n", end) + 1
    return ciphertext[:mac_end], ciphertext[mac_end:]


def _age(data: bytes) -> object:
    return bundle.check_age_header(data, Limits())


GOOD = h.encrypt(FRAME, PUBLIC_KEY)
SHARE = b"-> X25519 " + b"A" * 43 + b"\n" + b"A" * 43 + b"\n"


@pytest.mark.parametrize(
    ("header", "reason"),
    [
        (b"", Reason.NOT_AGE),
        (b"age-encryption.org/v2\n", Reason.NOT_AGE),
        (b"age-encryption.org/v1\n", Reason.BAD_AGE_HEADER),
        (b"age-encryption.org/v1\n" + SHARE, Reason.BAD_AGE_HEADER),  # no MAC line
        (b"age-encryption.org/v1\n--- " + b"A" * 43 + b"\n", Reason.BAD_AGE_HEADER),  # no stanza
        (b"age-encryption.org/v1\n" + SHARE + b"--- abc\n", Reason.BAD_AGE_HEADER),  # MAC not 32 bytes
        (b"age-encryption.org/v1\n" + SHARE + b"--- " + b"A" * 42 + b"B\n", Reason.BAD_AGE_HEADER),  # not canonical
        (b"age-encryption.org/v1\n-> X25519 a\n" + b"A" * 65 + b"\n--- " + b"A" * 43 + b"\n", Reason.BAD_AGE_HEADER),
        (b"age-encryption.org/v1\n-> \n\n--- " + b"A" * 43 + b"\n", Reason.BAD_AGE_HEADER),  # empty argument
        (b"age-encryption.org/v1\n-> X25519  a\n\n--- " + b"A" * 43 + b"\n", Reason.BAD_AGE_HEADER),
        (b"age-encryption.org/v1\n-> X25519 a\n\n--- " + b"A" * 43 + b"\n", Reason.BAD_AGE_HEADER),  # body 0 bytes
        (b"age-encryption.org/v1\n-> grease\n\n--- " + b"A" * 43 + b"\n", Reason.BAD_AGE_HEADER),  # no X25519
        (b"age-encryption.org/v1\nhello\n--- " + b"A" * 43 + b"\n", Reason.BAD_AGE_HEADER),
        (
            b"age-encryption.org/v1\n" + b"-> x\n" + b"A" * 64 + b"\n" * 1100 + b"--- " + b"A" * 43 + b"\n",
            Reason.BAD_AGE_HEADER,
        ),
        (b"age-encryption.org/v1\n-> x " + b"a" * 70000 + b"\n", Reason.BAD_AGE_HEADER),  # over 64 KiB
    ],
    ids=lambda v: v.value if isinstance(v, Reason) else hashlib.sha256(v).hexdigest()[:8],
)
def test_age_header_grammar(header: bytes, reason: Reason) -> None:
    _refused(header, reason, _age)


def test_real_age_header_parses_with_its_stanzas_and_payload_offset() -> None:
    parsed = bundle.parse_age_header(GOOD)
    header, payload = _header_of(GOOD)
    assert parsed.payload_offset == len(header)
    assert GOOD[parsed.payload_offset :] == payload
    assert parsed.x25519 == 1


# -- the reference CLIs --------------------------------------------------------------------------


def _write_files(folder: Path) -> None:
    for name, data in FILES.items():
        (folder / name).write_bytes(data)


GNU_TAR = "LC_ALL=C tar --format=ustar --mtime=@0 --owner=0 --group=0 --numeric-owner --mode=0644 -cf -"


@needs_tools
def test_gnu_tar_with_the_documented_flags_writes_exactly_the_canonical_tar(tmp_path: Path) -> None:
    _write_files(tmp_path)
    made = subprocess.run(f"{GNU_TAR} {' '.join(NAMES)}", shell=True, cwd=tmp_path, capture_output=True, check=True)
    assert made.stdout == build_tar(FILES)


@needs_tools
def test_gnu_tar_in_another_order_or_format_is_refused(tmp_path: Path) -> None:
    _write_files(tmp_path)
    unsorted = subprocess.run(
        f"{GNU_TAR} {' '.join(reversed(NAMES))}", shell=True, cwd=tmp_path, capture_output=True, check=True
    )
    _refused(unsorted.stdout, Reason.TAR_NOT_CANONICAL, _tar)
    for fmt in ("pax", "gnu"):
        made = subprocess.run(
            f"{GNU_TAR.replace('ustar', fmt)} {' '.join(NAMES)}",
            shell=True,
            cwd=tmp_path,
            capture_output=True,
            check=True,
        )
        _refused(made.stdout, Reason.TAR_NOT_CANONICAL, _tar)
    plain = subprocess.run(["tar", "-cf", "-", *NAMES], cwd=tmp_path, capture_output=True, check=True)
    _refused(plain.stdout, Reason.TAR_NOT_CANONICAL, _tar)  # the file system's mtimes and owners


@needs_tools
def test_second_archive_that_tar_i_lists_is_refused(tmp_path: Path) -> None:
    """The parser differential of issue 10: ``tar -i`` reads a second archive with its own
    manifest.json after the first one's end, so the verifier must refuse it, not ignore it."""
    forged = {**FILES, "manifest.json": b'{"forged": true}\n'}
    both = build_tar(FILES) + build_tar(forged)
    listing = subprocess.run(["tar", "-t", "-i", "-f", "-"], input=both, capture_output=True, check=True)
    assert listing.stdout.decode().split().count("manifest.json") == 2
    err = _refused(both, Reason.TAR_TRAILING_DATA, _tar)
    assert "tar -i" in str(err)


@needs_tools
def test_zstd_cli_frame_is_accepted_and_two_concatenated_frames_are_refused(tmp_path: Path) -> None:
    (tmp_path / "b.tar").write_bytes(TAR)
    subprocess.run(["zstd", "-19", "--check", "-q", "-f", "b.tar", "-o", "b.zst"], check=True, cwd=tmp_path)
    subprocess.run(["zstd", "-1", "--no-check", "-q", "-f", "b.tar", "-o", "c.zst"], check=True, cwd=tmp_path)
    one, other = (tmp_path / "b.zst").read_bytes(), (tmp_path / "c.zst").read_bytes()
    assert _zstd(one) == TAR
    assert _zstd(other) == TAR
    # zstd -d decompresses both frames of a concatenation; the verifier sees one frame and refuses the rest
    both = one + other
    out = subprocess.run(["zstd", "-d", "-c"], input=both, capture_output=True, check=True).stdout
    assert out == TAR + TAR
    _refused(both, Reason.ZSTD_TRAILING_DATA, _zstd)
    cut = subprocess.run(["head", "-c", str(len(one) - 10)], input=one, capture_output=True, check=True).stdout
    _refused(cut, Reason.TRUNCATED_ZSTD, _zstd)


@needs_tools
def test_bundle_made_with_the_reference_clis_is_unpacked(tmp_path: Path) -> None:
    _write_files(tmp_path)
    recipe = f"{GNU_TAR} {' '.join(NAMES)} | zstd -19 --check -q | age -r {PUBLIC_KEY} > run.ale"
    subprocess.run(["bash", "-c", f"set -o pipefail; {recipe}"], check=True, cwd=tmp_path, timeout=60)
    assert unpack((tmp_path / "run.ale").read_bytes(), SECRET_KEY) == FILES
