"""The builder end to end on a miniature image (offline, a second): two fresh folders give the
same manifest digest; the layout reads back; the lock and the attestation refuse what differs;
the download cache never builds from a damaged file; wheels install as an installer would."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from fuzzing import fuzz_settings, hostile_json
from hypothesis import given
from images_helpers import make_wheel, mini_image

from ale.images import attest, definition, layout
from ale.images.build import BuildError, Built, build_image
from ale.images.fetch import FetchError, fetch
from ale.images.tree import Store, Tree
from ale.images.wheels import WheelError, install


def _build(root: Path, out: Path, **kw: object) -> Built:
    checkout, path, cache = mini_image(root)
    return build_image(definition.load(path), checkout, out, cache, offline=True, log=lambda _l: None, **kw)


def _members(layer: Path) -> list[tarfile.TarInfo]:
    with tarfile.open(layer) as tf:
        return tf.getmembers()


def _read(layer: Path, name: str) -> bytes:
    with tarfile.open(layer) as tf:
        f = tf.extractfile(name)
        assert f is not None
        return f.read()


def test_two_builds_in_fresh_folders_give_the_same_manifest_digest(tmp_path: Path) -> None:
    a = _build(tmp_path / "one", tmp_path / "one" / "out" / "mini")
    b = _build(tmp_path / "two", tmp_path / "two" / "elsewhere" / "mini")
    assert a.digest == b.digest
    assert [x.digest for x in a.layers] == [x.digest for x in b.layers]
    assert layout.read_manifest_digest(a.layout) == a.digest


def test_the_epoch_is_every_entrys_time_and_changes_the_digest(tmp_path: Path) -> None:
    a = _build(tmp_path / "a", tmp_path / "a" / "mini", epoch=0)
    b = _build(tmp_path / "b", tmp_path / "b" / "mini", epoch=1700000000)
    assert a.digest != b.digest
    for path in layout.layer_paths(b.layout):
        assert {m.mtime for m in _members(path)} == {1700000000}


def test_umask_and_file_times_of_the_checkout_do_not_reach_the_image(tmp_path: Path) -> None:
    a = _build(tmp_path / "a", tmp_path / "a" / "mini")
    old = os.umask(0o077)
    try:
        checkout, path, cache = mini_image(tmp_path / "b")
        os.utime(checkout / "ale" / "__init__.py", (1, 1))
        b = build_image(definition.load(path), checkout, tmp_path / "b" / "mini", cache, offline=True, log=print)
    finally:
        os.umask(old)
    assert a.digest == b.digest


def test_layers_hold_what_the_definition_says_and_nothing_else(tmp_path: Path) -> None:
    built = _build(tmp_path, tmp_path / "mini")
    names = [x.name for x in built.layers]
    assert names == ["debian", "python", "project", "image"]
    paths = dict(zip(names, layout.layer_paths(built.layout), strict=True))
    deb = {m.name: m for m in _members(paths["debian"])}
    assert deb["bin"].issym()
    assert deb["bin"].linkname == "usr/bin"
    assert deb["usr/bin/sh"].linkname == "hello"
    assert "usr/share/doc/minibase/copyright" in deb
    assert "usr/share/man/man1/hello.1" not in deb
    assert b"Package: minibase\nStatus: install ok installed" in _read(paths["debian"], "var/lib/dpkg/status")
    py = {m.name for m in _members(paths["python"]) if m.isfile()}
    site = "usr/local/lib/python3.11/dist-packages"
    assert {f"{site}/mini/__init__.py", "usr/local/bin/mini", "usr/local/bin/mini-tool"} <= py
    project = {m.name for m in _members(paths["project"]) if m.isfile()}
    assert project == {f"{site}/ale/__init__.py", f"{site}/ale_evaluator/__init__.py", f"{site}/ale_evaluator/cli.py"}
    image = {m.name: m for m in _members(paths["image"])}
    assert image["tmp"].mode == 0o1777
    assert image["usr/bin/greet"].linkname == "hello"
    passwd = _read(paths["image"], "etc/passwd")
    assert b"tester:x:10009:10009:tester:/home/tester:" in passwd


def test_config_and_manifest_carry_no_time(tmp_path: Path) -> None:
    built = _build(tmp_path, tmp_path / "mini")
    _digest, manifest = layout.read_manifest(built.layout)
    config = json.loads((built.layout / "blobs/sha256" / manifest["config"]["digest"][7:]).read_bytes())
    assert "created" not in config
    assert "history" not in config
    assert config["config"]["User"] == "10009:10009"
    assert config["config"]["Labels"]["org.ale-robotics.image.definition.sha256"] == built.definition_sha256
    assert all(layer["mediaType"] == layout.LAYER for layer in manifest["layers"])
    for name in ("index.json", "oci-layout"):
        raw = (built.layout / name).read_bytes()
        assert raw == layout.canonical(json.loads(raw)), f"{name} is not canonical JSON"


def test_canonical_json_is_rfc8785_for_the_documents_we_write() -> None:
    from ale.core.canonical import canonical_json

    doc = {"b": [1, "x"], "a": {"z": "é", "A": 0}, "mediaType": layout.MANIFEST}
    assert layout.canonical(doc) == canonical_json(doc)


def test_an_offline_build_without_the_downloads_names_what_is_missing(tmp_path: Path) -> None:
    checkout, path, _cache = mini_image(tmp_path)
    with pytest.raises(FetchError, match=r"minibase 1\.0-1 .* not in the cache"):
        build_image(definition.load(path), checkout, tmp_path / "out", tmp_path / "empty", offline=True)


def test_a_definition_naming_a_missing_project_file_is_an_error(tmp_path: Path) -> None:
    checkout, path, cache = mini_image(tmp_path)
    path.write_text(path.read_text().replace('"evaluator/*.py"', '"evaluator/*.rs"'))
    with pytest.raises(BuildError, match=r"evaluator/\*\.rs"):
        build_image(definition.load(path), checkout, tmp_path / "out", cache, offline=True, log=print)


def test_build_never_replaces_a_folder_that_is_not_a_layout(tmp_path: Path) -> None:
    checkout, path, cache = mini_image(tmp_path)
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "thesis.tex").write_text("years of work")
    with pytest.raises(BuildError, match="not an OCI layout"):
        build_image(definition.load(path), checkout, precious, cache, offline=True, log=print)
    assert (precious / "thesis.tex").read_text() == "years of work"


def test_only_tracked_files_of_a_git_checkout_go_in(tmp_path: Path) -> None:
    a = _build(tmp_path / "plain", tmp_path / "plain" / "mini")
    checkout, path, cache = mini_image(tmp_path / "git")
    subprocess.run(["git", "init", "-q", str(checkout)], check=True)
    subprocess.run(["git", "-C", str(checkout), "add", "ale", "evaluator", "images"], check=True)
    (checkout / "evaluator" / "untracked.py").write_text("STRAY = 1\n")
    b = build_image(definition.load(path), checkout, tmp_path / "git" / "mini", cache, offline=True, log=print)
    assert a.digest == b.digest


# --- the lock and the attestation ---------------------------------------------------------------


def test_lock_round_trip_and_verify(tmp_path: Path) -> None:
    built = _build(tmp_path, tmp_path / "out" / "mini")
    defn = definition.load(tmp_path / "checkout" / "images" / "mini.toml")
    entries = attest.read_lock_entries(tmp_path / "out", [defn])
    assert entries["mini"]["digest"] == built.digest
    lock = tmp_path / "images.lock.json"
    attest.write_lock(lock, entries)
    assert attest.verify_layouts(lock, tmp_path / "out") == [("mini", built.digest)]
    doc = attest.image_attestation(lock, tmp_path / "out")
    assert doc["images"]["mini"] == {"digest": built.digest, "definition_sha256": defn.sha256}
    assert doc["lock_sha256"] == hashlib.sha256(lock.read_bytes()).hexdigest()


def test_verify_refuses_a_layout_with_another_digest(tmp_path: Path) -> None:
    _build(tmp_path, tmp_path / "out" / "mini")
    lock = tmp_path / "images.lock.json"
    entry = {"digest": "sha256:" + "0" * 64, "definition_sha256": "x", "layers": []}
    attest.write_lock(lock, {"mini": entry})
    with pytest.raises(attest.AttestError, match="the lock's sha256:000"):
        attest.verify_layouts(lock, tmp_path / "out")


def test_lock_refuses_a_layout_built_from_another_definition(tmp_path: Path) -> None:
    _build(tmp_path, tmp_path / "out" / "mini")
    path = tmp_path / "checkout" / "images" / "mini.toml"
    path.write_text(path.read_text().replace("a test image", "an edited image"))
    with pytest.raises(attest.AttestError, match="another version"):
        attest.read_lock_entries(tmp_path / "out", [definition.load(path)])


def test_a_tampered_manifest_blob_is_refused(tmp_path: Path) -> None:
    built = _build(tmp_path, tmp_path / "mini")
    blob = built.layout / "blobs/sha256" / built.digest[7:]
    blob.write_bytes(blob.read_bytes().replace(b'"schemaVersion":2', b'"schemaVersion":3'))
    with pytest.raises(layout.LayoutError, match="does not have that digest"):
        layout.read_manifest_digest(built.layout)


@pytest.mark.parametrize(
    ("index", "match"),
    [
        (b"[" * 100000 + b"]" * 100000, "nested deeper"),
        (b'{"manifests": []}', "exactly one manifest"),
        (b'{"manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": "md5:x"}]}', "sha256"),
        (b"\xff", "not valid JSON"),
    ],
)
def test_hostile_index_gives_layout_errors(tmp_path: Path, index: bytes, match: str) -> None:
    (tmp_path / "oci-layout").write_bytes(b'{"imageLayoutVersion":"1.0.0"}')
    (tmp_path / "index.json").write_bytes(index)
    with pytest.raises(layout.LayoutError, match=match):
        layout.read_manifest_digest(tmp_path)


@pytest.mark.fuzz
@fuzz_settings
@given(hostile_json)
def test_fuzz_lock_reader_raises_only_attest_errors(tmp_path_factory: pytest.TempPathFactory, raw: bytes) -> None:
    path = tmp_path_factory.mktemp("lock") / "images.lock.json"
    path.write_bytes(raw)
    with contextlib.suppress(attest.AttestError):
        attest.read_lock(path)


@pytest.mark.fuzz
@fuzz_settings
@given(hostile_json)
def test_fuzz_layout_index_reader_raises_only_layout_errors(
    tmp_path_factory: pytest.TempPathFactory, raw: bytes
) -> None:
    root = tmp_path_factory.mktemp("layout")
    (root / "oci-layout").write_bytes(b'{"imageLayoutVersion":"1.0.0"}')
    (root / "index.json").write_bytes(raw)
    with contextlib.suppress(layout.LayoutError):
        layout.read_manifest_digest(root)


# --- the download cache -------------------------------------------------------------------------


def test_a_damaged_cache_entry_is_fetched_again_never_used(tmp_path: Path) -> None:
    body = b"pinned bytes"
    sha = hashlib.sha256(body).hexdigest()
    source = tmp_path / "mirror.bin"
    source.write_bytes(body)
    cache = tmp_path / "cache"
    (cache / "sha256").mkdir(parents=True)
    (cache / "sha256" / sha).write_bytes(b"bit rot")
    got = fetch([source.as_uri()], sha, cache, offline=False, what="x")
    assert got.read_bytes() == body


def test_a_source_serving_other_bytes_is_skipped_for_the_next(tmp_path: Path) -> None:
    body = b"the real thing"
    sha = hashlib.sha256(body).hexdigest()
    (tmp_path / "wrong").write_bytes(b"an impostor")
    (tmp_path / "right").write_bytes(body)
    cache = tmp_path / "cache"
    with pytest.raises(FetchError, match="SHA-256"):
        fetch([(tmp_path / "wrong").as_uri()], sha, cache, offline=False, what="x")
    assert not list((cache / "sha256").iterdir()), "a wrong download must leave nothing behind"
    got = fetch([(tmp_path / "wrong").as_uri(), (tmp_path / "right").as_uri()], sha, cache, offline=False, what="x")
    assert got.read_bytes() == body


# --- wheels -------------------------------------------------------------------------------------


def _wheel(tmp_path: Path, members: dict[str, bytes]) -> Path:
    path = tmp_path / "w.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for name, body in members.items():
            zf.writestr(name, body)
    return path


@pytest.mark.parametrize(
    ("members", "match"),
    [
        ({"x/__init__.py": b""}, "0 .dist-info"),
        ({"a-1.dist-info/METADATA": b"", "b-1.dist-info/METADATA": b""}, "2 .dist-info"),
        ({"a-1.dist-info/METADATA": b"", "a-1.data/weird/x": b""}, "unknown .data scheme"),
        ({"a-1.dist-info/METADATA": b"", "../../etc/passwd": b""}, "not a path inside"),
        ({"a-1.dist-info/METADATA": b"", "a-1.dist-info/entry_points.txt": b"[console_scripts]\nx = 1bad\n"}, "x"),
    ],
)
def test_bad_wheels_are_errors(tmp_path: Path, members: dict[str, bytes], match: str) -> None:
    store = Store(parent=tmp_path)
    with pytest.raises(WheelError, match=match):
        install(_wheel(tmp_path, members), Tree(), store, site="/usr/lib/python3/dist-packages", bin_dir="/usr/bin",
                python="3.11", origin="w 1")  # fmt: skip


def test_not_a_zip_is_a_wheel_error(tmp_path: Path) -> None:
    (tmp_path / "w.whl").write_bytes(b"PK\x03\x04 not really")
    with pytest.raises(WheelError, match="not a wheel"):
        install(tmp_path / "w.whl", Tree(), Store(parent=tmp_path), site="/s/lib/p", bin_dir="/b", python="3.11",
                origin="w 1")  # fmt: skip


def test_wheel_scripts_get_the_images_interpreter(tmp_path: Path) -> None:
    (tmp_path / "m.whl").write_bytes(make_wheel())
    store, tree = Store(parent=tmp_path), Tree()
    install(tmp_path / "m.whl", tree, store, site="/usr/local/lib/python3.11/dist-packages", bin_dir="/usr/local/bin",
            python="3.11", origin="mini 1.0")  # fmt: skip
    script = tree.entries["usr/local/bin/mini-tool"]
    assert script.mode == 0o755
    with store.open(script.sha256) as f:
        assert f.read().startswith(b"#!/usr/bin/python3.11\n")
    with store.open(tree.entries["usr/local/bin/mini"].sha256) as f:
        launcher = f.read()
    assert b"from mini import main" in launcher
    compile(launcher, "launcher", "exec")  # valid Python


# --- the command line ---------------------------------------------------------------------------


def test_cli_build_prints_the_digest_and_lock_verify_agree(tmp_path: Path) -> None:
    checkout, _path, cache = mini_image(tmp_path)
    run = [sys.executable, "-m", "ale.images"]
    out = subprocess.run(
        [*run, "build", "--source", str(checkout), "--out", str(tmp_path / "out"), "--cache", str(cache), "--offline"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    name, digest, where = out.stdout.split()
    assert name == "mini"
    assert digest.startswith("sha256:")
    assert where.endswith("mini")
    lock = tmp_path / "lock.json"
    subprocess.run(
        [*run, "lock", "--source", str(checkout), "--out", str(tmp_path / "out"), "--lock", str(lock)], check=True
    )
    ok = subprocess.run([*run, "verify", "--out", str(tmp_path / "out"), "--lock", str(lock)], capture_output=True)
    assert ok.returncode == 0, ok.stderr
    lock.write_text(lock.read_text().replace(digest, "sha256:" + "1" * 64))
    bad = subprocess.run([*run, "verify", "--out", str(tmp_path / "out"), "--lock", str(lock)], capture_output=True)
    assert bad.returncode == 1
    assert b"the lock's sha256:111" in bad.stderr


def _images_cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ale.images", *argv], capture_output=True, text=True)


def _release_checkout(tmp_path: Path, lock_name: str | None = "R.json") -> tuple[Path, Path]:
    """The mini image's checkout with a release manifest ``R`` naming the lock ``lock_name``, built."""
    checkout, _path, cache = mini_image(tmp_path)
    release = {"schema": "ale-release-manifest/v1", "release": "R"}
    if lock_name is not None:
        release["images_lock"] = lock_name
    (checkout / "ale" / "releases" / "locks").mkdir(parents=True)
    (checkout / "ale" / "releases" / "R.json").write_text(json.dumps(release))
    out = tmp_path / "out"
    built = _images_cli("build", "--source", str(checkout), "--out", str(out), "--cache", str(cache), "--offline")
    assert built.returncode == 0, built.stderr
    return checkout, out


