"""Attestation of the images (the images issue's point 4): the release names its images by digest,
the runner refuses others, the bundle manifest records what ran, and the verifier checks it against
the release and shows it on the submission page.

The verifier's checks run on real ``ale run`` bundles (tests/verifier_helpers.py) whose manifest is
made an OCI runtime's, as a forger would make it (every digest resealed); the runner's refusal on a
real podman (slow)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from html import unescape
from pathlib import Path
from typing import Any

import attrs
import pytest
import verifier_helpers as h
from fuzzing import fuzz_settings, hostile_json, json_values
from hypothesis import given
from oci_bundles import AGENT, EVALUATOR, as_oci, image_environment, lock_bytes
from oci_images import prepare
from sandbox_tools import missing

from ale import catalog
from ale.core.parse import ParseError
from ale.core.reasons import Reason, VerificationError
from ale.core.release import ReleaseManifest, image_mismatches, parse_release
from ale.core.verify import check_files
from ale.images import attest
from ale.runner.harness import RunError, _check_release_images
from ale.schemas import validate_document

ROOT = Path(__file__).resolve().parents[1]


def _release_bytes(lock: str | None = None, *, name: str = "2026.11") -> bytes:
    data = json.loads(catalog.release_bytes())
    data["release"] = name
    data.pop("images_lock")
    if lock is not None:
        data["images_lock"] = lock
    return json.dumps(data, indent=2).encode()


def _release(images: dict[str, str] | None) -> tuple[ReleaseManifest, str]:
    """A release naming a lock of ``images`` (None: a release that names no lock)."""
    if images is None:
        return parse_release(_release_bytes())
    return parse_release(_release_bytes("test.json"), lambda _name: lock_bytes(images))


# --- the release names its images lock ------------------------------------------------------------------


def test_the_shipped_release_names_its_images_lock_and_the_lock_is_not_in_its_hash() -> None:
    raw = catalog.release_bytes("2026.11")
    manifest, digest = catalog.release("2026.11")
    assert manifest.images_lock == "2026.11.json"
    lock = (ROOT / "ale/releases/locks/2026.11.json").read_bytes()
    assert manifest.lock is not None
    assert manifest.lock.sha256 == hashlib.sha256(lock).hexdigest()
    assert manifest.images == {n: e["digest"] for n, e in json.loads(lock)["images"].items()}
    assert sorted(manifest.images) == ["agent-base", "evaluator"]
    assert (
        digest == hashlib.sha256(raw).hexdigest() == "c3ebcc3f218949f2912e12c4ed212e614796639064889182c0081622aca89474"
    )  # docs/formats.md (f)
    # another lock, the same release: the hash every bundle names is the manifest's bytes' alone
    other, same = parse_release(raw, lambda _n: lock_bytes({"evaluator": EVALUATOR}))
    assert same == digest
    assert other.images == {"evaluator": EVALUATOR}


def test_a_release_names_its_images_by_the_lock_it_names() -> None:
    manifest, digest = _release({"evaluator": EVALUATOR, "agent-base": AGENT})
    assert manifest.images == {"evaluator": EVALUATOR, "agent-base": AGENT}
    assert manifest.images_lock == "test.json"
    assert digest == hashlib.sha256(_release_bytes("test.json")).hexdigest()
    unpinned, _ = _release(None)
    assert (unpinned.images, unpinned.lock) == (None, None)


@pytest.mark.parametrize(
    ("lock", "needle"),
    [
        ("../2026.11.json", "images_lock must be a file name"),
        ("locks/2026.11.json", "images_lock must be a file name"),
        (".hidden.json", "images_lock must be a file name"),
        ("2026.11.toml", "images_lock must be a file name"),
        ("", "images_lock must be a file name"),
        (7, "images_lock"),
        (["2026.11.json"], "images_lock"),
    ],
)
def test_a_bad_images_lock_name_is_refused_with_the_member_named(lock: Any, needle: str) -> None:
    with pytest.raises(ParseError) as err:
        parse_release(_release_bytes(lock), lambda _n: lock_bytes({"evaluator": EVALUATOR}))
    assert needle in str(err.value)


def test_a_release_cannot_carry_its_lock_in_its_own_json() -> None:
    data = json.loads(_release_bytes("test.json"))
    data["lock"] = {"sha256": "00" * 32, "images": {}}
    with pytest.raises(ParseError, match="unknown member lock"):
        parse_release(json.dumps(data).encode(), lambda _n: lock_bytes({"evaluator": EVALUATOR}))


@pytest.mark.parametrize(
    ("lock", "needle"),
    [
        (b"", "images lock"),
        (b"[]", "format and images"),
        (b'{"format": "ale-images-lock/v2", "images": {"evaluator": {}}}', "format must be"),
        (b'{"format": "ale-images-lock/v1", "images": {}}', "1 to 64 images"),
        (b'{"format": "ale-images-lock/v1", "images": {"Evaluator": {}}}', "not an image name"),
        (b'{"format": "ale-images-lock/v1", "images": {"evaluator": {"digest": "sha256:00"}}}', "exactly digest"),
        (lock_bytes({"evaluator": "sha256:" + "E1" * 32}), "images.evaluator.digest must be"),
        (lock_bytes({"evaluator": "e1" * 32}), "images.evaluator.digest must be"),
        (b"[" * 100_000, "images lock"),
        (b'{"format": "ale-images-lock/v1", "images": {"a": ' + b"[" * 10_000 + b"]" * 10_000 + b"}}", "images lock"),
    ],
)
def test_a_bad_images_lock_is_refused_with_the_lock_named(lock: bytes, needle: str) -> None:
    with pytest.raises(ParseError) as err:
        parse_release(_release_bytes("test.json"), lambda _n: lock)
    assert "test.json" in str(err.value)
    assert needle in str(err.value)


def test_a_release_whose_lock_is_missing_is_refused_with_the_lock_named() -> None:
    def gone(name: str) -> bytes:
        raise FileNotFoundError(f"no images lock {name!r} is installed")

    missing_lock = re.escape("cannot read its images lock test.json: no images lock 'test.json'")
    with pytest.raises(ParseError, match=missing_lock):
        parse_release(_release_bytes("test.json"), gone)
    with pytest.raises(ParseError, match=re.escape("names the images lock test.json, and no lock can be read here")):
        parse_release(_release_bytes("test.json"))


@pytest.mark.fuzz
@fuzz_settings
@given(
    json_values,
    hostile_json | json_values.map(lambda v: json.dumps({"format": "ale-images-lock/v1", "images": v}).encode()),
)
def test_fuzz_release_images_lock_parse_or_give_parse_error(name: Any, lock: bytes) -> None:
    data = json.loads(_release_bytes())
    data["images_lock"] = name  # null included: the same as no member
    try:
        manifest, _ = parse_release(json.dumps(data).encode(), lambda _n: lock)
    except ParseError:
        return
    if name is None:
        assert manifest.images is None
        return
    assert manifest.images is not None
    assert all(v.startswith("sha256:") and len(v) == 71 for v in manifest.images.values())


def test_image_mismatches_name_each_difference() -> None:
    pinned = {"evaluator": EVALUATOR, "agent-base": AGENT}
    assert image_mismatches(None, {"evaluator": EVALUATOR}) == []
    assert image_mismatches(pinned, dict(pinned)) == []
    other = "sha256:" + "00" * 32
    assert image_mismatches(pinned, {"evaluator": other, "agent-base": AGENT}) == [
        f"the release pins evaluator {EVALUATOR}, but {other} ran"
    ]
    assert image_mismatches(pinned, {"evaluator": EVALUATOR}) == [
        f"the release pins agent-base {AGENT}, which did not run"
    ]
    assert image_mismatches({"evaluator": EVALUATOR}, pinned) == [
        f"agent-base {AGENT} ran, which the release does not pin"
    ]


# --- the runner refuses other images --------------------------------------------------------------------


@attrs.define
class _Runtime:
    name: str
    digests: dict[str, str]

    def image_digests(self) -> dict[str, str]:
        return self.digests


def test_the_runner_refuses_a_runtime_whose_images_are_not_the_releases() -> None:
    release, _ = _release({"evaluator": EVALUATOR, "agent-base": AGENT})
    other = "sha256:" + "00" * 32
    with pytest.raises(RunError) as err:
        _check_release_images(release, _Runtime("podman", {"evaluator": other, "agent-base": AGENT}))  # type: ignore[arg-type]
    message = str(err.value)
    assert "release 2026.11" in message
    assert f"the release pins evaluator {EVALUATOR}, but {other} ran" in message
    assert "ale images build" in message
    _check_release_images(release, _Runtime("podman", {"evaluator": EVALUATOR, "agent-base": AGENT}))  # type: ignore[arg-type]
    _check_release_images(release, _Runtime("local", {}))  # type: ignore[arg-type]  # runs no image
    unpinned, _ = _release(None)
    _check_release_images(unpinned, _Runtime("podman", {"evaluator": other}))  # type: ignore[arg-type]


# --- the verifier checks what ran against the release --------------------------------------------------


@pytest.fixture(scope="session")
def world(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> h.World:
    return h.get_world(tmp_path_factory, request.config)


def _check(files: dict[str, bytes], release: tuple[ReleaseManifest, str]) -> Any:
    """The offline checks, with ``release`` standing for the release the bundle names."""
    manifest_sha = json.loads(files["manifest.json"])["release"]["manifest_sha256"]
    return check_files(
        files,
        release_for=lambda sha: (release[0], sha) if sha == manifest_sha else None,
        known_tasks={t.spec.ref: (t.spec, t.digest) for t in catalog.tasks().values()},
        validate=validate_document,
    )


def _expect(reason: Reason, call: Callable[[], Any]) -> str:
    with pytest.raises(VerificationError) as err:
        call()
    assert err.value.reason == reason, err.value
    return str(err.value)


def test_an_oci_manifest_is_schema_valid_and_parses(world: h.World) -> None:
    files = as_oci(world.files("plain"))
    validate_document("manifest.json", json.loads(files["manifest.json"]))
    report = _check(files, _release(None))  # a release that pins no images
    assert report.docs.manifest.runtime.images.images["evaluator"].digest == EVALUATOR


def test_the_verifier_accepts_the_releases_own_images_and_refuses_others(world: h.World) -> None:
    files = as_oci(world.files("plain"))
    assert _check(files, _release({"evaluator": EVALUATOR, "agent-base": AGENT})) is not None
    other = "sha256:" + "00" * 32
    message = _expect(Reason.IMAGE_MISMATCH, lambda: _check(files, _release({"evaluator": other, "agent-base": AGENT})))
    assert f"the release pins evaluator {other}, but {EVALUATOR} ran" in message
    _expect(Reason.IMAGE_MISMATCH, lambda: _check(files, _release({"evaluator": EVALUATOR})))  # agent-base unpinned


def test_the_manifest_contradicting_its_own_image_digests_is_refused(world: h.World) -> None:
    plain = world.files("plain")
    release = _release(None)
    for wrong in ({"evaluator_hex": "00" * 32}, {"agent_hex": "00" * 32}, {"lock": "00" * 32}):
        _expect(Reason.IMAGE_MISMATCH, lambda w=wrong: _check(as_oci(plain, **w), release))  # type: ignore[misc]

    def images_without_digests(manifest: dict[str, Any]) -> None:
        manifest["runtime"]["images"] = None

    bare = h.edit(as_oci(plain), "manifest.json", images_without_digests)
    _expect(Reason.IMAGE_MISMATCH, lambda: _check(bare, release))


def test_the_agent_environment_must_be_the_agent_image_that_ran(world: h.World) -> None:
    """An OCI run's agent.environment names the agent image by the digest runtime.images names; a
    local run's names none (a manifest contradicting itself about what the agent ran is refused)."""
    release = _release({"evaluator": EVALUATOR, "agent-base": AGENT})
    plain = world.files("plain")
    local_env = json.loads(plain["manifest.json"])["agent"]["environment"]

    def environment(value: dict[str, Any]) -> Callable[[dict[str, Any]], None]:
        def change(manifest: dict[str, Any]) -> None:
            manifest["agent"]["environment"] = value

        return change

    report = _check(as_oci(plain), release)
    assert any(item.startswith("image provenance: ") for item in report.not_checked)  # the site's alone
    assert not any("image provenance" in item for item in _check(h.seal(plain), release).not_checked)
    as_evaluator = {**image_environment(), "image": {"name": "evaluator", "digest": EVALUATOR}}
    for wrong in (local_env, image_environment(EVALUATOR), as_evaluator):
        files = h.edit(as_oci(plain), "manifest.json", environment(wrong))
        message = _expect(Reason.IMAGE_MISMATCH, lambda f=files: _check(f, release))  # type: ignore[misc]
        assert "the agent environment is not the agent image that ran" in message
    files = h.edit(plain, "manifest.json", environment(image_environment()))
    message = _expect(Reason.IMAGE_MISMATCH, lambda: _check(files, release))
    assert "the agent environment names an image, but none ran" in message


