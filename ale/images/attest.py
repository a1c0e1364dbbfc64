"""What an image is, for the lock file and the bundle manifest; checking built layouts against it.

* :func:`describe`: a definition as the plain data both builders fetch and copy (the
  ``.deb`` and wheel URLs with their SHA-256, the project files, the config). ``flake.nix``
  computes the same document from the same TOML (``lib.imageDescriptions``); a test holds
  the two equal, so the Nix build fetches exactly what the plain build fetches.
* **The lock** (``ale images lock``, default ``images/images.lock.json``): each image's manifest
  digest read from its OCI layout (never a daemon's image id), the SHA-256 of the definition it
  was built from (the image carries it as a label, and the lock refuses a layout built from
  another definition) and its layer digests. A release names a lock; ``ale images verify``
  rebuilds' check.
* :func:`image_attestation`: the ``images`` member an OCI runtime adds to its
  ``attestation()`` (docs/images.md, "Attestation"): what ran, by digest.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ale.images import layout
from ale.images.build import DEFINITION_LABEL, SNAPSHOT_URL, Built, deb_urls
from ale.images.definition import Definition

LOCK_FORMAT = "ale-images-lock/v1"
MAX_LOCK = 1024 * 1024


class AttestError(ValueError):
    """A lock or a layout that does not say what it must (the message says which)."""


def describe(defn: Definition) -> dict[str, Any]:
    """The definition as the builders use it (the document ``flake.nix`` computes too)."""
    d, p = defn.debian, defn.python
    return {
        "name": defn.name,
        "user": f"{defn.user.uid}:{defn.user.gid}",
        "entrypoint": list(defn.entrypoint),
        "cmd": list(defn.cmd),
        "workdir": defn.workdir,
        "env": dict(defn.env),
        "debs": [{"name": k.name, "sha256": k.sha256, "urls": deb_urls(d, k)} for k in d.packages],
        "wheels": [{"name": w.name, "sha256": w.sha256, "url": w.url} for w in p.wheels],
        "project": {"files": list(defn.project.files), "rename": dict(defn.project.rename)},
        "texts": dict(defn.texts),
        "snapshot_url": SNAPSHOT_URL,
    }


def _entry(digest: str, definition_sha256: str, layers: Iterable[str]) -> dict[str, Any]:
    return {"digest": digest, "definition_sha256": definition_sha256, "layers": list(layers)}


def lock_document(built: Sequence[Built]) -> dict[str, Any]:
    """The lock for freshly built images."""
    images = {b.name: _entry(b.digest, b.definition_sha256, [layer.digest for layer in b.layers]) for b in built}
    return {"format": LOCK_FORMAT, "images": images}


def _label(root: Path, manifest: Mapping[str, Any]) -> str:
    config = manifest.get("config")
    if not isinstance(config, dict):
        raise AttestError(f"{root}: the manifest has no config")
    raw = (root / "blobs" / "sha256" / str(config.get("digest", "")).removeprefix("sha256:")).read_bytes()
    if f"sha256:{hashlib.sha256(raw).hexdigest()}" != config.get("digest"):
        raise AttestError(f"{root}: the config blob does not have its digest")
    from ale.core.parse import ParseError, parse_json

    try:
        doc = parse_json(raw, what="image config")
    except ParseError as exc:
        raise AttestError(str(exc)) from None
    labels = doc.get("config", {}).get("Labels", {}) if isinstance(doc, dict) else {}
    value = labels.get(DEFINITION_LABEL) if isinstance(labels, dict) else None
    if not isinstance(value, str):
        raise AttestError(f"{root}: the image has no {DEFINITION_LABEL} label: not built by ale images build")
    return value


def read_layout(root: Path) -> dict[str, Any]:
    """The lock entry of the layout at ``root``, read from its index, manifest and config."""
    try:
        digest, manifest = layout.read_manifest(root)
        layers = [str(x.get("digest")) for x in manifest.get("layers", []) if isinstance(x, dict)]
        return _entry(digest, _label(root, manifest), layers)
    except (layout.LayoutError, OSError) as exc:
        raise AttestError(f"{root}: {exc}") from None


def read_lock_entries(out: Path, defns: Sequence[Definition]) -> dict[str, dict[str, Any]]:
    """Lock entries for the layouts under ``out`` of these definitions (each built from the definition as it is now)."""
    entries = {}
    for defn in defns:
        entry = read_layout(out / defn.name)
        if entry["definition_sha256"] != defn.sha256:
            raise AttestError(
                f"{out / defn.name} was built from another version of {defn.source} (rebuild it: ale images build)"
            )
        entries[defn.name] = entry
    return entries


def lock_text(entries: Mapping[str, Mapping[str, Any]]) -> str:
    """The lock file's text for these entries (the same entries give the same bytes)."""
    doc = {"format": LOCK_FORMAT, "images": {k: dict(v) for k, v in sorted(entries.items())}}
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def write_lock(path: Path, entries: Mapping[str, Mapping[str, Any]]) -> None:
    path.write_text(lock_text(entries), encoding="utf-8")


