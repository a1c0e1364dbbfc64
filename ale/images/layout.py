"""OCI image layouts (image-spec v1.1, "image-layout.md"): written here, read back by digest.

A layout is a folder: ``oci-layout``, ``index.json`` and ``blobs/sha256/<hex>``. Every JSON
document is written canonically (keys sorted, no whitespace; only strings and integers occur,
where this equals RFC 8785), and no document carries a time: the image config has no
``created`` and no ``history``. The layers are uncompressed tar archives
(``application/vnd.oci.image.layer.v1.tar``), so a layer's digest is its diff id and no
compressor's version can change a digest.

The **image digest** is the SHA-256 of the manifest's bytes (``sha256:...``), the digest a
registry, ``podman run IMAGE@sha256:...`` and the lock (:mod:`ale.images.attest`) use.
:func:`read_manifest_digest` reads it from a layout's ``index.json``, never from a daemon.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LAYOUT_VERSION = "1.0.0"
INDEX = "application/vnd.oci.image.index.v1+json"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"
CONFIG = "application/vnd.oci.image.config.v1+json"
LAYER = "application/vnd.oci.image.layer.v1.tar"
REF_NAME = "org.opencontainers.image.ref.name"
MAX_DOCUMENT = 4 * 1024 * 1024


class LayoutError(ValueError):
    """A folder that is not the OCI layout of one image (the message says what is wrong)."""


def canonical(value: Any) -> bytes:
    """Sorted keys, no whitespace, UTF-8: RFC 8785 for documents of strings and integers."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


@dataclass(frozen=True)
class Descriptor:
    media_type: str
    digest: str  # "sha256:<hex>"
    size: int

    def to_json(self) -> dict[str, Any]:
        return {"mediaType": self.media_type, "digest": self.digest, "size": self.size}


