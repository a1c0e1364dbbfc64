"""Debian without dpkg: versions compare as dpkg's, the resolver closes a set, a .deb unpacks."""

from __future__ import annotations

import contextlib
import io
import itertools
import lzma
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
from fuzzing import fuzz_settings
from hypothesis import given
from hypothesis import strategies as st

from ale.images import debian, resolve
from ale.images.tree import Store, Tree

VERSIONS = [
    "0", "1.0", "1.0-0", "1.0-1", "1.0~rc1", "1.0~", "1.0a", "1.0.1", "1.0+b1", "1:0.9", "1.0-1.1",
    "1.0-1+deb12u1", "1.0-1+deb12u14", "2.36-9+deb12u7", "2.36-9+deb12u14", "0.9~~", "0.9~", "10", "9",
    "3.11.2-6", "3.11.2-6+deb12u6", "1.2.3-1~bpo12+1", "2:1.0", "1.0-a", "1.0-a1",
]  # fmt: skip


def _sign(n: int) -> int:
    return (n > 0) - (n < 0)


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ("1.0~rc1", "1.0", -1),
        ("1.0", "1.0-0", 0),
        ("1:0.9", "2.0", 1),
        ("2.36-9+deb12u7", "2.36-9+deb12u14", -1),
        ("1.0a", "1.0+", -1),  # letters sort before non-letters
        ("0.9~~", "0.9~", -1),
        ("10", "9", 1),
        ("1.01", "1.1", 0),
    ],
)
def test_versions_compare_as_dpkg_documents(a: str, b: str, expected: int) -> None:
    assert _sign(resolve.compare_versions(a, b)) == expected
    assert _sign(resolve.compare_versions(b, a)) == -expected


@pytest.mark.skipif(shutil.which("dpkg") is None, reason="dpkg is not installed: only the fixed vectors run")
def test_versions_compare_exactly_as_dpkg_itself() -> None:
    for a, b in itertools.product(VERSIONS, VERSIONS):
        lt = subprocess.run(["dpkg", "--compare-versions", a, "lt", b]).returncode == 0
        eq = subprocess.run(["dpkg", "--compare-versions", a, "eq", b]).returncode == 0
        assert _sign(resolve.compare_versions(a, b)) == (0 if eq else -1 if lt else 1), (a, b)


# --- resolution ---------------------------------------------------------------------------------

INDEX = """\
Package: app
Version: 1.0-1
Depends: libfoo (>= 2.0), awk, helper | helper-ng, debconf (>= 0.5) | debconf-2.0
Filename: pool/main/a/app/app_1.0-1_amd64.deb
Size: 100
SHA256: {h}

Package: libfoo
Version: 2.1-1
Pre-Depends: libc6 (>= 2.34)
Filename: pool/main/libf/libfoo/libfoo_2.1-1_amd64.deb
Size: 100
SHA256: {h}

Package: libfoo
Version: 2.0-1
Filename: pool/main/libf/libfoo/libfoo_2.0-1_amd64.deb
Size: 100
SHA256: {h}

Package: libc6
Version: 2.36-9+deb12u14
Filename: pool/main/g/glibc/libc6_2.36-9+deb12u14_amd64.deb
Size: 100
SHA256: {h}

Package: gawk
Version: 1:5.2.1-2
Provides: awk
Filename: pool/main/g/gawk/gawk_5.2.1-2_amd64.deb
Size: 100
SHA256: {h}

Package: mawk
Version: 1.3.4
Provides: awk
Filename: pool/main/m/mawk/mawk_1.3.4_amd64.deb
Size: 100
SHA256: {h}

Package: helper-ng
Version: 3
Filename: pool/main/h/helper-ng/helper-ng_3_amd64.deb
Size: 100
SHA256: {h}
"""


def _index(text: str = INDEX) -> dict[str, resolve.Candidate]:
    cands = [c for f in resolve.paragraphs(text.format(h="0" * 64)) if (c := resolve.candidate(f, "debian"))]
    return resolve.newest(cands)


def test_newest_version_of_each_package_wins() -> None:
    assert _index()["libfoo"].version == "2.1-1"


