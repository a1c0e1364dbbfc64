"""The real images, built twice in two fresh folders: the same manifest digests; every layer holds
only what the image may hold, with normalised metadata; skopeo reads the layouts; podman runs
them by digest with no network, a read-only root and no capabilities.

Slow (a few minutes the first time on a machine: the downloads go to the cache shared between
builds, ``$ALE_IMAGES_CACHE`` or ``~/.cache/ale/images``, outside the build folders). Needs the
Debian mirror and PyPI unless the cache has everything; skopeo and podman (CI installs them, and
fails instead of skipping: ``ALE_SITE_TOOLS_REQUIRED=1``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
import time
from pathlib import Path
from typing import Any

import pytest
from oci_images import RUN_IMAGES, built_images
from sandbox_tools import missing

from ale.images import attest, definition, layout
from ale.images.build import Built, build_image
from ale.images.cli import DEFAULT_RELEASE, RELOCK, release_lock
from ale.images.fetch import FetchError, default_cache

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
SITE = "usr/local/lib/python3.11/dist-packages"  # the evaluator's
AGENT_SITE = "ale/python/lib/python3.11/site-packages"  # the agent contract's Python environment
NAMES = ("agent-base", "evaluator", "verifier")
CONTAINERS_CONF = """\
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
[engine]
runtime = "runc"
"""

#: Path prefixes no layer of the image may hold.
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "evaluator": tuple(
        f"{SITE}/{p}" for p in ("ale/runner", "ale/agents", "ale/releases", "ale/schemas", "ale_verify", "ale_site")
    ),
    "agent-base": (
        f"{SITE}/",
        *(
            f"{AGENT_SITE}/{p}"
            for p in (
                "ale/runner", "ale/agents", "ale/releases", "ale/schemas", "ale/tasks", "ale/catalog.py",
                "ale/core/release.py", "ale/core/scoring.py", "ale_evaluator", "ale_verify", "ale_site",
                "mujoco", "glfw", "OpenGL",
            )
        ),
    ),
    "verifier": tuple(  # numpy it holds: it recomputes the scores' bootstrap intervals
        f"{SITE}/{p}"
        for p in ("ale/runner/cli.py", "ale/runner/harness.py", "ale/agents", "ale/gateway", "ale/images",
                  "ale_evaluator", "mujoco", "gymnasium", "grpc", "deploy")
    ),
}  # fmt: skip
#: Paths the image must hold.
REQUIRED: dict[str, tuple[str, ...]] = {
    "evaluator": (f"{SITE}/ale_evaluator/__main__.py", f"{SITE}/mujoco/__init__.py", "usr/bin/python3.11"),
    "agent-base": (
        f"{AGENT_SITE}/ale/client/__init__.py",
        "ale/python/pyvenv.cfg",
        "usr/bin/git",
        "usr/bin/gcc-12",
        "usr/bin/make",
        "usr/bin/cc",
        "ale/python/bin/python3",
    ),
    "verifier": (
        f"{SITE}/ale_verify/cli.py",
        f"{SITE}/ale_site/templates/board.html",
        f"{SITE}/docs/verifier.md",
        f"{SITE}/pyrage/__init__.py",
        "usr/bin/caddy",
        "usr/bin/python3.11",
        "usr/share/ca-certificates/mozilla",
    ),
}


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Built, Built]]:
    cache = Path(os.environ.get("ALE_IMAGES_CACHE") or default_cache())
    out: dict[str, tuple[Built, Built]] = {}
    timings = []
    start = time.monotonic()
    session = built_images()  # the OCI runtimes' tests run these: they are the first builds
    if isinstance(session, str):
        missing(session)
    timings.append(f"{', '.join(session)} first (shared with the OCI tests): {time.monotonic() - start:.1f} s")
    for name in NAMES:
        defn = definition.load(ROOT / "images" / f"{name}.toml")
        pair = [session[name]] if name in session else []
        for run in ("first", "second")[len(pair) :]:
            folder = tmp_path_factory.mktemp(f"{name}-{run}")  # a fresh folder for each build
            start = time.monotonic()
            try:
                pair.append(build_image(defn, ROOT, folder / name, cache, log=lambda _line: None))
            except FetchError as exc:
                missing(f"the pinned downloads are neither cached nor reachable: {exc}")
            timings.append(f"{name} {run}: {time.monotonic() - start:.1f} s")
        out[name] = (pair[0], pair[1])
    print("image build times:", "; ".join(timings))
    return out


@pytest.mark.parametrize("name", NAMES)
def test_real_images_build_bit_for_bit_in_two_fresh_folders(builds: dict[str, tuple[Built, Built]], name: str) -> None:
    a, b = builds[name]
    assert a.layout != b.layout
    assert [x.digest for x in a.layers] == [x.digest for x in b.layers]
    assert a.digest == b.digest
    assert layout.read_manifest_digest(a.layout) == layout.read_manifest_digest(b.layout) == a.digest


def test_the_releases_images_lock_is_the_images_built_from_this_checkout(
    builds: dict[str, tuple[Built, Built]],
) -> None:
    """The release's committed lock holds the digests of the images this checkout builds. Every
    change to what enters an image changes its digest (and the runner refuses a release's run on
    other images), so a stale lock fails here, in one line, with what to do."""
    lock = release_lock(ROOT, DEFAULT_RELEASE)
    held = sorted(attest.read_lock(lock))
    assert held == sorted(RUN_IMAGES), f"{lock} must hold the images a run runs, not {held}"
    entries = attest.lock_document([builds[name][0] for name in held])["images"]
    difference = attest.lock_difference(lock, entries)
    if difference is not None:
        pytest.fail(f"{lock.relative_to(ROOT)} is stale: {difference} ({RELOCK})", pytrace=False)


def _walk(built: Built) -> dict[str, tarfile.TarInfo]:
    """Every entry of every layer, checking the metadata rules on the way; the union by path."""
    seen: dict[str, tarfile.TarInfo] = {}
    for path in layout.layer_paths(built.layout):
        with tarfile.open(path) as tf:
            members = tf.getmembers()
        names = [m.name for m in members]
        assert names == sorted(names, key=lambda n: n.encode()), f"{path.name}: entries not sorted"
        for m in members:
            assert (m.uid, m.gid, m.uname, m.gname) == (0, 0, "", ""), f"{m.name}: owner {m.uid}:{m.gid}"
            assert m.mtime == built.epoch, f"{m.name}: mtime {m.mtime}"
            assert not m.mode & 0o6000, f"{m.name}: setuid/setgid"
            assert m.isfile() or m.isdir() or m.issym() or m.islnk(), f"{m.name}: special file"
            seen[m.name.rstrip("/")] = m
    return seen


@pytest.mark.parametrize("name", NAMES)
def test_real_images_hold_nothing_forbidden(builds: dict[str, tuple[Built, Built]], name: str) -> None:
    entries = _walk(builds[name][0])
    for path in entries:
        assert not path.startswith(FORBIDDEN[name]), f"{name} holds {path}"
    for path in REQUIRED[name]:
        assert path in entries, f"{name} lacks {path}"
    pycache = [p for p in entries if p.startswith((SITE, AGENT_SITE)) and "__pycache__" in p]
    assert not pycache, f"byte code is not reproducible, yet {name} holds {pycache[:3]}"


def _config(built: Built) -> dict[str, Any]:
    _digest, manifest = layout.read_manifest(built.layout)
    return json.loads((built.layout / "blobs/sha256" / manifest["config"]["digest"][7:]).read_bytes())  # type: ignore[no-any-return]


@pytest.mark.parametrize("name", NAMES)
def test_real_images_config_has_no_time_and_a_non_root_user(builds: dict[str, tuple[Built, Built]], name: str) -> None:
    config = _config(builds[name][0])
    assert "created" not in config
    assert "history" not in config
    assert not config["config"]["User"].startswith("0:")


def _skopeo() -> str:
    exe = shutil.which("skopeo")
    if exe is None:
        missing("skopeo is not installed (apt-get install skopeo)")
    return str(exe)


@pytest.mark.parametrize("name", NAMES)
def test_real_images_validate_with_skopeo(builds: dict[str, tuple[Built, Built]], name: str) -> None:
    built = builds[name][0]
    r = subprocess.run([_skopeo(), "inspect", f"oci:{built.layout}"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["Digest"] == built.digest
    assert info["Layers"] == [x.digest for x in built.layers]


@pytest.fixture(scope="module")
def podman_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    if shutil.which("podman") is None:
        missing("podman is not installed (apt-get install podman runc)")
    env = dict(os.environ)
    if not env.get("CONTAINERS_CONF"):
        conf = tmp_path_factory.mktemp("podman") / "containers.conf"
        conf.write_text(CONTAINERS_CONF)
        env["CONTAINERS_CONF"] = str(conf)
    probe = subprocess.run(["podman", "info"], capture_output=True, text=True, env=env, timeout=120)
    if probe.returncode != 0:
        missing(f"podman cannot run here: {probe.stderr.strip()[-300:]}")
    return env


def _podman_run(env: dict[str, str], built: Built, *argv: str) -> subprocess.CompletedProcess[str]:
    ref = f"localhost/ale-test-{built.name}:{built.digest[7:19]}"
    copy = subprocess.run(
        [_skopeo(), "copy", "--quiet", f"oci:{built.layout}", f"containers-storage:{ref}"],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert copy.returncode == 0, copy.stderr
    try:
        by_digest = f"localhost/ale-test-{built.name}@{built.digest}"
        return subprocess.run(
            ["podman", "run", "--rm", "--pull=never", "--network=none", "--read-only", "--cap-drop=ALL",
             "--security-opt=no-new-privileges", by_digest, *argv],
            capture_output=True, text=True, env=env, timeout=300,
        )  # fmt: skip
    finally:
        subprocess.run(["podman", "rmi", "--force", ref], capture_output=True, env=env, timeout=120)


def test_agent_base_image_runs_by_digest_on_podman(
    builds: dict[str, tuple[Built, Built]], podman_env: dict[str, str]
) -> None:
    code = (
        "import ale.client, getpass, os, sys\n"
        "print(getpass.getuser(), os.getuid(), sys.prefix)\n"
        "try:\n    import ale_evaluator\nexcept ImportError:\n    print('no evaluator')\n"
        "try:\n    import ale.runner\nexcept ImportError:\n    print('no harness')\n"
    )
    r = _podman_run(podman_env, builds["agent-base"][0], "/ale/python/bin/python3", "-c", code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["agent", "10002", "/ale/python", "no", "evaluator", "no", "harness"]


def test_evaluator_image_runs_by_digest_on_podman(
    builds: dict[str, tuple[Built, Built]], podman_env: dict[str, str]
) -> None:
    r = _podman_run(podman_env, builds["evaluator"][0], "tasks")  # the entrypoint is the evaluator
    assert r.returncode == 0, r.stderr
    tasks = {line.split()[0].split("@")[0] for line in r.stdout.splitlines() if line.strip()}
    assert tasks == {p.name for p in (ROOT / "ale" / "tasks").iterdir() if (p / "task.json").is_file()}