def lock_difference(path: Path, entries: Mapping[str, Mapping[str, Any]]) -> str | None:
    """None when the lock file ``path`` holds exactly ``entries`` (as :func:`write_lock` writes
    them), else the first difference in one sentence."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        return f"{path} cannot be read ({exc.strerror})"
    if raw == lock_text(entries).encode("utf-8"):
        return None
    try:
        locked = read_lock(path)
    except AttestError as exc:
        return str(exc)
    for name in sorted(set(entries) | set(locked)):
        built, held = entries.get(name), locked.get(name)
        if built is None or held is None:
            return f"{name} is {'in the lock but not built' if built is None else 'built but not in the lock'}"
        if built != held:  # the digest covers the rest (the config's definition label, the layers)
            return f"{name} is {built.get('digest')} as built, {held.get('digest')} in the lock"
    return "its bytes are not what ale images lock writes (rewrite it)"


def read_lock(path: Path) -> dict[str, dict[str, Any]]:
    """The images of a lock file, checked for shape."""
    from ale.core.parse import ParseError, parse_json

    try:
        doc = parse_json(path.read_bytes(), what=str(path), max_bytes=MAX_LOCK)
    except OSError as exc:
        raise AttestError(f"cannot read the lock {path}: {exc.strerror}") from None
    except ParseError as exc:
        raise AttestError(str(exc)) from None
    if not isinstance(doc, dict) or doc.get("format") != LOCK_FORMAT or not isinstance(doc.get("images"), dict):
        raise AttestError(f"{path}: not an {LOCK_FORMAT} document")
    images: dict[str, dict[str, Any]] = {}
    for name, entry in doc["images"].items():
        digest = entry.get("digest") if isinstance(entry, dict) else None
        if not isinstance(digest, str) or not digest.startswith("sha256:") or len(digest) != 71:
            raise AttestError(f"{path}: images.{name}.digest is not a sha256 digest")
        images[name] = entry
    return images


def verify_layouts(lock: Path, out: Path) -> list[tuple[str, str]]:
    """(name, digest) of each locked image whose layout under ``out`` has the locked digest; else AttestError."""
    checked = []
    for name, entry in sorted(read_lock(lock).items()):
        found = read_layout(out / name)
        if found["digest"] != entry["digest"]:
            raise AttestError(f"{name}: the layout's digest is {found['digest']}, the lock's {entry['digest']}")
        checked.append((name, str(found["digest"])))
    return checked


def image_attestation(lock: Path, out: Path) -> dict[str, Any]:
    """The ``images`` document an OCI runtime adds to its attestation: each image that runs, by
    the digest read from its layout and checked against the lock, and the lock's own SHA-256."""
    verified = dict(verify_layouts(lock, out))
    entries = read_lock(lock)
    return {
        "lock_sha256": hashlib.sha256(lock.read_bytes()).hexdigest(),
        "images": {
            name: {"digest": digest, "definition_sha256": entries[name].get("definition_sha256")}
            for name, digest in sorted(verified.items())
        },
    }
