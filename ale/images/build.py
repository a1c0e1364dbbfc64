"""Building an image from its definition into an OCI layout, the same bytes on every build.

1. **Fetch** every pinned ``.deb`` and wheel into the cache (:mod:`ale.images.fetch`), checking
   each SHA-256; offline, only the cache is used.
2. **debian** layer: the packages unpacked in name order (:mod:`ale.images.debian`), the root's
   merged-/usr symlinks, ``/var/lib/dpkg/status``.
3. **python** layer: the wheels installed under the definition's ``site`` (:mod:`ale.images.wheels`).
4. **project** layer: the checkout's files the definition names (only files git tracks, when
   the checkout is a git work tree), top folders renamed to their import names.
5. **image** layer: ``/etc/passwd`` and ``/etc/group`` with root and the image's user, the
   definition's folders and symlinks.
6. **Layout**: each layer an uncompressed tar (:mod:`ale.images.tree`), the config and the
   manifest canonical JSON without times (:mod:`ale.images.layout`).

Nothing of the machine reaches the bytes: not the build folder, the cache's place, the time,
the user, the umask or the order a folder lists its files in. Every entry's modification time
is ``epoch`` (``SOURCE_DATE_EPOCH``, else 0).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ale.images import debian, layout, wheels
from ale.images.definition import Debian, DebianPackage, Definition
from ale.images.fetch import fetch
from ale.images.tree import Store, Tree, TreeError

DEFAULT_EPOCH = 0
SNAPSHOT_URL = "https://snapshot.debian.org/archive"
DEFINITION_LABEL = "org.ale-robotics.image.definition.sha256"
LAYER_NAMES = ("debian", "python", "project", "image")


class BuildError(RuntimeError):
    """The image cannot be built; the message says which step and why."""


@dataclass(frozen=True)
class Layer:
    name: str
    digest: str
    size: int
    files: int


@dataclass(frozen=True)
class Built:
    name: str
    layout: Path
    digest: str  # the manifest's: the image digest
    layers: tuple[Layer, ...]
    definition_sha256: str
    epoch: int
    seconds: float


def source_date_epoch() -> int:
    """``SOURCE_DATE_EPOCH`` from the environment, else :data:`DEFAULT_EPOCH`."""
    raw = os.environ.get("SOURCE_DATE_EPOCH", "")
    if not raw:
        return DEFAULT_EPOCH
    if not raw.isdigit() or int(raw) >= 8**11:
        raise BuildError(f"SOURCE_DATE_EPOCH={raw!r} is not a time in seconds")
    return int(raw)


def deb_urls(d: Debian, pkg: DebianPackage) -> list[str]:
    """Where a pinned package is fetched from: its mirror, then snapshot.debian.org."""
    return [f"{d.archives[pkg.archive]}/{pkg.path}", f"{SNAPSHOT_URL}/{pkg.archive}/{d.snapshot}/{pkg.path}"]


def fetch_all(defn: Definition, cache: Path, *, offline: bool) -> tuple[list[Path], list[Path]]:
    """The definition's .debs and wheels, from the cache or their URLs."""
    debs = [
        fetch(deb_urls(defn.debian, p), p.sha256, cache, offline=offline, what=f"{p.name} {p.version}")
        for p in defn.debian.packages
    ]
    whls = [fetch([w.url], w.sha256, cache, offline=offline, what=f"{w.name} {w.version}") for w in defn.python.wheels]
    return debs, whls


def debian_tree(defn: Definition, debs: Sequence[Path], store: Store) -> Tree:
    tree = Tree()
    debian.add_merged_usr_links(tree)
    controls: dict[str, bytes] = {}
    for pkg, deb in zip(defn.debian.packages, debs, strict=True):
        origin = f"{pkg.name} {pkg.version}"
        controls[pkg.name] = debian.unpack(
            deb, tree, store, origin=origin, drop=defn.debian.drop, keep=defn.debian.keep
        )
    sha, size = store.put_bytes(debian.status_file(controls))
    tree.add_file("var/lib/dpkg/status", sha, size, 0o644, "dpkg status")
    tree.settle_hardlinks()
    return tree


def python_tree(defn: Definition, whls: Sequence[Path], store: Store) -> Tree:
    tree = Tree()
    tree.add_dir(defn.python.site)
    for wheel, path in zip(defn.python.wheels, whls, strict=True):
        wheels.install(
            path,
            tree,
            store,
            site=defn.python.site,
            bin_dir=defn.python.bin,
            python=defn.python.version,
            origin=f"{wheel.name} {wheel.version}",
        )
    return tree


