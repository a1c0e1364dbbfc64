"""``ale images attest``: each built image's provenance, an in-toto Statement with a SLSA v1
predicate (:mod:`ale.core.provenance`), from its layout, its definition and the checkout.

What the Statement says, and how each fact is established before it is written:

* **subject**: the image's name and manifest digest, read from its layout (the index's digest
  checked against the manifest's bytes, :mod:`ale.images.layout`);
* **externalParameters**: the definition's path and SHA-256 (the layout's label must be that
  SHA-256: a layout built from another version of the definition is refused) and the epoch;
* **resolvedDependencies**: every pinned ``.deb`` and wheel (URL, version, SHA-256, from the
  definition), every project file (its checkout path, its place in the image, its SHA-256) and
  the checkout's commit when it is a clean git work tree. The project files are those of the
  image: their layer is rebuilt from the checkout and must have the layout's digest, so a
  checkout edited since the build is refused;
* **runDetails**: the builder (``ale images build``: the project's version and commit) and the
  config and layer digests (byproducts).

No time is recorded: the same layout and checkout give the same Statement, byte for byte.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path
from typing import Any

from ale.core import provenance
from ale.images import layout
from ale.images.attest import AttestError, read_layout
from ale.images.build import LAYER_NAMES, deb_urls, project_files, project_tree
from ale.images.definition import Definition
from ale.images.tree import Store, write_tar


def _git(checkout: Path, *argv: str) -> str | None:
    if not (checkout / ".git").exists():
        return None
    try:
        out = subprocess.run(["git", "-C", str(checkout), *argv], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def clean_commit(checkout: Path) -> str | None:
    """The checkout's commit when it is a git work tree without changes to tracked files."""
    commit = _git(checkout, "rev-parse", "HEAD")
    status = _git(checkout, "status", "--porcelain", "--untracked-files=no")
    return commit if commit and status == "" else None


def project_layer_digest(defn: Definition, checkout: Path, epoch: int) -> str:
    """The project layer the checkout gives now, its entries dated ``epoch``."""
    store = Store()
    try:
        tree = project_tree(defn, project_files(defn, checkout), store)
        with open(os.devnull, "wb") as sink:
            sha, _size = write_tar(tree, store, sink, epoch)
    finally:
        store.close()
    return f"sha256:{sha}"


def _config_and_epoch(root: Path) -> tuple[str, int]:
    """The config blob's digest and the epoch of the layers (every entry's modification time)."""
    _digest, manifest = layout.read_manifest(root)
    config = manifest.get("config", {}).get("digest") if isinstance(manifest.get("config"), dict) else None
    if not isinstance(config, str):
        raise AttestError(f"{root}: the manifest has no config digest")
    last = layout.layer_paths(root)[-1]
    with last.open("rb") as f:
        header = f.read(512)
    try:  # the image layer's first entry (ustar: the modification time, octal, at 136)
        epoch = int(header[136:148].strip(b"\0 ") or b"0", 8)
    except ValueError:
        raise AttestError(f"{last}: not a tar layer") from None
    return config, epoch


def dependencies(defn: Definition, checkout: Path) -> list[provenance.Dependency]:
    """What the image was built from: pins, project files, the commit (when clean)."""
    deps = [
        provenance.Dependency(kind="deb", name=p.name, digest={"sha256": p.sha256},
                              uri=deb_urls(defn.debian, p)[0], version=p.version)
        for p in defn.debian.packages
    ]  # fmt: skip
    deps += [
        provenance.Dependency(kind="wheel", name=w.name, digest={"sha256": w.sha256}, uri=w.url, version=w.version)
        for w in defn.python.wheels
    ]
    for dest, src in project_files(defn, checkout):
        digest = {"sha256": _file_sha256(src)}
        deps.append(provenance.Dependency(kind="project", name=src.relative_to(checkout).as_posix(), digest=digest,
                                          path=dest))  # fmt: skip
    commit = clean_commit(checkout)
    if commit is not None:
        deps.append(provenance.Dependency(kind="source", name="checkout", digest={"gitCommit": commit}))
    return deps


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def builder_version(checkout: Path) -> dict[str, str]:
    from importlib import metadata

    try:
        version = metadata.version("ale-robotics")
    except metadata.PackageNotFoundError:
        version = "unknown"
    out = {"ale-robotics": version}
    commit = _git(checkout, "rev-parse", "HEAD")
    if commit:
        out["commit"] = commit
    return out


def image_provenance(defn: Definition, checkout: Path, root: Path) -> provenance.Provenance:
    """The provenance of the layout at ``root``, built from ``defn`` in ``checkout``."""
    entry = read_layout(root)
    if entry["definition_sha256"] != defn.sha256:
        raise AttestError(f"{root} was built from another version of {defn.source} (rebuild it: ale images build)")
    layers = list(entry["layers"])
    if len(layers) != len(LAYER_NAMES):
        raise AttestError(f"{root}: {len(layers)} layers, not the builder's {len(LAYER_NAMES)}")
    config, epoch = _config_and_epoch(root)
    project = LAYER_NAMES.index("project")
    if project_layer_digest(defn, checkout, epoch) != layers[project]:
        raise AttestError(f"{root}: its project layer is not the checkout's files as they are now (rebuild it)")
    try:
        rel = defn.source.resolve().relative_to(checkout.resolve()).as_posix()
    except ValueError:
        rel = defn.source.name
    return provenance.Provenance(
        name=defn.name,
        digest=str(entry["digest"]),
        definition_path=rel,
        definition_sha256=defn.sha256,
        epoch=epoch,
        dependencies=tuple(dependencies(defn, checkout)),
        config=config,
        layers=tuple(layers),
        builder_version=builder_version(checkout),
    )


def attest(defn: Definition, checkout: Path, root: Path, key: Any = None) -> dict[str, Any]:
    """The Statement of the layout at ``root`` (a dict), or with ``key`` (an Ed25519 private
    key) its signed DSSE envelope."""
    doc = provenance.statement(image_provenance(defn, checkout, root))
    return provenance.envelope(doc, key) if key is not None else doc