def test_a_local_runtimes_run_ran_no_image_and_is_compared_with_nothing(world: h.World) -> None:
    plain = world.files("plain")
    assert json.loads(plain["manifest.json"])["runtime"]["images"] is None
    assert _check(h.seal(plain), _release({"evaluator": EVALUATOR, "agent-base": AGENT})) is not None


def _uploaded(world: h.World, tmp: Path, files: dict[str, bytes], monkeypatch: pytest.MonkeyPatch, pins: Any) -> Any:
    """Upload ``files`` (re-pointed at a test release pinning ``pins``) to an in-process verifier."""
    release, sha = _release(pins)

    def point(manifest: dict[str, Any]) -> None:
        manifest["release"]["manifest_sha256"] = sha

    import ale_verify.pipeline as pipeline

    monkeypatch.setattr(pipeline, "installed_releases", lambda: {sha: release})
    return h.run(_upload(world, tmp, h.edit(files, "manifest.json", point)))


async def _upload(world: h.World, tmp: Path, files: dict[str, bytes]) -> tuple[h.Reply, h.Verifier]:
    v = h.Verifier(world, tmp)
    reply = await v.upload(h.encrypt_files(files, world.keys.recipient))
    return reply, v


def test_the_site_refuses_other_images_and_shows_the_digests_of_the_releases_own(
    world: h.World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = as_oci(world.files("plain"))
    other = "sha256:" + "00" * 32
    reply, _ = _uploaded(world, tmp_path / "a", files, monkeypatch, {"evaluator": other, "agent-base": AGENT})
    assert reply.status == 422, reply.body
    assert reply.json["reason"] == "image_mismatch"
    reply, v = _uploaded(world, tmp_path / "b", files, monkeypatch, {"evaluator": EVALUATOR, "agent-base": AGENT})
    assert reply.status == 201, reply.body
    from ale_verify import db, export

    row = db.get_submission(v.settings.database, reply.json["id"])
    assert row is not None
    assert row["summary"]["release_images"] == {"evaluator": EVALUATOR, "agent-base": AGENT}
    site = tmp_path / "site"
    export.export_site(v.settings.database, site, docs_dir=ROOT / "docs")
    page = unescape((site / "submissions" / f"{reply.json['id']}.html").read_text())  # the text a reader sees
    assert EVALUATOR in page
    assert AGENT in page
    assert "the release's own: each digest checked against the release" in page
    assert "podman 4.3.1 → podman 4.3.1" in page


# --- on a real podman: the runner refuses, and the manifest records what ran ----------------------------


#: An agent that writes its policy and exits at once (bench/harness_bench.py's).
INSTANT_AGENT = (
    '/ale/python/bin/python3 -c "import os, numpy as np; from ale.policy import linear_policy; '
    "open(os.environ['ALE_WORKSPACE'] + '/policy.safetensors', 'wb').write("
    "linear_policy(np.array([[0, 0, 0, 0], [0, 0.5, 10, 2.0]]), output='discrete'))\""
)


def _ale_run(tmp_path: Path, release: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ale.runner.cli", "run", "cartpole-balance", "--plain", "--runtime", "podman",
         "--release-file", str(release), "--episodes", "2", "--out", str(tmp_path / "out"),
         "--agent-cmd", INSTANT_AGENT, *extra],
        capture_output=True, text=True, cwd=tmp_path, env=dict(os.environ), timeout=600,
    )  # fmt: skip