def test_lock_writes_the_lock_the_release_names(tmp_path: Path) -> None:
    checkout, out = _release_checkout(tmp_path)
    r = _images_cli("lock", "--source", str(checkout), "--out", str(out), "--release", "R")
    assert r.returncode == 0, r.stderr
    lock = checkout / "ale" / "releases" / "locks" / "R.json"
    assert sorted(attest.read_lock(lock)) == ["mini"]
    assert r.stdout.split()[0] == "mini"


def test_lock_check_says_in_one_line_that_a_stale_lock_is_stale_and_writes_nothing(tmp_path: Path) -> None:
    checkout, out = _release_checkout(tmp_path)
    common = ("--source", str(checkout), "--out", str(out), "--release", "R")
    assert _images_cli("lock", *common).returncode == 0
    fresh = _images_cli("lock", "--check", *common)
    assert fresh.returncode == 0, fresh.stderr
    lock = checkout / "ale" / "releases" / "locks" / "R.json"
    before = lock.read_bytes()
    (checkout / "evaluator" / "cli.py").write_text("def main():\n    return 1\n")  # code that enters the image
    cache = tmp_path / "cache"
    rebuilt = _images_cli("build", "--source", str(checkout), "--out", str(out), "--cache", str(cache), "--offline")
    assert rebuilt.returncode == 0, rebuilt.stderr
    stale = _images_cli("lock", "--check", *common)
    assert stale.returncode == 1
    assert len(stale.stderr.strip().splitlines()) == 1, stale.stderr
    assert "is stale: mini is sha256:" in stale.stderr
    assert "as built" in stale.stderr
    assert "run `make lock` and commit the lock" in stale.stderr
    assert lock.read_bytes() == before
    assert _images_cli("lock", *common).returncode == 0  # relocks what the lock holds
    assert _images_cli("lock", "--check", *common).returncode == 0


