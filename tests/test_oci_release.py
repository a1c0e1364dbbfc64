"""The reference release on a real podman, end to end: its lock (ale/releases/locks/2026.11.json)
is what the images of this checkout build, a run of it on other images is refused before anything
runs, and a run on its own images, signed by a registered runner whose provenance statements the
site registered, is ``officially_verified``, its manifest naming the agent container's Python.

Slow: the images are built once per session (tests/oci_images.py, shared with
tests/test_images_repro.py, which fails in one line when the committed lock is stale), a live
verifier, podman. CI installs what they need (``ALE_SITE_TOOLS_REQUIRED=1``: a missing tool fails)."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest
import verifier_helpers as h
from oci_images import built_images, prepare
from sandbox_tools import missing

from ale import catalog
from ale.core import bundle as codec
from ale.images import attest, definition
from ale.images.build import build_image
from ale.images.fetch import default_cache
from ale.runner.inspect import read_identity

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
#: An agent that writes its policy and exits at once (bench/harness_bench.py's).
INSTANT_AGENT = (
    '/ale/python/bin/python3 -c "import os, numpy as np; from ale.policy import linear_policy; '
    "open(os.environ['ALE_WORKSPACE'] + '/policy.safetensors', 'wb').write("
    "linear_policy(np.array([[0, 0, 0, 0], [0, 0.5, 10, 2.0]]), output='discrete'))\""
)


@pytest.fixture(scope="module")
def images() -> tuple[Path, Path]:
    """The session's images and their lock (ALE_IMAGES_DIR, ALE_IMAGES_LOCK), the release's own."""
    if (why := prepare("podman")) is not None:
        missing(why)
    layouts, lock = Path(os.environ["ALE_IMAGES_DIR"]), Path(os.environ["ALE_IMAGES_LOCK"])
    release, _ = catalog.release()
    built = {name: entry["digest"] for name, entry in attest.read_lock(lock).items()}
    if built != release.images:
        pytest.fail(f"the release's lock is stale: {built} built, {release.images} locked (run `make lock`)")
    return layouts, lock


def _ale(cwd: Path, env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*h.RUNNER_CLI, *argv], capture_output=True, text=True, cwd=cwd, env=env, timeout=900, check=False
    )


def _env(layouts: Path, lock: Path) -> dict[str, str]:
    return h._env(ALE_IMAGES_DIR=str(layouts), ALE_IMAGES_LOCK=str(lock))


def test_a_podman_run_of_the_reference_release_on_other_images_is_refused(
    images: tuple[Path, Path], tmp_path: Path
) -> None:
    """The same definitions built at another epoch: other digests, consistently locked, and still
    not the release's: refused before anything runs, each difference named, no bundle."""
    found = built_images()
    assert not isinstance(found, str)
    cache = Path(os.environ.get("ALE_IMAGES_CACHE") or default_cache())
    other = tmp_path / "other"
    defn = definition.load(ROOT / "images" / "evaluator.toml")
    rebuilt = build_image(defn, ROOT, other / "evaluator", cache, epoch=1, log=lambda _l: None)
    os.symlink(found["agent-base"].layout, other / "agent-base")
    lock = other / "lock.json"
    attest.write_lock(lock, attest.lock_document([found["agent-base"], rebuilt])["images"])
    release, _ = catalog.release()
    assert release.images is not None
    assert rebuilt.digest != release.images["evaluator"]
    refused = _ale(tmp_path, _env(other, lock), "run", "cartpole-balance", "--plain", "--runtime", "podman",
                   "--episodes", "2", "--out", str(tmp_path / "out"), "--agent-cmd", INSTANT_AGENT)  # fmt: skip
    assert refused.returncode == 1, refused.stderr
    assert "the podman runtime's images are not release 2026.11's" in refused.stderr
    assert f"the release pins evaluator {release.images['evaluator']}, but {rebuilt.digest} ran" in refused.stderr
    assert not list((tmp_path / "out").glob("*.ale"))


@attrs.frozen
class Site:
    live: h.LiveServer
    keys: h.SiteKeys
    runner_pem: Path
    runner_key_id: str


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    root = Path(tmp_path_factory.mktemp("release-site"))
    keys = h.keygen(root / "site")
    live = h.start_live_server(keys, root, name="release")
    try:
        pem = root / "runner.pem"
        made = subprocess.run([*h.RUNNER_CLI, "runner-key", str(pem)], capture_output=True, text=True, timeout=60)
        assert made.returncode == 0, made.stderr
        lines = dict(line.split(": ", 1) for line in made.stdout.splitlines())
        reply = httpx.post(
            f"{live.url}/api/v1/operator/runner-keys",
            json={"public_key": lines["public key (register it on the site)"], "kind": "benchmark_team",
                  "label": "the team's build and run box"},
            headers={"Authorization": f"Bearer {live.token(h.OPERATOR)}"}, timeout=30,
        )  # fmt: skip
        assert reply.status_code == 201, reply.text
        yield Site(live, keys, pem, lines["key id"])
    finally:
        live.stop()


def test_a_podman_run_of_the_reference_release_with_registered_provenance_is_officially_verified(
    images: tuple[Path, Path], site: Site, tmp_path: Path
) -> None:
    layouts, lock = images
    env = _env(layouts, lock)
    attested = _ale(tmp_path, env, "images", "attest", "--out", str(layouts), "--key", str(site.runner_pem),
                    "agent-base", "evaluator")  # fmt: skip
    assert attested.returncode == 0, attested.stderr
    register = subprocess.run(
        [*h.VERIFY_CLI, "register-provenance", str(layouts / "agent-base.intoto.json"),
         str(layouts / "evaluator.intoto.json")],
        capture_output=True, text=True, env=h._env(ALE_VERIFY_DATA=str(site.keys.data_dir)), timeout=120,
    )  # fmt: skip
    assert register.returncode == 0, register.stderr
    assert len(register.stdout.splitlines()) == 2
    token = site.live.token(h.PARTICIPANT)
    official = ("--site", site.live.url, "--token", token, "--runner-key", str(site.runner_pem), "--out", "out")
    ran = _ale(tmp_path, env, "run", "cartpole-balance", "--plain", "--runtime", "podman", "--agent-cmd", INSTANT_AGENT,
               *official)  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    made = Path(ran.stdout.strip().splitlines()[-1])
    made = made if made.is_absolute() else tmp_path / made
    manifest: dict[str, Any] = json.loads(
        codec.unpack(made.read_bytes(), read_identity(site.keys.key_file))["manifest.json"]
    )
    release, _ = catalog.release()
    assert release.images is not None
    environment = manifest["agent"]["environment"]
    assert environment["image"] == {"name": "agent-base", "digest": release.images["agent-base"]}
    assert environment["python"]["version"].startswith("3.11.")
    assert any(d.startswith("numpy==") for d in environment["distributions"])
    submitted = _ale(tmp_path, env, "submit", str(made), "--site", site.live.url, "--token", token, "--json")
    assert submitted.returncode == 0, submitted.stderr
    verdict = json.loads(submitted.stdout)
    assert (verdict["status"], verdict["level"]) == ("accepted", "officially_verified"), verdict
    record = httpx.get(f"{site.live.url}/api/v1/submissions/{verdict['id']}", timeout=30).json()
    proofs = record["summary"]["image_provenance"]
    assert {n: (p["status"], p["digest"], p["signed_by"]["key_id"]) for n, p in proofs.items()} == {
        name: ("verified", digest, site.runner_key_id) for name, digest in release.images.items()
    }
