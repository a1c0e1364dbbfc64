"""The layer tree and its tar form: normalised metadata, sorted entries, the same bytes every time."""

from __future__ import annotations

import io
import random
import tarfile
from pathlib import Path

import pytest

from ale.images.tree import Store, Tree, TreeError, normalise, write_tar


@pytest.fixture
def store(tmp_path: Path) -> Store:
    s = Store(parent=tmp_path)
    yield s
    s.close()


def _tar(tree: Tree, store: Store, mtime: int = 0) -> bytes:
    out = io.BytesIO()
    write_tar(tree, store, out, mtime)
    return out.getvalue()


def _sample(store: Store, order: list[int]) -> Tree:
    """The same entries added in the given order."""
    items = [
        ("usr/bin/tool", b"#!/bin/sh\necho hi\n", 0o4755),
        ("usr/lib/libx.so.1", b"\x7fELF...", 0o644),
        ("etc/conf", b"key=value\n", 0o600),
        ("a-b/c", b"dash sorts before slash", 0o664),
        ("a/b", b"slash", 0o644),
    ]
    tree = Tree()
    for i in order:
        path, body, mode = items[i]
        sha, size = store.put_bytes(body)
        tree.add_file(path, sha, size, mode, "test")
    tree.add_symlink("usr/lib/libx.so", "libx.so.1")
    tree.add_dir("tmp", 0o1777)
    return tree


def test_same_entries_in_any_order_give_the_same_bytes(store: Store) -> None:
    reference = _tar(_sample(store, [0, 1, 2, 3, 4]), store)
    for seed in range(5):
        order = [0, 1, 2, 3, 4]
        random.Random(seed).shuffle(order)
        assert _tar(_sample(store, order), store) == reference


def test_tar_entries_are_sorted_and_normalised(store: Store) -> None:
    data = _tar(_sample(store, [0, 1, 2, 3, 4]), store, mtime=1234)
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        members = tf.getmembers()
        names = [m.name for m in members]
        assert names == sorted(names, key=lambda n: n.encode())
        assert names.index("a") < names.index("a-b") < names.index("a/b")  # byte order, parents first
        for m in members:
            assert (m.uid, m.gid, m.uname, m.gname, m.mtime) == (0, 0, "", "", 1234)
            assert not m.mode & 0o6000, f"{m.name} keeps a setuid/setgid bit"
        modes = {m.name: m.mode for m in members}
        assert modes["usr/bin/tool"] == 0o755  # setuid dropped, executable kept
        assert modes["etc/conf"] == 0o644  # 0600 made readable
        assert modes["a-b/c"] == 0o644  # group write dropped
        assert modes["tmp"] == 0o1777
        assert tf.extractfile("a/b").read() == b"slash"  # type: ignore[union-attr]


def test_tar_of_the_same_tree_is_identical_to_pythons_reading_of_it(store: Store) -> None:
    """Our header writer produces archives tarfile reads back, with the checksum right."""
    tree = _sample(store, [4, 3, 2, 1, 0])
    data = _tar(tree, store)
    assert len(data) % 512 == 0
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        assert len(tf.getmembers()) == len(tree.entries)


def test_long_names_and_link_targets_get_pax_records(store: Store) -> None:
    tree = Tree()
    long_path = "usr/share/" + "/".join(["d" * 40] * 4) + "/file.txt"
    long_target = "../" * 40 + "target"
    sha, size = store.put_bytes(b"x")
    tree.add_file(long_path, sha, size, 0o644)
    tree.add_symlink("usr/link", long_target)
    with tarfile.open(fileobj=io.BytesIO(_tar(tree, store))) as tf:
        names = {m.name: m for m in tf.getmembers()}
    assert long_path in names
    assert names["usr/link"].linkname == long_target


def test_hardlinks_point_at_the_first_path_in_tar_order(store: Store) -> None:
    tree = Tree()
    sha, size = store.put_bytes(b"git binary")
    tree.add_file("usr/lib/git-core/git", sha, size, 0o755)
    tree.add_hardlink("usr/lib/git-core/git-add", "usr/lib/git-core/git")
    tree.add_hardlink("usr/bin/git", "usr/lib/git-core/git")  # sorts before its target
    tree.settle_hardlinks()
    assert tree.entries["usr/bin/git"].kind == "file"
    assert tree.entries["usr/lib/git-core/git"].target == "usr/bin/git"
    with tarfile.open(fileobj=io.BytesIO(_tar(tree, store))) as tf:
        seen: set[str] = set()
        for m in tf.getmembers():
            if m.islnk():
                assert m.linkname in seen, f"{m.name} links to {m.linkname}, which comes later"
                assert m.mode == 0o755
            seen.add(m.name)


def test_hardlink_to_a_missing_file_is_refused(store: Store) -> None:
    tree = Tree()
    tree.add_hardlink("usr/bin/a", "usr/bin/nothing")
    with pytest.raises(TreeError, match="not a file here"):
        tree.settle_hardlinks()


def test_two_sources_disagreeing_about_a_path_is_an_error(store: Store) -> None:
    tree = Tree()
    a, n = store.put_bytes(b"one")
    b, m = store.put_bytes(b"two")
    tree.add_file("etc/x", a, n, 0o644, "pkg-a")
    tree.add_file("etc/x", a, n, 0o644, "pkg-b")  # identical: fine
    with pytest.raises(TreeError, match="pkg-c"):
        tree.add_file("etc/x", b, m, 0o644, "pkg-c")
    with pytest.raises(TreeError, match="is a file"):
        tree.add_file("etc/x/y", a, n, 0o644, "pkg-d")


@pytest.mark.parametrize("bad", ["", "/", ".", "../etc/passwd", "usr/../../x", "a/\0b"])
def test_paths_leaving_the_image_are_refused(bad: str) -> None:
    with pytest.raises(TreeError):
        normalise(bad)


def test_paths_are_normalised() -> None:
    assert normalise("./usr//bin/./x/") == "usr/bin/x"
    assert normalise("/etc/passwd") == "etc/passwd"