def _tracked(checkout: Path) -> set[str] | None:
    """The files git tracks in ``checkout``, or None when it is not a git work tree."""
    if not (checkout / ".git").exists():
        return None
    try:
        out = subprocess.run(
            ["git", "-C", str(checkout), "ls-files", "-z"], check=True, capture_output=True, timeout=60
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise BuildError(f"{checkout} is a git work tree, but `git ls-files` failed: {exc}") from None
    return {p for p in out.decode("utf-8").split("\0") if p}


def project_files(defn: Definition, checkout: Path) -> list[tuple[str, Path]]:
    """(path in the image, file in the checkout) for each file the definition names, sorted."""
    tracked = _tracked(checkout)
    found: dict[str, Path] = {}
    for pattern in defn.project.files:
        matches = sorted(
            p
            for p in checkout.glob(pattern)
            if p.is_file() and (tracked is None or p.relative_to(checkout).as_posix() in tracked)
        )
        if not matches:
            raise BuildError(f"{defn.source}: project.files {pattern!r} names no file of {checkout}")
        for p in matches:
            rel = p.relative_to(checkout).as_posix()
            top, _, rest = rel.partition("/")
            renamed = f"{defn.project.rename.get(top, top)}/{rest}" if rest else rel
            found[f"{defn.python.site}/{renamed}"] = p
    return sorted(found.items())


def project_tree(defn: Definition, files: Sequence[tuple[str, Path]], store: Store) -> Tree:
    tree = Tree()
    for dest, source in files:
        sha, size = store.put_file(source)
        tree.add_file(dest, sha, size, source.stat().st_mode, "the checkout")
    return tree


def image_tree(defn: Definition, store: Store) -> Tree:
    tree = Tree()
    u = defn.user
    passwd = f"root:x:0:0:root:/root:/bin/sh\n{u.name}:x:{u.uid}:{u.gid}:{u.name}:{u.home}:/bin/sh\n"
    group = f"root:x:0:\n{u.name}:x:{u.gid}:\n"
    for path, text in (("etc/passwd", passwd), ("etc/group", group)):
        sha, size = store.put_bytes(text.encode())
        tree.add_file(path, sha, size, 0o644, "the image's users")
    if u.home != "/":
        tree.add_dir(u.home)
    for folder in defn.folders:
        tree.add_dir(folder.path, folder.mode, "files.folders")
    for path, target in sorted(defn.symlinks.items()):
        tree.add_symlink(path, target, "files.symlinks")
    for path, text in sorted(defn.texts.items()):
        sha, size = store.put_bytes(text.encode("utf-8"))
        tree.add_file(path, sha, size, 0o644, "files.text")
    return tree


def _write_layer(writer: layout.LayoutWriter, tree: Tree, store: Store, epoch: int, name: str) -> Layer:
    from ale.images.tree import write_tar

    fd, tmp = writer.blob_file()
    with os.fdopen(fd, "wb") as out:
        sha, size = write_tar(tree, store, out, epoch)
    writer.adopt(tmp, sha, size, layout.LAYER)
    return Layer(name=name, digest=f"sha256:{sha}", size=size, files=len(tree.entries))


def _fresh(out: Path) -> Path:
    """A new temporary folder beside ``out``, where the layout is written before it replaces ``out``."""
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.exists() and (not out.is_dir() or (not (out / "oci-layout").is_file() and any(out.iterdir()))):
        raise BuildError(f"{out} exists and is not an OCI layout: not replacing it")
    return Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))


def build_image(
    defn: Definition,
    checkout: Path,
    out: Path,
    cache: Path,
    *,
    offline: bool = False,
    epoch: int | None = None,
    log: Callable[[str], None] | None = None,
) -> Built:
    """Build ``defn`` into the OCI layout folder ``out`` (replaced if it holds a layout)."""
    say = log or (lambda line: print(line, file=sys.stderr))
    epoch = source_date_epoch() if epoch is None else epoch
    start = time.monotonic()
    debs, whls = fetch_all(defn, cache, offline=offline)
    say(f"{defn.name}: {len(debs)} Debian packages and {len(whls)} wheels at hand")
    files = project_files(defn, checkout)
    tmp = _fresh(out)
    store = Store(parent=tmp)
    try:
        writer = layout.LayoutWriter(tmp / "layout")
        steps: list[tuple[str, Callable[[], Tree]]] = [
            ("debian", lambda: debian_tree(defn, debs, store)),
            ("python", lambda: python_tree(defn, whls, store)),
            ("project", lambda: project_tree(defn, files, store)),
            ("image", lambda: image_tree(defn, store)),
        ]
        layers = []
        for name, make in steps:
            try:
                tree = make()
            except (TreeError, debian.DebError, wheels.WheelError) as exc:
                raise BuildError(f"{defn.name}: {name} layer: {exc}") from None
            layers.append(_write_layer(writer, tree, store, epoch, name))
            say(f"{defn.name}: {name} layer {layers[-1].digest[:19]}... {layers[-1].size} bytes")
        digest = _finish(defn, writer, layers)
        store.close()
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp / "layout", out)
    finally:
        store.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return Built(
        name=defn.name,
        layout=out,
        digest=digest,
        layers=tuple(layers),
        definition_sha256=defn.sha256,
        epoch=epoch,
        seconds=time.monotonic() - start,
    )


def _finish(defn: Definition, writer: layout.LayoutWriter, layers: Sequence[Layer]) -> str:
    u = defn.user
    config = layout.image_config(
        diff_ids=[layer.digest for layer in layers],
        user=f"{u.uid}:{u.gid}",
        env=defn.env,
        entrypoint=defn.entrypoint,
        cmd=defn.cmd,
        workdir=defn.workdir,
        labels={**defn.labels, DEFINITION_LABEL: defn.sha256},
    )
    config_desc = writer.put(layout.canonical(config), layout.CONFIG)
    layer_descs = [layout.Descriptor(layout.LAYER, layer.digest, layer.size) for layer in layers]
    manifest_desc = writer.put(layout.canonical(layout.manifest(config_desc, layer_descs, {})), layout.MANIFEST)
    writer.finish(manifest_desc, defn.name)
    return manifest_desc.digest
