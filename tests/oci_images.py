"""The OCI runtimes' tests: the real images built once per test session, locked, and pointed at.

:func:`prepare` makes the registered ``podman`` and ``docker`` backends usable as
``runtimes.make(name)`` makes them (their defaults come from ``ALE_IMAGES_DIR`` and
``ALE_IMAGES_LOCK``): it builds both images from the download cache shared with
test_images_repro.py into one temporary folder, writes their lock, and sets the two variables
(and ``CONTAINERS_CONF`` to .ci/containers.conf when unset, which rootful podman on Debian 12
needs). It returns why a backend cannot run here instead (the tests then skip, or fail in CI:
sandbox_tools.missing).
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OCI = ("podman", "docker")


RUN_IMAGES = ("agent-base", "evaluator")  # what a run runs: the release's lock holds these


@functools.cache
def built_images() -> dict[str, Any] | str:
    """Both images a run runs, built here once per test session (``ale.images.build.Built`` by name;
    tests/test_images_repro.py takes them as its first builds), or why they cannot be."""
    from ale.images import definition
    from ale.images.build import build_image
    from ale.images.fetch import FetchError, default_cache

    out = Path(tempfile.mkdtemp(prefix="ale-oci-images-"))
    atexit.register(shutil.rmtree, out, ignore_errors=True)
    cache = Path(os.environ.get("ALE_IMAGES_CACHE") or default_cache())
    found = {}
    try:
        for name in RUN_IMAGES:
            defn = definition.load(ROOT / "images" / f"{name}.toml")
            found[name] = build_image(defn, ROOT, out / name, cache, log=lambda _line: None)
    except FetchError as exc:
        return f"the images' pinned downloads are neither cached nor reachable: {exc}"
    return found


@functools.cache
def built() -> tuple[Path, Path] | str:
    """(layouts folder, lock file) of both images built here, or why they cannot be."""
    from ale.images import attest

    images = built_images()
    if isinstance(images, str):
        return images
    out = images[RUN_IMAGES[0]].layout.parent
    lock = out / "images.lock.json"
    attest.write_lock(lock, attest.lock_document(list(images.values()))["images"])
    return out, lock


def docker_engine() -> str | None:
    """None when the docker CLI reaches an engine (``DOCKER_HOST``), else why not."""
    if shutil.which("docker") is None:
        return "the docker CLI is not installed (apt-get install docker.io)"
    probe = subprocess.run(["docker", "version", "--format", "{{.Server.Version}}"], capture_output=True, text=True)
    if probe.returncode != 0:
        return (
            "the docker CLI reaches no engine (start `podman system service --time=0 unix:///run/ale/podman.sock` "
            f"and set DOCKER_HOST=unix:///run/ale/podman.sock): {probe.stderr.strip()[-200:]}"
        )
    return None


def prepare(name: str) -> str | None:
    """Ready the OCI backend ``name`` to be made by the registry; None, or why it cannot run here."""
    if name not in OCI:
        return None
    if shutil.which("podman") is None or shutil.which("skopeo") is None:
        return "podman and skopeo are not installed (apt-get install podman runc skopeo)"
    if os.geteuid() != 0:
        return "the OCI runtimes need root (a rootful engine)"
    os.environ.setdefault("CONTAINERS_CONF", str(ROOT / ".ci" / "containers.conf"))
    if name == "docker" and (why := docker_engine()) is not None:
        return why
    found = built()
    if isinstance(found, str):
        return found
    layouts, lock = found
    os.environ["ALE_IMAGES_DIR"], os.environ["ALE_IMAGES_LOCK"] = str(layouts), str(lock)
    return None