def test_lock_check_of_a_lock_that_is_not_one_says_so(tmp_path: Path) -> None:
    checkout, out = _release_checkout(tmp_path)
    lock = checkout / "ale" / "releases" / "locks" / "R.json"
    for text in ("", "{}", '{"format": "ale-images-lock/v1", "images": {"mini": 7}}'):
        lock.write_text(text)
        r = _images_cli("lock", "--check", "--source", str(checkout), "--out", str(out), "--release", "R", "mini")
        assert r.returncode == 1, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert "is stale" in r.stderr


def test_lock_for_a_release_naming_no_lock_is_refused(tmp_path: Path) -> None:
    checkout, out = _release_checkout(tmp_path, lock_name=None)
    r = _images_cli("lock", "--source", str(checkout), "--out", str(out), "--release", "R")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"ale: images lock: release R ({checkout / 'ale' / 'releases' / 'R.json'}) names no images lock (images_lock)"
    ]
    assert _images_cli("lock", "--source", str(checkout), "--out", str(out), "--release", "nope").returncode == 2


def test_the_images_commands_default_release_is_the_catalogs() -> None:
    from ale import catalog
    from ale.images.cli import DEFAULT_RELEASE

    assert DEFAULT_RELEASE == catalog.DEFAULT_RELEASE


