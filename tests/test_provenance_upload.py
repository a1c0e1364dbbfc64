"""The images' provenance in the upload path: for a bundle that ran on an OCI runtime, the verifier
checks the provenance statements the operator registered (``ale-verify register-provenance``) for
the digests that ran against the release's lock. A missing or bad one is a note
(``provenance_missing``, ``provenance_invalid``) and keeps the run from ``officially_verified``;
never a rejection, never a 500. Registration refuses forged statements, statements for another
digest and oversized or deeply nested documents, each with its reason.

The bundles are real ``ale run`` bundles made an OCI runtime's (tests/oci_bundles.py); the
statements have the shape ``ale images attest`` writes (tests/test_provenance.py builds real ones
from a built layout)."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import verifier_helpers as h
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fuzzing import fuzz_settings, hostile_json
from hypothesis import given
from hypothesis import strategies as st
from oci_bundles import AGENT, EVALUATOR, as_oci, lock_bytes, signed, statement

from ale import catalog
from ale.core import provenance
from ale.core.canonical import canonical_json
from ale.core.reasons import Level, Reason
from ale.core.release import ReleaseManifest, parse_lock, parse_release
from ale.core.signing import key_id, public_raw
from ale.core.verify import RunnerKey
from ale_verify import db, export
from ale_verify import provenance as site

ROOT = Path(__file__).resolve().parents[1]
OTHER = "sha256:" + "07" * 32


@pytest.fixture(scope="session")
def world(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> h.World:
    return h.get_world(tmp_path_factory, request.config)


def _release(images: dict[str, str] | None = None) -> tuple[ReleaseManifest, str]:
    """A test release naming a lock of ``images`` (the bundle's own by default); None: no lock."""
    data = json.loads(catalog.release_bytes())
    data.pop("images_lock")  # the same name (the score breakdown names it), another lock
    if images is None:
        return parse_release(json.dumps(data).encode())
    data["images_lock"] = "prov.1.json"
    return parse_release(json.dumps(data).encode(), lambda _n: lock_bytes(images))


RAN = {"evaluator": EVALUATOR, "agent-base": AGENT}


def _runner(key: Ed25519PrivateKey) -> RunnerKey:
    raw = public_raw(key)
    return RunnerKey(key_id(raw), base64.b64encode(raw).decode(), "benchmark_team", "the image builder")


def _trusting(*keys: Ed25519PrivateKey) -> Callable[[str], RunnerKey | None]:
    return {r.key_id: r for r in map(_runner, keys)}.get


def _tampered(raw: bytes, change: Callable[[dict[str, Any]], None]) -> bytes:
    """The envelope with its statement changed and the signature kept: a forger without the key."""
    env = json.loads(raw)
    doc = json.loads(base64.b64decode(env["payload"]))
    change(doc)
    env["payload"] = base64.b64encode(canonical_json(doc)).decode()
    return canonical_json(env)


def _deep(depth: int) -> bytes:
    return b'{"payloadType": "application/vnd.in-toto+json", "payload": ' + b"[" * depth + b"]" * depth + b"}"


@pytest.fixture(scope="module")
def key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


def _hostile(key: Ed25519PrivateKey) -> dict[str, tuple[bytes, str]]:
    """Statements for EVALUATOR a site must never credit, and the reason each one gets."""
    good = signed(statement("evaluator", EVALUATOR), key)
    stranger = Ed25519PrivateKey.generate()

    def other_subject(doc: dict[str, Any]) -> None:
        doc["subject"][0]["digest"]["sha256"] = OTHER[7:]

    def other_pin(doc: dict[str, Any]) -> None:
        doc["predicate"]["buildDefinition"]["resolvedDependencies"][0]["digest"]["sha256"] = "ee" * 32

    return {
        "forged by an unregistered key": (signed(statement("evaluator", EVALUATOR), stranger), "untrusted_signer"),
        "a pin changed after signing": (_tampered(good, other_pin), "bad_signature"),
        "the subject changed after signing": (_tampered(good, other_subject), "bad_signature"),
        "signed, for another digest": (signed(statement("evaluator", OTHER), key), "subject_mismatch"),
        "signed, for another image": (signed(statement("agent-base", EVALUATOR), key), "subject_mismatch"),
        "signed, another definition": (
            signed(statement("evaluator", EVALUATOR, definition="ff" * 32), key),
            "definition_mismatch",
        ),
        "signed, other layers": (signed(statement("evaluator", EVALUATOR, layers=(OTHER,)), key), "layers_mismatch"),
        "bare, unsigned": (canonical_json(statement("evaluator", EVALUATOR)), "unsigned"),
        "oversized": (good[:-2] + b" " * (provenance.MAX_BYTES + 1) + b"}", "malformed"),
        "deeply nested": (_deep(100_000), "malformed"),
        "deeply nested, small": (_deep(200), "malformed"),
        "not JSON": (b"\xff\xfe{", "malformed"),
    }


# --- the pure check: ale.core.provenance.prove_images ---------------------------------------------------


def test_each_image_that_ran_is_proven_by_its_signed_statement_against_the_releases_lock(
    key: Ed25519PrivateKey,
) -> None:
    release, _ = _release(RAN)
    statements = {name: signed(statement(name, digest), key) for name, digest in RAN.items()}
    proofs = provenance.prove_images(RAN, release.lock, statements, trusted=_trusting(key))
    assert [(p.name, p.status) for p in proofs] == [("agent-base", "verified"), ("evaluator", "verified")]
    assert {p.signer.key_id for p in proofs if p.signer} == {_runner(key).key_id}
    assert provenance.proof_notes(proofs) == []
    assert provenance.credited_level(Level.OFFICIALLY_VERIFIED, proofs) is Level.OFFICIALLY_VERIFIED


@pytest.mark.parametrize("case", sorted(_hostile(Ed25519PrivateKey.generate())))
def test_a_hostile_statement_is_invalid_with_its_reason_and_never_raises(key: Ed25519PrivateKey, case: str) -> None:
    raw, reason = _hostile(key)[case]
    release, _ = _release(RAN)
    proof = provenance.prove_image("evaluator", EVALUATOR, release.lock, raw, trusted=_trusting(key))
    assert (proof.status, proof.reason) == ("invalid", reason), proof.message
    assert proof.signer is None
    [note] = provenance.proof_notes((proof,))
    assert note["reason"] == Reason.PROVENANCE_INVALID
    assert note["message"].startswith(f"evaluator {EVALUATOR}: {reason}: ")
    assert len(note["message"]) < 1000  # the statement itself is never quoted
    assert provenance.credited_level(Level.OFFICIALLY_VERIFIED, (proof,)) is Level.VALIDATED


def test_no_statement_or_no_lock_is_missing(key: Ed25519PrivateKey) -> None:
    release, _ = _release(RAN)
    [proof] = provenance.prove_images({"evaluator": EVALUATOR}, release.lock, {}, trusted=_trusting(key))
    assert (proof.status, proof.message) == ("missing", "no provenance statement of it is registered on this site")
    unlocked, _ = _release(None)
    good = signed(statement("evaluator", EVALUATOR), key)
    proof = provenance.prove_image("evaluator", EVALUATOR, unlocked.lock, good, trusted=_trusting(key))
    assert proof.status == "missing"
    assert proof.message.startswith("the release names no images lock")
    [note] = provenance.proof_notes((proof,))
    assert note["reason"] == Reason.PROVENANCE_MISSING


@pytest.mark.parametrize("level", list(Level))
def test_only_officially_verified_is_lowered_and_only_to_validated(level: Level) -> None:
    missing = (provenance.ImageProof("evaluator", EVALUATOR, "missing", "none"),)
    verified = (provenance.ImageProof("evaluator", EVALUATOR, "verified", ""),)
    expected = Level.VALIDATED if level is Level.OFFICIALLY_VERIFIED else level
    assert provenance.credited_level(level, missing) is expected
    assert provenance.credited_level(level, verified) is level


@pytest.mark.fuzz
@fuzz_settings
@given(hostile_json | st.binary(max_size=400), st.sampled_from(["evaluator", "agent-base", "verifier", "x"]))
def test_fuzz_a_registered_statement_gives_a_proof_never_an_exception(raw: bytes, name: str) -> None:
    release, _ = _release(RAN)
    proof = provenance.prove_image(name, RAN.get(name, OTHER), release.lock, raw, trusted=lambda _k: None)
    assert proof.status in ("missing", "invalid")


# --- registering statements: ale_verify.provenance.register ---------------------------------------------


def test_registration_keeps_a_signed_statement_of_a_locked_image_under_its_digest(
    key: Ed25519PrivateKey, tmp_path: Path
) -> None:
    release, _ = _release(RAN)
    raw = signed(statement("evaluator", EVALUATOR), key)
    done = site.register(raw, tmp_path / "prov", [release], _trusting(key))
    assert (done.name, done.digest, done.release, done.signer.key_id) == (
        "evaluator",
        EVALUATOR,
        "2026.11",
        _runner(key).key_id,
    )
    assert done.path == tmp_path / "prov" / f"{EVALUATOR[7:]}.intoto.json"
    assert done.path.read_bytes() == raw
    assert sorted(p.name for p in (tmp_path / "prov").iterdir()) == [done.path.name]  # no temporary left


@pytest.mark.parametrize("case", sorted(_hostile(Ed25519PrivateKey.generate())))
def test_registration_refuses_a_hostile_statement_with_its_reason_and_keeps_nothing(
    key: Ed25519PrivateKey, tmp_path: Path, case: str
) -> None:
    raw, reason = _hostile(key)[case]
    release, _ = _release(RAN)
    with pytest.raises(provenance.ProvenanceError) as err:
        site.register(raw, tmp_path / "prov", [release], _trusting(key))
    assert err.value.reason == reason, err.value
    assert not (tmp_path / "prov").exists() or not list((tmp_path / "prov").iterdir())


def test_registration_refuses_an_image_no_installed_release_locks(key: Ed25519PrivateKey, tmp_path: Path) -> None:
    release, _ = _release(RAN)
    with pytest.raises(provenance.ProvenanceError, match="no installed release's images lock holds verifier"):
        site.register(signed(statement("verifier", EVALUATOR), key), tmp_path, [release], _trusting(key))
    with pytest.raises(provenance.ProvenanceError, match=f"release 2026.11 locks {EVALUATOR}"):
        site.register(signed(statement("evaluator", OTHER), key), tmp_path, [release], _trusting(key))


# --- the upload path --------------------------------------------------------------------------------------


BUILDER = Ed25519PrivateKey.generate()  # the key the site registered for the machine that builds the images


def _register(where: Any, key: Ed25519PrivateKey, kind: str = "benchmark_team") -> None:
    runner = _runner(key)
    db.register_runner_key(where, key_id=runner.key_id, public_key=runner.public_key, kind=kind,
                           label="the image builder", actor="operator:test")  # fmt: skip


@pytest.fixture
def verifier(world: h.World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> h.Verifier:
    """An in-process verifier whose installed release is the test release locking the bundle's
    images, with the bundles' runner key and the image builder's key registered."""
    import ale_verify.pipeline as pipeline

    release, sha = _release(RAN)
    monkeypatch.setattr(pipeline, "installed_releases", lambda: {sha: release})
    v = h.Verifier(world, tmp_path, provenance_dir=tmp_path / "provenance")
    db.migrate(v.settings.database)
    db.register_runner_key(v.settings.database, key_id=world.runner_key_id, public_key=world.runner_public,
                           kind="official_rerun", label="rerun box", actor="operator:test")  # fmt: skip
    _register(v.settings.database, BUILDER)
    return v


def _official(world: h.World, v: h.Verifier, files: dict[str, bytes]) -> h.Reply:
    """``files`` pointed at the test release, bound to a fresh challenge, signed by the registered runner."""
    _, sha = _release(RAN)

    def point(manifest: dict[str, Any]) -> None:
        manifest["release"]["manifest_sha256"] = sha

    async def go() -> h.Reply:
        c = await v.challenge()
        bound = h.rebind(h.edit(files, "manifest.json", point), c["nonce"], c["token"], runner_key=world.runner_key())
        return await v.upload(h.encrypt_files(bound, world.keys.recipient))

    return h.run(go())


def _store(v: h.Verifier, digest: str, raw: bytes) -> None:
    folder = v.settings.provenance_dir
    assert folder is not None
    folder.mkdir(parents=True, exist_ok=True)
    site.statement_file(folder, digest).write_bytes(raw)


def _register_both(v: h.Verifier) -> None:
    release, _ = _release(RAN)
    assert v.settings.provenance_dir is not None
    for name, digest in RAN.items():
        site.register(
            signed(statement(name, digest), BUILDER), v.settings.provenance_dir, [release], _trusting(BUILDER)
        )


def test_an_official_oci_run_with_registered_provenance_is_officially_verified_and_shown(
    world: h.World, verifier: h.Verifier, tmp_path: Path
) -> None:
    _register_both(verifier)
    reply = _official(world, verifier, as_oci(world.files("signed")))
    assert reply.status == 201, reply.body
    assert (reply.json["level"], reply.json["reasons"]) == ("officially_verified", [])
    row = db.get_submission(verifier.settings.database, reply.json["id"])
    assert row is not None
    shown = row["summary"]["image_provenance"]
    assert {n: (p["digest"], p["status"], p["signed_by"]["key_id"]) for n, p in shown.items()} == {
        name: (digest, "verified", _runner(BUILDER).key_id) for name, digest in RAN.items()
    }
    export.export_site(verifier.settings.database, tmp_path / "site", docs_dir=ROOT / "docs")
    page = (tmp_path / "site" / "submissions" / f"{reply.json['id']}.html").read_text()
    assert "verified against the release's lock, signed by runner key" in page
    assert _runner(BUILDER).key_id[:16] in page


def test_an_official_oci_run_without_provenance_is_validated_with_a_note_per_image(
    world: h.World, verifier: h.Verifier
) -> None:
    reply = _official(world, verifier, as_oci(world.files("signed")))
    assert reply.status == 201, reply.body
    assert reply.json["level"] == "validated"
    assert [(r["reason"], r["message"].split(":")[0]) for r in reply.json["reasons"]] == [
        ("provenance_missing", "agent-base sha256"),
        ("provenance_missing", "evaluator sha256"),
    ]
    assert "no provenance statement of it is registered on this site" in reply.json["reasons"][0]["message"]


@pytest.mark.parametrize("case", ["forged by an unregistered key", "a pin changed after signing",
                                  "signed, for another digest", "oversized", "deeply nested"])  # fmt: skip
def test_a_bad_statement_in_the_sites_folder_lowers_the_level_with_its_reason_never_a_500(
    world: h.World, verifier: h.Verifier, case: str
) -> None:
    """A statement changed on disk after registration (registration itself refuses all of these)."""
    _register_both(verifier)
    raw, reason = _hostile(BUILDER)[case]
    _store(verifier, EVALUATOR, raw)
    reply = _official(world, verifier, as_oci(world.files("signed")))
    assert reply.status == 201, reply.body
    assert reply.json["level"] == "validated"
    [note] = reply.json["reasons"]
    assert note["reason"] == "provenance_invalid"
    assert note["message"].startswith(f"evaluator {EVALUATOR}: {reason}: ")


def test_a_statement_whose_signer_was_retired_no_longer_proves_the_image(world: h.World, verifier: h.Verifier) -> None:
    _register_both(verifier)
    assert _official(world, verifier, as_oci(world.files("signed"))).json["level"] == "officially_verified"
    db.retire_runner_key(verifier.settings.database, _runner(BUILDER).key_id)
    reply = _official(world, verifier, as_oci(world.files("signed")))
    assert reply.status == 201, reply.body
    assert reply.json["level"] == "validated"
    assert [(r["reason"], r["message"].split(": ")[1]) for r in reply.json["reasons"]] == [
        ("provenance_invalid", "untrusted_signer"),
        ("provenance_invalid", "untrusted_signer"),
    ]


def test_a_validated_oci_run_keeps_its_level_and_gets_the_notes(world: h.World, verifier: h.Verifier) -> None:
    _, sha = _release(RAN)

    def point(manifest: dict[str, Any]) -> None:
        manifest["release"]["manifest_sha256"] = sha

    async def go() -> h.Reply:
        c = await verifier.challenge()
        bound = h.rebind(h.edit(as_oci(world.files("site")), "manifest.json", point), c["nonce"], c["token"])
        return await verifier.upload(h.encrypt_files(bound, world.keys.recipient))

    reply = h.run(go())
    assert reply.status == 201, reply.body
    assert reply.json["level"] == "validated"
    assert {r["reason"] for r in reply.json["reasons"]} == {"provenance_missing"}


def test_a_local_run_ran_no_image_and_has_no_provenance_to_check(world: h.World, verifier: h.Verifier) -> None:
    reply = _official(world, verifier, world.files("signed"))
    assert reply.status == 201, reply.body
    assert (reply.json["level"], reply.json["reasons"]) == ("officially_verified", [])
    row = db.get_submission(verifier.settings.database, reply.json["id"])
    assert row is not None
    assert row["summary"]["image_provenance"] is None


# --- ale-verify register-provenance -----------------------------------------------------------------------


def _cli(data: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {"ALE_VERIFY_DATA": str(data), "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [sys.executable, "-m", "ale_verify.cli", *argv], capture_output=True, text=True, env=env, timeout=120
    )


def test_register_provenance_checks_each_statement_against_the_installed_releases_locks(
    world: h.World, tmp_path: Path
) -> None:
    """The shipped release's lock, a statement signed by a registered key: one line each, exit 0;
    a forged one and an unreadable file: refused, exit 1 and 2, nothing kept of them."""
    data = tmp_path / "data"
    settings = world.settings(tmp_path, database=data / "verifier.sqlite3")
    db.migrate(settings.database)
    _register(settings.database, BUILDER)
    lock = parse_lock((ROOT / "ale/releases/locks/2026.11.json").read_bytes())
    entry = lock.images["evaluator"]
    good = tmp_path / "evaluator.intoto.json"
    good.write_bytes(signed(statement("evaluator", entry.digest, definition=entry.definition_sha256,
                                      layers=entry.layers), BUILDER))  # fmt: skip
    ok = _cli(data, "register-provenance", str(good))
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.splitlines() == [
        f"registered evaluator {entry.digest} (release 2026.11), signed by runner key {_runner(BUILDER).key_id} "
        "(benchmark_team)"
    ]
    kept = data / "provenance" / f"{entry.digest[7:]}.intoto.json"
    assert kept.read_bytes() == good.read_bytes()
    forged = tmp_path / "forged.intoto.json"
    forged.write_bytes(signed(statement("evaluator", entry.digest), Ed25519PrivateKey.generate()))
    refused = _cli(data, "register-provenance", str(forged))
    assert refused.returncode == 1
    assert refused.stderr.strip().splitlines() == [
        f"ale-verify: {forged}: provenance refused (untrusted_signer): no signature is by a registered runner key"
    ]
    gone = _cli(data, "register-provenance", str(tmp_path / "nope.json"))
    assert gone.returncode == 2
    assert "cannot read the statement" in gone.stderr
    assert sorted(p.name for p in (data / "provenance").iterdir()) == [kept.name]