def test_resolver_closes_over_depends_and_pre_depends() -> None:
    names = [c.name for c in resolve.resolve(_index(), ["app"], exclude=["debconf"])]
    assert names == ["app", "gawk", "helper-ng", "libc6", "libfoo"]  # sorted; awk by its first provider


def test_resolver_prefers_a_wanted_provider_of_a_virtual_package() -> None:
    names = [c.name for c in resolve.resolve(_index(), ["app", "mawk"], exclude=["debconf"])]
    assert "mawk" in names
    assert "gawk" not in names


def test_resolver_names_what_is_missing() -> None:
    with pytest.raises(resolve.ResolveError, match=r"debconf \(>= 0.5\) \| debconf-2.0"):
        resolve.resolve(_index(), ["app"])
    with pytest.raises(resolve.ResolveError, match="'nothing' is in no index"):
        resolve.resolve(_index(), ["nothing"])
    with pytest.raises(resolve.ResolveError, match=r"offer 2\.1-1"):
        resolve.resolve(_index(), ["libfoo=2.0-1"])


def test_resolver_refuses_a_version_no_index_has() -> None:
    text = INDEX.replace("libfoo (>= 2.0)", "libfoo (>= 9)")
    with pytest.raises(resolve.ResolveError, match=r"libfoo \(>= 9\)"):
        resolve.resolve(_index(text), ["app"], exclude=["debconf"])


def test_relations_with_architecture_qualifiers_and_profiles() -> None:
    groups = resolve.relations("python3:any (>= 3.11), libc6 [amd64] <!nocheck>, aa | bb (<< 2)", "x")
    assert [[str(a) for a in g] for g in groups] == [["python3 (>= 3.11)"], ["libc6"], ["aa", "bb (<< 2)"]]


@pytest.mark.parametrize("bad", ["foo (>= )", "Foo", "a (~ 1)", "(>= 1)"])
def test_unreadable_relations_are_errors(bad: str) -> None:
    with pytest.raises(resolve.ResolveError, match="cannot read the relation"):
        resolve.relations(bad, "pkg")


@pytest.mark.fuzz
@fuzz_settings
@given(st.text(max_size=400))
def test_fuzz_packages_paragraphs_and_relations(text: str) -> None:
    for fields in resolve.paragraphs(text):
        c = resolve.candidate(fields, "debian")
        if c is not None:
            with contextlib.suppress(resolve.ResolveError):
                resolve.relations(c.depends, c.name)


@pytest.mark.fuzz
@fuzz_settings
@given(st.text(alphabet="0123456789.:~+-abz", max_size=12), st.text(alphabet="0123456789.:~+-abz", max_size=12))
def test_fuzz_version_comparison_is_antisymmetric(a: str, b: str) -> None:
    try:
        forward = _sign(resolve.compare_versions(a, b))
    except resolve.ResolveError:
        return
    assert _sign(resolve.compare_versions(b, a)) == -forward


# --- unpacking ----------------------------------------------------------------------------------


