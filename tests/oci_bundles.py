"""Bundles and release files of OCI runs for the verifier's tests, without running an engine: a real
``ale run`` bundle (tests/verifier_helpers.py) whose manifest is made an OCI runtime's, as a forger
would make it (every digest resealed); images locks and provenance statements for its digests."""

from __future__ import annotations

from typing import Any

import verifier_helpers as h
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ale.core import provenance
from ale.core.canonical import canonical_json
from ale.images import attest

EVALUATOR, AGENT = "sha256:" + "e1" * 32, "sha256:" + "a9" * 32
LOCK = "4c" * 32  # the lock's SHA-256 the bundle names
DEFINITION = "de" * 32  # each test image's definition SHA-256
LAYERS = ("sha256:" + "1a" * 32, "sha256:" + "2b" * 32)


def lock_bytes(images: dict[str, str]) -> bytes:
    """An images lock (as ale images lock writes it) of images with these digests."""
    entries = {n: {"digest": d, "definition_sha256": DEFINITION, "layers": list(LAYERS)} for n, d in images.items()}
    return attest.lock_text(entries).encode()


def as_oci(files: dict[str, bytes], *, evaluator: str = EVALUATOR, agent: str = AGENT, **code: str) -> dict[str, bytes]:
    """The run's manifest as the podman runtime writes it (every digest resealed, no signature)."""

    def change(manifest: dict[str, Any]) -> None:
        manifest["runtime"].update(
            runtime="podman",
            sandbox="podman",
            engine={
                "name": "podman",
                "version": "4.3.1",
                "server": "podman 4.3.1",
                "oci_runtime": "runc version 1.1.5",
            },
            images={
                "lock_sha256": LOCK,
                "images": {
                    "agent-base": {"digest": agent, "definition_sha256": DEFINITION},
                    "evaluator": {"digest": evaluator, "definition_sha256": DEFINITION},
                },
            },
            code={
                "kind": "oci-images",
                "note": "the images that ran",
                "evaluator_image_sha256": code.get("evaluator_hex", evaluator[7:]),
                "agent_image_sha256": code.get("agent_hex", agent[7:]),
                "images_lock_sha256": code.get("lock", LOCK),
            },
        )

        manifest["agent"]["environment"] = image_environment(agent)

    return h.edit(files, "manifest.json", change)


def image_environment(digest: str = AGENT) -> dict[str, Any]:
    """The manifest's ``agent.environment`` of an OCI run: the agent image's own Python."""
    return {
        "image": {"name": "agent-base", "digest": digest},
        "python": {
            "executable": "/ale/python/bin/python3",
            "version": "3.11.2",
            "package": "python3.11-minimal 3.11.2-6",
        },
        "modules": ["ale", "ale.client"],
        "distributions": ["grpcio==1.85.3", "numpy==2.4.6"],
    }


def statement(
    name: str, digest: str, *, definition: str = DEFINITION, layers: tuple[str, ...] = LAYERS
) -> dict[str, Any]:
    """An in-toto Statement of the shape ``ale images attest`` writes, for image ``name`` at ``digest``."""
    deb = provenance.Dependency(
        kind="deb", name="python3.11-minimal", digest={"sha256": "0d" * 32},
        uri="http://deb.debian.org/debian/pool/main/p/python3.11/python3.11-minimal_3.11.2-6_amd64.deb",
        version="3.11.2-6",
    )  # fmt: skip
    return provenance.statement(
        provenance.Provenance(
            name=name, digest=digest, definition_path=f"images/{name}.toml", definition_sha256=definition, epoch=0,
            dependencies=(deb,), config="sha256:" + "c0" * 32, layers=layers, builder_version={"ale-robotics": "0.1.0"},
        )
    )  # fmt: skip


def signed(doc: dict[str, Any], key: Ed25519PrivateKey) -> bytes:
    """``doc`` in a DSSE envelope signed with ``key``, as ``ale images attest --key`` writes it."""
    return canonical_json(provenance.envelope(doc, key)) + b"\n"
