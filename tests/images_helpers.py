"""A miniature image for the builder's fast tests: one synthetic .deb, one synthetic wheel, a
two-file checkout, all pre-placed in a download cache so the build runs offline in a second."""

from __future__ import annotations

import hashlib
import io
import lzma
import tarfile
import zipfile
from pathlib import Path


def _tar_xz(members: list[tuple[str, bytes | None, int, str]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name, body, mode, link in members:
            info = tarfile.TarInfo(name)
            info.mode, info.mtime, info.uid, info.gid, info.uname = mode, 1600000000, 1000, 1000, "someone"
            if body is None and link:
                info.type, info.linkname = tarfile.SYMTYPE, link
            elif body is None:
                info.type = tarfile.DIRTYPE
            else:
                info.size = len(body)
            tf.addfile(info, io.BytesIO(body) if body is not None else None)
    return lzma.compress(buf.getvalue())


def make_deb() -> bytes:
    control = _tar_xz([("./control", b"Package: minibase\nVersion: 1.0-1\nArchitecture: amd64\n", 0o644, "")])
    data = _tar_xz(
        [
            ("./", None, 0o755, ""),
            ("./bin/", None, 0o755, ""),
            ("./bin/hello", b"#!/bin/sh\necho hello\n", 0o755, ""),
            ("./bin/sh", None, 0o777, "hello"),
            ("./usr/share/doc/minibase/copyright", b"public domain\n", 0o644, ""),
            ("./usr/share/man/man1/hello.1", b".TH HELLO\n", 0o644, ""),
        ]
    )
    out = b"!<arch>\n"
    for name, body in (("debian-binary", b"2.0\n"), ("control.tar.xz", control), ("data.tar.xz", data)):
        out += f"{name:<16}{0:<12}{0:<6}{0:<6}{0o100644:<8o}{len(body):<10}`\n".encode() + body
        out += b"\n" if len(body) % 2 else b""
    return out


def make_wheel() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:

        def put(name: str, body: bytes, mode: int = 0o644) -> None:
            info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
            info.external_attr = (0o100000 | mode) << 16
            zf.writestr(info, body)

        put("mini/__init__.py", b"def main():\n    return 0\n")
        put("mini-1.0.data/scripts/mini-tool", b"#!python\nprint('tool')\n", 0o755)
        put("mini-1.0.dist-info/METADATA", b"Metadata-Version: 2.1\nName: mini\nVersion: 1.0\n")
        put("mini-1.0.dist-info/entry_points.txt", b"[console_scripts]\nmini = mini:main\n")
        put("mini-1.0.dist-info/RECORD", b"")
    return buf.getvalue()


DEFINITION = """\
format = 1
name = "mini"
description = "a test image"

[image]
user = {{ name = "tester", uid = 10009, gid = 10009, home = "/home/tester" }}
entrypoint = ["/bin/hello"]
workdir = "/"
env = {{ PATH = "/usr/bin:/bin" }}

[files]
folders = [{{ path = "/tmp", mode = "1777" }}]
symlinks = {{ "/usr/bin/greet" = "hello" }}

[project]
rename = {{ evaluator = "ale_evaluator" }}
files = ["ale/__init__.py", "evaluator/*.py"]

[python]
version = "3.11"
abi = "cp311"
glibc = "2.36"
site = "/usr/local/lib/python3.11/dist-packages"
bin = "/usr/local/bin"
want = ["mini"]
wheels = [
  {{ name = "mini", version = "1.0", url = "https://example.invalid/mini-1.0-py3-none-any.whl", sha256 = "{wheel}" }},
]

[debian]
suites = ["bookworm"]
archives = {{ debian = "http://deb.example.invalid/debian" }}
snapshot = "20261201T000000Z"
want = ["minibase"]
drop = ["usr/share/doc", "usr/share/man"]
keep = ["usr/share/doc/*/copyright"]
packages = [
  {{ name = "minibase", version = "1.0-1", archive = "debian", path = "{path}", sha256 = "{deb}", size = {size} }},
]
"""


def mini_image(root: Path) -> tuple[Path, Path, Path]:
    """(checkout, definition file, cache) of the miniature image under ``root``."""
    deb, wheel = make_deb(), make_wheel()
    cache = root / "cache"
    (cache / "sha256").mkdir(parents=True)
    hashes = {}
    for key, body in (("deb", deb), ("wheel", wheel)):
        hashes[key] = hashlib.sha256(body).hexdigest()
        (cache / "sha256" / hashes[key]).write_bytes(body)
    checkout = root / "checkout"
    (checkout / "images").mkdir(parents=True)
    (checkout / "ale").mkdir()
    (checkout / "evaluator").mkdir()
    (checkout / "ale" / "__init__.py").write_text('__version__ = "0"\n')
    (checkout / "evaluator" / "__init__.py").write_text("")
    (checkout / "evaluator" / "cli.py").write_text("def main():\n    pass\n")
    (checkout / "evaluator" / "scratch.txt").write_text("not named by the definition\n")
    path = "pool/main/m/minibase/minibase_1.0-1_amd64.deb"
    text = DEFINITION.format(wheel=hashes["wheel"], deb=hashes["deb"], size=len(deb), path=path)
    file = checkout / "images" / "mini.toml"
    file.write_text(text)
    return checkout, file, cache