def _tar_xz(members: list[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for info, body in members:
            tf.addfile(info, io.BytesIO(body) if body is not None else None)
    return lzma.compress(buf.getvalue())


def _info(name: str, kind: bytes = tarfile.REGTYPE, body: bytes = b"", mode: int = 0o644, link: str = "") -> tuple:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.size, info.linkname = kind, mode, len(body), link
    info.mtime, info.uid, info.gid, info.uname = 1700000000, 1000, 1000, "builder"
    return info, body if kind == tarfile.REGTYPE else None


def _ar(members: list[tuple[str, bytes]]) -> bytes:
    out = b"!<arch>\n"
    for name, body in members:
        out += f"{name:<16}{0:<12}{0:<6}{0:<6}{0o100644:<8o}{len(body):<10}`\n".encode() + body
        if len(body) % 2:
            out += b"\n"
    return out


def _deb(tmp_path: Path, data: list[tuple], control: bytes = b"Package: demo\nVersion: 1\n") -> Path:
    path = tmp_path / "demo.deb"
    path.write_bytes(
        _ar(
            [
                ("debian-binary", b"2.0\n"),
                ("control.tar.xz", _tar_xz([_info("./control", body=control)])),
                ("data.tar.xz", _tar_xz(data)),
            ]
        )
    )
    return path


@pytest.fixture
def store(tmp_path: Path) -> Store:
    s = Store(parent=tmp_path)
    yield s
    s.close()


def test_deb_unpacks_through_merged_usr_with_normalised_metadata(tmp_path: Path, store: Store) -> None:
    deb = _deb(
        tmp_path,
        [
            _info("./", tarfile.DIRTYPE, mode=0o755),
            _info("./bin/", tarfile.DIRTYPE, mode=0o755),
            _info("./bin/sh", tarfile.SYMTYPE, link="dash"),
            _info("./bin/dash", body=b"ELF dash", mode=0o4755),
            _info("./lib/x86_64-linux-gnu/libdemo.so.1", body=b"ELF lib"),
            _info("./usr/bin/demo-link", tarfile.LNKTYPE, link="./bin/dash"),
            _info("./var/tmp/", tarfile.DIRTYPE, mode=0o1777),
            _info("./usr/share/doc/demo/changelog.gz", body=b"log"),
            _info("./usr/share/doc/demo/copyright", body=b"(c)"),
        ],
    )
    tree = Tree()
    control = debian.unpack(
        deb, tree, store, origin="demo 1", drop=["usr/share/doc"], keep=["usr/share/doc/*/copyright"]
    )
    tree.settle_hardlinks()
    assert control.startswith(b"Package: demo")
    e = tree.entries
    assert e["usr/bin/sh"].kind == "symlink"
    assert e["usr/bin/sh"].target == "dash"
    assert e["usr/bin/dash"].mode == 0o755  # setuid dropped
    assert "usr/lib/x86_64-linux-gnu/libdemo.so.1" in e
    assert e["usr/bin/dash"].kind == "file"
    assert e["usr/bin/demo-link"].target == "usr/bin/dash"
    assert e["var/tmp"].mode == 0o1777
    assert "usr/share/doc/demo/changelog.gz" not in e
    assert "usr/share/doc/demo/copyright" in e
    assert "bin" not in e  # the merged-/usr symlinks are the builder's, added once


def test_device_files_in_a_deb_are_refused(tmp_path: Path, store: Store) -> None:
    deb = _deb(tmp_path, [_info("./dev/null", tarfile.CHRTYPE)])
    with pytest.raises(debian.DebError, match="device"):
        debian.unpack(deb, Tree(), store, origin="evil 1")


def test_a_deb_member_leaving_the_root_is_refused(tmp_path: Path, store: Store) -> None:
    deb = _deb(tmp_path, [_info("../../etc/passwd", body=b"root::0:0")])
    with pytest.raises(debian.DebError, match="not a path inside the image"):
        debian.unpack(deb, Tree(), store, origin="evil 1")


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        (b"not an archive", "not an ar archive"),
        (b"!<arch>\n" + b"x" * 30, "damaged"),
        (b"!<arch>\n" + b"data.tar.xz     0           0     0     100644  99999     `\n" + b"short", "truncated"),
        (b"!<arch>\n", "no control.tar or data.tar"),
    ],
)
def test_damaged_debs_are_errors_naming_the_package(tmp_path: Path, store: Store, raw: bytes, match: str) -> None:
    path = tmp_path / "bad.deb"
    path.write_bytes(raw)
    with pytest.raises(debian.DebError, match=match):
        debian.unpack(path, Tree(), store, origin="bad 1")


@pytest.mark.fuzz
@fuzz_settings
@given(st.binary(max_size=600))
def test_fuzz_ar_reader_raises_only_deb_errors(raw: bytes) -> None:
    try:
        for _name, body in debian.ar_members(io.BytesIO(b"!<arch>\n" + raw), "fuzz"):
            body.read()
    except debian.DebError:
        pass


def test_status_file_lists_packages_sorted_and_installed() -> None:
    status = debian.status_file({"zlib1g": b"Package: zlib1g\nVersion: 1\n", "bash": b"Package: bash\nVersion: 5\n"})
    assert status == (
        b"Package: bash\nStatus: install ok installed\nVersion: 5\n\n"
        b"Package: zlib1g\nStatus: install ok installed\nVersion: 1\n"
    )
    with pytest.raises(debian.DebError, match="Package:"):
        debian.status_file({"x": b"Version: 1\n"})