@pytest.mark.slow
def test_podman_run_is_refused_for_a_release_pinning_other_images_and_records_its_own(tmp_path: Path) -> None:
    if (why := prepare("podman")) is not None:
        missing(why)

    locked = {name: entry["digest"] for name, entry in attest.read_lock(Path(os.environ["ALE_IMAGES_LOCK"])).items()}
    (tmp_path / "locks").mkdir()
    (tmp_path / "locks" / "wrong.json").write_bytes(lock_bytes({**locked, "evaluator": "sha256:" + "00" * 32}))
    wrong = tmp_path / "wrong.json"
    wrong.write_bytes(_release_bytes("wrong.json"))
    refused = _ale_run(tmp_path, wrong)
    assert refused.returncode == 1, refused.stderr
    assert refused.stderr.count("\n") <= 2, refused.stderr
    assert "the podman runtime's images are not release 2026.11's" in refused.stderr
    assert not list((tmp_path / "out").glob("*.ale"))
    (tmp_path / "locks" / "right.json").write_bytes(lock_bytes(locked))
    right = tmp_path / "right.json"
    right.write_bytes(_release_bytes("right.json"))
    ran = _ale_run(tmp_path, right)
    assert ran.returncode == 0, ran.stderr
    bundle = Path(ran.stdout.strip().splitlines()[-1])
    key = next((tmp_path / "out").glob("*.key"))
    from ale.core import bundle as codec
    from ale.runner.inspect import read_identity

    manifest = json.loads(codec.unpack(bundle.read_bytes(), read_identity(key))["manifest.json"])
    validate_document("manifest.json", manifest)
    assert {n: e["digest"] for n, e in manifest["runtime"]["images"]["images"].items()} == locked
    assert manifest["runtime"]["engine"]["name"] == "podman"
    assert manifest["runtime"]["code"]["evaluator_image_sha256"] == locked["evaluator"][7:]