def test_cli_errors_are_one_line(tmp_path: Path) -> None:
    checkout, _path, _cache = mini_image(tmp_path)
    r = subprocess.run(
        [sys.executable, "-m", "ale.images", "build", "nope", "--source", str(checkout)], capture_output=True, text=True
    )
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == ["ale: images build: no image definition 'nope'; defined: mini"]
    r = subprocess.run(
        [sys.executable, "-m", "ale.images", "build", "--source", str(checkout), "--cache", str(tmp_path / "none"),
         "--offline", "--out", str(tmp_path / "o")], capture_output=True, text=True,
    )  # fmt: skip
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1
    assert "not in the cache" in r.stderr


def test_ale_images_is_a_subcommand_of_ale() -> None:
    from ale.runner.cli import build_parser

    args = build_parser().parse_args(["images", "build", "--out", "x", "evaluator"])
    assert args.images == ["evaluator"]
    assert args.out == "x"


def test_the_writer_needs_only_the_standard_library(tmp_path: Path) -> None:
    """A Nix build runs the builder in a bare interpreter: no attrs, cattrs, orjson, grpc."""
    code = (
        "import sys, builtins\n"
        "real = builtins.__import__\n"
        "def guard(name, *a, **k):\n"
        "    if name.split('.')[0] in {'attrs', 'cattrs', 'orjson', 'grpc', 'numpy', 'rfc8785', 'trio'}:\n"
        "        raise ImportError('not in a bare interpreter: ' + name)\n"
        "    return real(name, *a, **k)\n"
        "builtins.__import__ = guard\n"
        "from ale.images.cli import main\n"
        f"sys.exit(main(['build', '--source', {str(tmp_path / 'checkout')!r}, '--out', {str(tmp_path / 'o')!r},"
        f" '--cache', {str(tmp_path / 'cache')!r}, '--offline']))\n"
    )
    mini_image(tmp_path)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert io.StringIO(r.stdout).read().startswith("mini sha256:")


@pytest.mark.parametrize("sub", ["build", "pin", "show", "lock", "verify", "attest"])
def test_every_images_subcommand_has_help_and_is_documented(sub: str) -> None:
    r = subprocess.run([sys.executable, "-m", "ale.images", sub, "--help"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.splitlines()) > 3
    docs = (Path(__file__).resolve().parents[1] / "docs" / "images.md").read_text()
    assert f"ale images {sub}" in docs


def test_docs_name_only_images_subcommands_that_exist() -> None:
    import re

    docs = (Path(__file__).resolve().parents[1] / "docs" / "images.md").read_text()
    named = set(re.findall(r"ale images ([a-z]+)", docs))
    assert named <= {"build", "pin", "show", "lock", "verify", "attest"}, named
