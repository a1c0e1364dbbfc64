"""What an image holds of Python, read from its OCI layout's layers (ale.images.contents): the
distributions of a site-packages folder, the project's modules there, the interpreter a path names
(symbolic links followed, also in folders) and the Debian package that installed it. On small
layouts written here; the real agent image is read, and compared with what its own Python says
inside a container, in tests/test_images_repro.py and tests/test_oci_runtime.py."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest
from fuzzing import fuzz_settings
from hypothesis import given
from hypothesis import strategies as st

from ale.images import contents, layout

SITE = "/ale/python/lib/python3.11/site-packages"
STATUS = (
    b"Package: libc6\nStatus: install ok installed\nVersion: 2.36-9\n\n"
    b"Package: python3.11-minimal\nStatus: install ok installed\nVersion: 3.11.2-6+deb12u9\n"
    b"Description: a minimal Python\n two lines\n"
)


STATUS_312 = b"Package: python3.12-minimal\nVersion: 1:3.12.1-2\n"


def _layer(members: list[tuple[str, bytes | None, str]]) -> bytes:
    """A tar layer: (path, body or None for a symlink / folder, link target or "" )."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name, body, link in members:
            info = tarfile.TarInfo(name)
            if body is None and link:
                info.type, info.linkname = tarfile.SYMTYPE, link
            elif body is None:
                info.type = tarfile.DIRTYPE
            else:
                info.size = len(body)
            tf.addfile(info, io.BytesIO(body) if body is not None else None)
    return buf.getvalue()


def _layout(root: Path, *layers: bytes) -> Path:
    writer = layout.LayoutWriter(root)
    descriptors = [writer.put(data, layout.LAYER) for data in layers]
    config = writer.put(
        layout.canonical(
            layout.image_config(
                diff_ids=[d.digest for d in descriptors],
                user="1:1",
                env={},
                entrypoint=(),
                cmd=(),
                workdir="/",
                labels={},
            )
        ),
        layout.CONFIG,
    )
    manifest = writer.put(layout.canonical(layout.manifest(config, descriptors, {})), layout.MANIFEST)
    writer.finish(manifest, "test")
    return root


def _metadata(name: str, version: str) -> bytes:
    return f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\nA long description.\n".encode()


def _agent_like(root: Path) -> Path:
    debian = _layer([
        ("usr/bin/python3.11", b"\x7fELF", ""),
        ("var/lib/dpkg/status", STATUS, ""),
    ])  # fmt: skip
    python = _layer([
        (f"{SITE[1:]}/numpy-2.4.6.dist-info/METADATA", _metadata("numpy", "2.4.6"), ""),
        (f"{SITE[1:]}/typing_extensions-4.16.0.dist-info/METADATA", _metadata("typing_extensions", "4.16.0"), ""),
        (f"{SITE[1:]}/Farama_Notifications-0.0.6.dist-info/METADATA", _metadata("Farama-Notifications", "0.0.6"), ""),
        (f"{SITE[1:]}/numpy/__init__.py", b"", ""),
    ])  # fmt: skip
    project = _layer([
        (f"{SITE[1:]}/ale/__init__.py", b"", ""),
        (f"{SITE[1:]}/ale/client/_rpc.py", b"", ""),
        (f"{SITE[1:]}/ale/env/v1/env_pb2.pyi", b"", ""),
        (f"{SITE[1:]}/ale/py.typed", b"", ""),
    ])  # fmt: skip
    image = _layer([
        ("ale/python/bin/python", None, "python3"),
        ("ale/python/bin/python3", None, "/usr/bin/python3.11"),
    ])  # fmt: skip
    return _layout(root, debian, python, project, image)


def test_the_python_environment_is_read_from_the_layers(tmp_path: Path) -> None:
    found = contents.python_environment(_agent_like(tmp_path), site=SITE, executable="/ale/python/bin/python")
    assert found.resolved == "/usr/bin/python3.11"  # python -> python3 -> /usr/bin/python3.11
    assert (found.version, found.package) == ("3.11.2", "python3.11-minimal 3.11.2-6+deb12u9")
    assert found.modules == ("ale", "ale.client._rpc")  # .py files only
    assert found.distributions == ("farama-notifications==0.0.6", "numpy==2.4.6", "typing-extensions==4.16.0")


def test_a_symbolic_link_in_a_folder_of_the_path_is_followed(tmp_path: Path) -> None:
    root = _layout(
        tmp_path,
        _layer([("usr/bin/python3.12", b"", ""), ("var/lib/dpkg/status", STATUS_312, "")]),
        _layer([("opt/py", None, "../usr/bin"), ("opt/venv/bin", None, "/opt/py")]),
    )  # fmt: skip
    found = contents.python_environment(root, site=SITE, executable="/opt/venv/bin/python3.12")
    assert (found.resolved, found.version) == ("/usr/bin/python3.12", "3.12.1")  # the epoch dropped


@pytest.mark.parametrize(
    ("layers", "needle"),
    [
        (
            [[("usr/bin/python3.11", b"", ""), ("ale/python/bin/python3", None, "/usr/bin/python3.11")]],
            "dpkg status has no python3.11-minimal",
        ),
        ([[("ale/python/bin/python3", None, "/bin/sh"), ("bin/sh", b"", "")]], "not a python3.X interpreter"),
        ([[("ale/python/bin/python3", None, "/usr/bin/python3.11")]], "is not a file of the image"),
        ([[("ale/python/bin/python3", None, "python3")]], "too many levels of symbolic links"),
    ],
)
def test_an_image_without_its_interpreter_is_a_contents_error(
    tmp_path: Path, layers: list[list[tuple[str, bytes | None, str]]], needle: str
) -> None:
    root = _layout(tmp_path, *(_layer(m) for m in layers))
    with pytest.raises(contents.ContentsError, match=needle):
        contents.python_environment(root, site=SITE, executable="/ale/python/bin/python3")


def test_a_damaged_layout_or_layer_is_a_contents_error(tmp_path: Path) -> None:
    with pytest.raises(contents.ContentsError, match="cannot read the image's layers"):
        contents.python_environment(tmp_path, site=SITE, executable="/ale/python/bin/python3")
    root = _agent_like(tmp_path / "a")
    for blob in (root / "blobs" / "sha256").iterdir():
        if blob.stat().st_size > 2048:  # a layer, not a JSON document
            blob.write_bytes(b"\x00garbage" * 100)
    with pytest.raises(contents.ContentsError, match="cannot read the image's layers"):
        contents.python_environment(root, site=SITE, executable="/ale/python/bin/python3")


@pytest.mark.parametrize(
    "metadata",
    [b"", b"Name: numpy\n", b"Version: 1\n", b"Name: ../../etc\nVersion: 1\n", b"Name: a\nVersion: 1 2\n",
     b"Name: " + b"x" * 300 + b"\nVersion: 1\n", b"\xff\xfe\x00", b"Name: ok\nVersion: " + b"9" * 100 + b"\n"],
)  # fmt: skip
def test_a_metadata_without_a_plain_name_and_version_is_not_a_distribution(metadata: bytes) -> None:
    assert contents._distribution(metadata) is None


@pytest.mark.fuzz
@fuzz_settings
@given(st.binary(max_size=600))
def test_fuzz_metadata_gives_a_distribution_or_none(raw: bytes) -> None:
    found = contents._distribution(raw)
    assert found is None or ("==" in found and "\n" not in found and len(found) < 300)
