"""age(zstd(tar)) bundles: deterministic packing, reference CLIs, and hostile archives."""

from __future__ import annotations

import functools
import io
import shutil
import subprocess
import tarfile
from pathlib import Path

import pyrage
import pytest
import verifier_helpers as h

from ale.core.bundle import (
    ALLOWED_FILES,
    BundleError,
    Limits,
    build_tar,
    compress,
    pack,
    unpack,
)

IDENTITY = pyrage.x25519.Identity.generate()
SECRET_KEY, PUBLIC_KEY = str(IDENTITY), str(IDENTITY.to_public())
FILES = {name: f"content of {name}\n".encode() for name in ALLOWED_FILES}


def _encrypt(plain: bytes) -> bytes:
    return h.encrypt(plain, PUBLIC_KEY)


#: A tar member (verifier_helpers.member) whose default content is b"x".
_member = functools.partial(h.member, data=b"x")


def _bundle_of(tar_bytes: bytes) -> bytes:
    return _encrypt(compress(tar_bytes))


def test_round_trip() -> None:
    assert unpack(pack(FILES, [PUBLIC_KEY]), SECRET_KEY) == FILES


def test_tar_and_zstd_are_deterministic() -> None:
    assert build_tar(FILES) == build_tar(dict(reversed(list(FILES.items()))))
    assert compress(build_tar(FILES)) == compress(build_tar(FILES))
    with tarfile.open(fileobj=io.BytesIO(build_tar(FILES))) as tar:
        members = tar.getmembers()
    assert [m.name for m in members] == sorted(ALLOWED_FILES)
    assert {(m.mtime, m.uid, m.gid, m.uname, m.gname, m.mode) for m in members} == {(0, 0, 0, "", "", 0o644)}


@pytest.mark.skipif(not all(shutil.which(t) for t in ("age", "zstd", "tar")), reason="needs the age, zstd and tar CLIs")
def test_reference_clis_open_a_bundle(tmp_path: Path) -> None:
    (tmp_path / "bundle.ale").write_bytes(pack(FILES, [PUBLIC_KEY]))
    (tmp_path / "key.txt").write_text(SECRET_KEY + "\n")
    out = tmp_path / "out"
    out.mkdir()
    subprocess.run("age -d -i key.txt bundle.ale | zstd -d | tar -x -C out -f -", shell=True, check=True, cwd=tmp_path)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == FILES


@pytest.mark.skipif(not shutil.which("age"), reason="needs the age CLI")
def test_bundle_from_the_reference_cli_unpacks(tmp_path: Path) -> None:
    (tmp_path / "plain").write_bytes(compress(build_tar(FILES)))
    subprocess.run(["age", "-r", PUBLIC_KEY, "-o", "b.ale", "plain"], check=True, cwd=tmp_path)
    assert unpack((tmp_path / "b.ale").read_bytes(), SECRET_KEY) == FILES


def _complete(*extra: tuple) -> list[tuple]:
    """The eight files and ``extra``, in ascending byte order of their names (as canonical)."""
    members = [_member(n, data=FILES[n]) for n in ALLOWED_FILES] + list(extra)
    return sorted(members, key=lambda m: m[0].name.encode())


@pytest.mark.parametrize(
    ("members", "reason"),
    [
        (_complete(_member("../evil")), "path_traversal"),
        (_complete(_member("/etc/passwd")), "absolute_path"),
        (_complete(_member("link", tarfile.SYMTYPE, link="/etc/passwd")), "symlink"),
        (_complete(_member("hard", tarfile.LNKTYPE, link="manifest.json")), "hardlink"),
        (_complete(_member("dev", tarfile.CHRTYPE)), "device"),
        (_complete(_member("blk", tarfile.BLKTYPE)), "device"),
        (_complete(_member("fifo", tarfile.FIFOTYPE)), "device"),
        (_complete(_member("dir", tarfile.DIRTYPE)), "directory"),
        (_complete(_member("sub/file.json")), "bad_member"),
        (_complete(_member("extra.json")), "unexpected_file"),
        (_complete(_member("manifest.json")), "duplicate_member"),
        ([_member(n) for n in ALLOWED_FILES[:-1]], "missing_file"),
        ([_member(f"f{i}") for i in range(40)], "too_many_files"),
    ],
)
def test_hostile_archives_are_refused(members: list[tuple], reason: str) -> None:
    with pytest.raises(BundleError) as err:
        unpack(_bundle_of(h.raw_tar(*members)), SECRET_KEY)
    assert err.value.reason == reason


def test_zstd_bomb_is_stopped_at_the_limit() -> None:
    bomb = compress(b"\x00" * (80 * 1024 * 1024))
    assert len(bomb) < 100_000
    with pytest.raises(BundleError) as err:
        unpack(_encrypt(bomb), SECRET_KEY)
    assert err.value.reason == "decompressed_too_large"


def test_oversized_member_is_refused() -> None:
    limits = Limits(max_file_bytes=10)
    with pytest.raises(BundleError) as err:
        unpack(_bundle_of(h.raw_tar(_member("manifest.json", data=b"x" * 11))), SECRET_KEY, limits)
    assert err.value.reason == "file_too_large"


@pytest.mark.parametrize(
    ("ciphertext", "reason"),
    [
        (b"", "not_age"),
        (b"random bytes" * 10, "not_age"),
        (b"age-encryption.org/v1\n", "bad_age_header"),
        (b"age-encryption.org/v1\n--- abc\n", "bad_age_header"),
        (pack(FILES, [PUBLIC_KEY])[:-20], "decrypt_failed"),
        (pack(FILES, [str(pyrage.x25519.Identity.generate().to_public())]), "decrypt_failed"),
        (pack(FILES, [str(pyrage.x25519.Identity.generate().to_public()) for _ in range(9)]), "too_many_stanzas"),
        (_encrypt(b"not zstd at all"), "bad_zstd"),
        (_encrypt(compress(b"not a tar" * 100)), "bad_tar"),
        (_encrypt(compress(b"")), "bad_tar"),
    ],
)
def test_bad_ciphertexts_are_refused(ciphertext: bytes, reason: str) -> None:
    with pytest.raises(BundleError) as err:
        unpack(ciphertext, SECRET_KEY)
    assert err.value.reason == reason


def test_too_large_ciphertext_is_refused_before_decrypting() -> None:
    with pytest.raises(BundleError) as err:
        unpack(b"age-encryption.org/v1\n" + b"x" * 100, SECRET_KEY, Limits(max_ciphertext=50))
    assert err.value.reason == "too_large"


def test_pack_refuses_wrong_file_sets_and_bad_recipients() -> None:
    with pytest.raises(ValueError, match="exactly"):
        pack({"manifest.json": b"{}"}, [PUBLIC_KEY])
    with pytest.raises(ValueError, match="recipient"):
        pack(FILES, ["age1notakey"])
    with pytest.raises(ValueError, match="recipient"):
        pack(FILES, [])
