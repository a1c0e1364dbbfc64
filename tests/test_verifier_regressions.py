"""Issue 10's verifier findings, each through the real upload API (and ``ale inspect`` /
``ale-verify check`` where the offline checks are concerned): the right 4xx reason, never a 5xx,
never an accept; and the offline checks give the site's verdict.

Every hostile bundle here is a real ``ale run`` bundle with exactly one defect (the rest
re-sealed as a forger would), so the reason can only come from that defect.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyrage
import pytest
import verifier_helpers as h
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ale.core import bundle
from ale.core.signing import new_private_key_pem, sign_root


@pytest.fixture(scope="session")
def world(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest, db_engine: h.Databases) -> h.World:
    return h.get_world(tmp_path_factory, request.config, db_engine)


@pytest.fixture(scope="session")
def plain(world: h.World) -> dict[str, bytes]:
    return world.files("plain")


def _upload(world: h.World, tmp: Path, data: bytes) -> h.Reply:
    async def go() -> h.Reply:
        v = h.Verifier(world, tmp)
        reply = await v.upload(data)
        await v.assert_healthy()
        return reply

    return h.run(go())


def _rejected(world: h.World, tmp: Path, data: bytes, reason: str) -> dict[str, Any]:
    reply = _upload(world, tmp, data)
    assert reply.status == 422, reply.body
    body = reply.json
    assert (body["status"], body["level"], body["reason"]) == ("rejected", None, reason), body
    return dict(body)


def _with(world: h.World, files: dict[str, bytes], name: str, data: bytes) -> bytes:
    """The bundle with one file replaced (not re-sealed: the documents are checked before integrity)."""
    return h.encrypt_files({**files, name: data}, world.keys.recipient)


# -- point 1: one bounded parser ------------------------------------------------------------------

DEEP = b"[" * 200_000 + b"]" * 200_000 + b"\n"


def test_manifest_200k_nested_arrays_gives_schema_invalid_not_500(
    world: h.World, plain: dict[str, bytes], tmp_path: Path
) -> None:
    body = _rejected(world, tmp_path, _with(world, plain, "manifest.json", DEEP), "schema_invalid")
    assert "nested deeper" in body["reasons"][0]["message"]


@pytest.mark.parametrize("name", sorted(n for n in bundle.ALLOWED_FILES if n.endswith(".json")))
def test_any_document_200k_nested_gives_schema_invalid_not_500(
    world: h.World, plain: dict[str, bytes], tmp_path: Path, name: str
) -> None:
    deep_object = b'{"a":' * 100_000 + b"1" + b"}" * 100_000 + b"\n"
    for i, data in enumerate((DEEP, deep_object)):
        _rejected(world, tmp_path / str(i), _with(world, plain, name, data), "schema_invalid")


# -- point 3: one age payload, one zstd frame, one canonical tar ----------------------------------


def test_truncated_zstd_frame_is_truncated_zstd_not_bad_tar(
    world: h.World, plain: dict[str, bytes], tmp_path: Path
) -> None:
    frame = bundle.compress(bundle.build_tar(plain))
    _rejected(world, tmp_path, h.encrypt(frame[: len(frame) - 100], world.keys.recipient), "truncated_zstd")


def test_second_zstd_frame_after_the_first_is_refused(world: h.World, plain: dict[str, bytes], tmp_path: Path) -> None:
    forged = bundle.compress(bundle.build_tar({**plain, "manifest.json": b"{}\n"}))
    frame = bundle.compress(bundle.build_tar(plain))
    _rejected(world, tmp_path, h.encrypt(frame + forged, world.keys.recipient), "zstd_trailing_data")


def test_second_tar_with_its_own_manifest_after_the_end_is_refused(
    world: h.World, plain: dict[str, bytes], tmp_path: Path
) -> None:
    other = h.edit(plain, "manifest.json", lambda d: d["agent"].update(name="someone else"))
    tar = bundle.build_tar(plain) + bundle.build_tar(other)
    listing = subprocess.run(["tar", "-t", "-i", "-f", "-"], input=tar, capture_output=True, check=True, timeout=60)
    assert listing.stdout.decode().split().count("manifest.json") == 2  # what tar -i sees
    _rejected(world, tmp_path, h.encrypt(bundle.compress(tar), world.keys.recipient), "tar_trailing_data")


def test_setuid_member_is_unsafe_mode(world: h.World, plain: dict[str, bytes], tmp_path: Path) -> None:
    names = sorted(plain)
    tar = h.tar_end(
        b"".join(
            h.tar_entry(n, plain[n], **({"mode": b"0004755\0"} if n == "faithfulness.json" else {})) for n in names
        )
    )
    _rejected(world, tmp_path, h.encrypt(bundle.compress(tar), world.keys.recipient), "unsafe_mode")


def test_member_with_a_nonzero_mtime_is_tar_not_canonical(
    world: h.World, plain: dict[str, bytes], tmp_path: Path
) -> None:
    names = sorted(plain)
    tar = h.tar_end(
        b"".join(h.tar_entry(n, plain[n], **({"mtime": b"14777777777\0"} if n == names[0] else {})) for n in names)
    )
    _rejected(world, tmp_path, h.encrypt(bundle.compress(tar), world.keys.recipient), "tar_not_canonical")


def test_second_age_payload_is_refused(world: h.World, plain: dict[str, bytes], tmp_path: Path) -> None:
    one = h.encrypt_files(plain, world.keys.recipient)
    _rejected(world, tmp_path, one + h.encrypt_files(plain, world.keys.recipient), "decrypt_failed")


# -- point 4: the right reasons -------------------------------------------------------------------


def _recipients(world: h.World, n: int) -> list[str]:
    return [world.keys.recipient] + [str(pyrage.x25519.Identity.generate().to_public()) for _ in range(n - 1)]


def test_pyrage_bundle_to_8_recipients_is_accepted_like_the_age_cli(
    world: h.World, plain: dict[str, bytes], tmp_path: Path
) -> None:
    """pyrage adds a grease stanza the Go age CLI does not: only X25519 stanzas count."""
    frame = bundle.compress(bundle.build_tar(plain))
    pyrage_made = h.encrypt(frame, *_recipients(world, 8))
    (tmp_path / "plain").write_bytes(frame)
    args = [a for r in _recipients(world, 8) for a in ("-r", r)]
    subprocess.run(["age", *args, "-o", "cli.ale", "plain"], check=True, cwd=tmp_path, timeout=60)
    cli_made = (tmp_path / "cli.ale").read_bytes()
    assert len(bundle.parse_age_header(pyrage_made).stanzas) > len(bundle.parse_age_header(cli_made).stanzas)
    for i, data in enumerate((pyrage_made, cli_made)):
        reply = _upload(world, tmp_path / str(i), data)
        assert (reply.status, reply.json["status"]) == (201, "accepted"), reply.body
    for i, data in enumerate((h.encrypt(frame, *_recipients(world, 9)),)):
        _rejected(world, tmp_path / f"nine{i}", data, "too_many_stanzas")


ELEVATIONS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "manifest-top": ("manifest.json", lambda d: d.update(level="audited")),
    "manifest-nested-runtime": ("manifest.json", lambda d: d["runtime"]["code"].update(verified=True)),
    "manifest-nested-task-agent": ("manifest.json", lambda d: d["tasks"][0]["agent"].update(audited=True)),
    "manifest-declared-case-and-dash": (
        "manifest.json",
        lambda d: d["agent"]["declared"].update({"Verification-Level": "officially_verified"}),
    ),
    "score-breakdown-top": ("score_breakdown.json", lambda d: d.update(verified=True)),
    "score-breakdown-task": ("score_breakdown.json", lambda d: d["tasks"][0].update(level="officially_verified")),
    "score-breakdown-aggregate": ("score_breakdown.json", lambda d: d["aggregate"].update(officially_verified=True)),
    "task-results-episode": (
        "task_results.json",
        lambda d: d["tasks"][0]["result"]["episodes"][0].update(verified=True),
    ),
    "faithfulness-entry": (
        "faithfulness.json",
        lambda d: d["tasks"]["cartpole-balance@1.0.0"].update(verification_level="audited"),
    ),
    "network-summary-usage": ("network_summary.json", lambda d: d["usage"].update(level="validated")),
    "artifacts-manifest": ("artifacts_manifest.json", lambda d: d["artifacts"][0].update(audited=True)),
    "integrity": ("integrity.json", lambda d: d.update(officially_verified=True)),
}


@pytest.mark.parametrize("case", sorted(ELEVATIONS))
def test_self_elevation_anywhere_is_self_elevation_not_schema_invalid(
    world: h.World, plain: dict[str, bytes], tmp_path: Path, case: str
) -> None:
    name, change = ELEVATIONS[case]
    files = h.edit(plain, name, change)
    body = _rejected(world, tmp_path, h.encrypt_files(files, world.keys.recipient), "self_elevation")
    assert name in body["reasons"][0]["message"]


# -- point 6 (from point 2): no faithfulness verdict for an open-genre task --------------------------


@pytest.mark.parametrize(
    "verdict",
    [{"faithful": True, "judge_model": "judge@example", "outcome": "judged"}, {"faithful": False}],
    ids=["true", "false"],
)
def test_open_genre_task_with_a_faithfulness_verdict_is_refused(
    world: h.World, plain: dict[str, bytes], tmp_path: Path, verdict: dict[str, Any]
) -> None:
    assert json.loads(plain["manifest.json"])["tasks"][0]["genre"] == "open"
    files = h.edit(plain, "faithfulness.json", lambda d: d["tasks"]["cartpole-balance@1.0.0"].update(verdict))
    body = _rejected(world, tmp_path, h.encrypt_files(files, world.keys.recipient), "inconsistent_results")
    assert "open-genre" in body["reasons"][0]["message"]


def test_faithfulness_entries_must_be_the_runs_tasks(world: h.World, plain: dict[str, bytes], tmp_path: Path) -> None:
    extra = {"outcome": "open_genre", "faithful": None, "judge_model": None, "input_sha256": None,
             "rationale": "not in the run", "findings": [], "signature": None}  # fmt: skip
    files = h.edit(plain, "faithfulness.json", lambda d: d["tasks"].update({"hopper-hop@1.0.0": extra}))
    _rejected(world, tmp_path, h.encrypt_files(files, world.keys.recipient), "inconsistent_results")


# -- point 5: the offline checks are the site's ------------------------------------------------------


def _inspect(world: h.World, tmp: Path, ciphertext: bytes, *args: str) -> subprocess.CompletedProcess[str]:
    path = tmp / "b.ale"
    path.write_bytes(ciphertext)
    return subprocess.run(
        [*h.RUNNER_CLI, "inspect", str(path), "--identity", str(world.keys.key_file), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=h._env(),
    )


def _check(world: h.World, tmp: Path, ciphertext: bytes, *args: str) -> subprocess.CompletedProcess[str]:
    """``ale-verify check`` with the live site's data folder: its key and its registered runners."""
    path = tmp / "c.ale"
    path.write_bytes(ciphertext)
    return subprocess.run(
        [*h.VERIFY_CLI, "check", str(path), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=h._env(ALE_VERIFY_DATA=str(world.keys.data_dir)),
    )


def test_invalid_runner_signature_fails_offline_as_bad_signature_like_the_site(
    world: h.World, plain: dict[str, bytes], tmp_path: Path
) -> None:
    forged = sign_root(Ed25519PrivateKey.generate(), "00" * 32)  # a valid block over another root
    files = h.edit(plain, "integrity.json", lambda d: d.update(signature=forged), reseal=False)
    ciphertext = h.encrypt_files(files, world.keys.recipient)
    _rejected(world, tmp_path, ciphertext, "bad_signature")
    for proc in (_inspect(world, tmp_path, ciphertext), _check(world, tmp_path, ciphertext)):
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert "(bad_signature)" in proc.stderr
        assert "passed" not in proc.stdout + proc.stderr
        assert "Traceback" not in proc.stderr


def test_signature_registration_is_checked_offline_with_keys_and_said_unchecked_without(
    world: h.World, tmp_path: Path
) -> None:
    ciphertext = world.bundles["signed"]  # signed by the runner key registered on the live site
    unchecked = _inspect(world, tmp_path, ciphertext)
    assert unchecked.returncode == 0, unchecked.stderr
    assert "registration not checked" in unchecked.stdout
    assert "not checked: runner registration" in unchecked.stdout
    assert "not checked: challenge token" in unchecked.stdout
    given = _inspect(world, tmp_path, ciphertext, "--runner-public-key", world.runner_public, "--json")
    assert given.returncode == 0, given.stderr
    report = json.loads(given.stdout)
    assert report["signature"]["registered"] is True
    assert report["level_if_the_site_accepts_it"]["level"] == "officially_verified"
    assert not any("runner registration" in item for item in report["checks"]["not_checked"])
    other = new_private_key_pem()[1]
    wrong = _inspect(world, tmp_path, ciphertext, "--runner-public-key", other)
    assert wrong.returncode == 1
    assert "(unregistered_runner)" in wrong.stderr
    registered = _check(world, tmp_path, ciphertext)  # the live site's database has the key
    assert registered.returncode == 0, registered.stderr
    assert "a registered runner" in registered.stdout


def test_unregistered_signature_fails_ale_verify_check_like_the_site(
    world: h.World, plain: dict[str, bytes], tmp_path: Path
) -> None:
    stranger = Ed25519PrivateKey.generate()
    ciphertext = h.encrypt_files(h.seal(plain, runner_key=stranger), world.keys.recipient)
    _rejected(world, tmp_path, ciphertext, "unregistered_runner")
    proc = _check(world, tmp_path, ciphertext)
    assert proc.returncode == 1
    assert "(unregistered_runner)" in proc.stderr
    assert _inspect(world, tmp_path, ciphertext).returncode == 0  # no keys given: registration not checked