class LayoutWriter:
    """Writes blobs into ``root/blobs/sha256`` and, at the end, ``index.json`` and ``oci-layout``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.blobs = root / "blobs" / "sha256"
        self.blobs.mkdir(parents=True, exist_ok=True)

    def blob_file(self) -> tuple[int, Path]:
        """A temporary file in the blobs folder to write a large blob into (then :meth:`adopt`)."""
        fd, name = tempfile.mkstemp(prefix=".part-", dir=self.blobs)
        return fd, Path(name)

    def adopt(self, tmp: Path, sha256: str, size: int, media_type: str) -> Descriptor:
        os.replace(tmp, self.blobs / sha256)
        return Descriptor(media_type, f"sha256:{sha256}", size)

    def put(self, data: bytes, media_type: str) -> Descriptor:
        sha = hashlib.sha256(data).hexdigest()
        (self.blobs / sha).write_bytes(data)
        return Descriptor(media_type, f"sha256:{sha}", len(data))

    def finish(self, manifest: Descriptor, ref_name: str) -> None:
        entry = manifest.to_json() | {"annotations": {REF_NAME: ref_name}}
        index = {"schemaVersion": 2, "mediaType": INDEX, "manifests": [entry]}
        (self.root / "index.json").write_bytes(canonical(index))
        (self.root / "oci-layout").write_bytes(canonical({"imageLayoutVersion": LAYOUT_VERSION}))


def image_config(
    *,
    diff_ids: Sequence[str],
    user: str,
    env: Mapping[str, str],
    entrypoint: Sequence[str],
    cmd: Sequence[str],
    workdir: str,
    labels: Mapping[str, str],
) -> dict[str, Any]:
    """The image config (image-spec "config.md") without any time in it."""
    config: dict[str, Any] = {"User": user, "Env": [f"{k}={v}" for k, v in sorted(env.items())], "WorkingDir": workdir}
    if entrypoint:
        config["Entrypoint"] = list(entrypoint)
    if cmd:
        config["Cmd"] = list(cmd)
    if labels:
        config["Labels"] = dict(labels)
    return {
        "architecture": "amd64",
        "os": "linux",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": list(diff_ids)},
    }


def manifest(config: Descriptor, layers: Sequence[Descriptor], annotations: Mapping[str, str]) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "schemaVersion": 2,
        "mediaType": MANIFEST,
        "config": config.to_json(),
        "layers": [layer.to_json() for layer in layers],
    }
    if annotations:
        doc["annotations"] = dict(annotations)
    return doc


# --- reading ------------------------------------------------------------------------------------


def _document(path: Path, what: str) -> Any:
    # Imported here: writing a layout needs only the standard library (a bare interpreter in a
    # Nix build); reading one back is the runner's and the tests' business.
    from ale.core.parse import ParseError, parse_json

    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise LayoutError(f"{what}: cannot read {path}: {exc.strerror}") from None
    try:
        return parse_json(raw, what=what, max_bytes=MAX_DOCUMENT)
    except ParseError as exc:
        raise LayoutError(str(exc)) from None


def _blob_path(root: Path, digest: object, what: str) -> Path:
    if not isinstance(digest, str) or not digest.startswith("sha256:") or len(digest) != 71:
        raise LayoutError(f"{what}: {digest!r} is not a sha256 digest")
    hex_part = digest[7:]
    if any(c not in "0123456789abcdef" for c in hex_part):
        raise LayoutError(f"{what}: {digest!r} is not a sha256 digest")
    return root / "blobs" / "sha256" / hex_part


def _verified_blob(root: Path, descriptor: object, what: str) -> bytes:
    if not isinstance(descriptor, dict):
        raise LayoutError(f"{what}: a descriptor must be an object")
    path = _blob_path(root, descriptor.get("digest"), what)
    try:
        data = path.read_bytes() if path.stat().st_size <= MAX_DOCUMENT else b""
    except OSError:
        raise LayoutError(f"{what}: blob {descriptor.get('digest')} is missing") from None
    if not data or f"sha256:{hashlib.sha256(data).hexdigest()}" != descriptor["digest"]:
        raise LayoutError(f"{what}: blob {descriptor['digest']} does not have that digest")
    if descriptor.get("size") != len(data):
        raise LayoutError(f"{what}: blob {descriptor['digest']} is {len(data)} bytes, not {descriptor.get('size')}")
    return data


def read_manifest_digest(root: Path) -> str:
    """The digest of the one image manifest in the layout at ``root``, checked against its bytes."""
    layout = _document(root / "oci-layout", "oci-layout")
    if not isinstance(layout, dict) or layout.get("imageLayoutVersion") != LAYOUT_VERSION:
        raise LayoutError(f"{root}: oci-layout is not imageLayoutVersion {LAYOUT_VERSION}")
    index = _document(root / "index.json", "index.json")
    manifests = index.get("manifests") if isinstance(index, dict) else None
    if not isinstance(manifests, list) or len(manifests) != 1:
        raise LayoutError(f"{root}: index.json must list exactly one manifest")
    entry = manifests[0]
    if not isinstance(entry, dict) or entry.get("mediaType") != MANIFEST:
        raise LayoutError(f"{root}: the index entry is not an OCI image manifest")
    _verified_blob(root, entry, "index.json")
    return str(entry["digest"])


def read_manifest(root: Path) -> tuple[str, dict[str, Any]]:
    """The manifest's digest and document."""
    digest = read_manifest_digest(root)
    doc = _document(_blob_path(root, digest, "manifest"), "manifest")
    if not isinstance(doc, dict):
        raise LayoutError(f"{root}: the manifest is not an object")
    return digest, doc


def layer_paths(root: Path) -> list[Path]:
    """The layer blobs of the image, lowest first."""
    _digest, doc = read_manifest(root)
    layers = doc.get("layers")
    if not isinstance(layers, list):
        raise LayoutError(f"{root}: the manifest has no layers list")
    return [_blob_path(root, layer.get("digest") if isinstance(layer, dict) else None, "layer") for layer in layers]
