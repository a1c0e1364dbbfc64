"""The upload pipeline, check by check: every check has a hostile upload that fails it, and after
each the service still answers and no temp file is left.

Hostile bundles are real ``ale run`` bundles, decrypted, edited and re-packed with everything a
forger would recompute (event hashes, file digests, Merkle root) so that only the intended check
fails; a control re-pack with no edit is accepted, which shows the re-packing itself is sound.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import re
import tarfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyrage
import pytest
import verifier_helpers as h
import zstandard
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st

from ale.core import bundle
from ale.core.signing import sign_root
from ale.core.trajectory import ChainError, verify_chain
from ale_verify import db, tokens
from ale_verify.pipeline import process_upload


@pytest.fixture(scope="session")
def world(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest, db_engine: h.Databases) -> h.World:
    return h.get_world(tmp_path_factory, request.config, db_engine)


@pytest.fixture(scope="session")
def plain(world: h.World) -> dict[str, bytes]:
    """A real run without a site (``--episodes 2``): no challenge, so any user may upload it."""
    return world.files("plain")


@pytest.fixture(scope="session")
def official(world: h.World) -> dict[str, bytes]:
    """A real run with official episode counts (made with ``--site``); tests re-bind it to their own
    challenge with :func:`verifier_helpers.rebind`."""
    return world.files("site")


def _upload(world: h.World, tmp: Path, data: bytes, **overrides: Any) -> tuple[h.Reply, h.Verifier]:
    async def go() -> tuple[h.Reply, h.Verifier]:
        v = h.Verifier(world, tmp, **overrides)
        reply = await v.upload(data)
        await v.assert_healthy()
        return reply, v

    return h.run(go())


def _assert_rejected(reply: h.Reply, reason: str) -> None:
    assert reply.status == 422, reply.body
    body = reply.json
    assert body["status"] == "rejected"
    assert body["level"] is None
    assert body["reason"] == reason, body
    assert body["reasons"][0]["reason"] == reason
    assert body["reasons"][0]["message"]


# -- controls: the re-packing is sound -----------------------------------------------------------


def test_control_repacked_real_bundle_is_accepted(world: h.World, plain: dict[str, bytes], tmp_path: Path) -> None:
    reply, _ = _upload(world, tmp_path, h.encrypt_files(h.seal(plain), world.keys.recipient))
    assert reply.status == 201, reply.body
    assert reply.json["status"] == "accepted"
    assert reply.json["level"] == "self_reported"


def test_control_rebound_bundle_is_validated(world: h.World, official: dict[str, bytes], tmp_path: Path) -> None:
    async def go() -> None:
        v = h.Verifier(world, tmp_path)
        c = await v.challenge()
        reply = await v.upload(h.encrypt_files(h.rebind(official, c["nonce"], c["token"]), world.keys.recipient))
        assert reply.status == 201, reply.body
        assert (reply.json["level"], reply.json["reasons"]) == ("validated", [])
        await v.assert_healthy()

    h.run(go())


# -- the encrypted container: age, zstd, tar -------------------------------------------------------


def _zstd_bomb(world: h.World, files: dict[str, bytes]) -> bytes:
    """About 70 MB of zeros after the real tar: a few kB compressed, past the 64 MiB limit."""
    cctx = zstandard.ZstdCompressor(level=3)
    out = io.BytesIO()
    with cctx.stream_writer(out, closefd=False) as writer:
        writer.write(bundle.build_tar(files))
        zeros = b"\0" * (1 << 20)
        for _ in range(70):
            writer.write(zeros)
    assert len(out.getvalue()) < 100_000
    return h.encrypt(out.getvalue(), world.keys.recipient)


def _tar_bundle(world: h.World, *members: tuple[tarfile.TarInfo, bytes | None]) -> bytes:
    return h.encrypt(bundle.compress(h.raw_tar(*members)), world.keys.recipient)


def _with_member(world: h.World, files: dict[str, bytes], extra: tuple[tarfile.TarInfo, bytes | None]) -> bytes:
    return _tar_bundle(world, *h.regular_members(files)[:4], extra, *h.regular_members(files)[4:])


def _other_recipient() -> str:
    return str(pyrage.x25519.Identity.generate().to_public())


def _sealed(files: dict[str, bytes]) -> dict[str, bytes]:
    return h.seal(files)


CONTAINER_CASES: dict[str, tuple[Callable[[h.World, dict[str, bytes]], bytes], str]] = {
    "not-age": (lambda w, f: b"PK\x03\x04 this is a zip file, not a bundle", "not_age"),
    "age-header-cut": (lambda w, f: h.encrypt_files(f, w.keys.recipient)[:60], "bad_age_header"),
    "truncated-payload": (lambda w, f: h.encrypt_files(f, w.keys.recipient)[:-100], "decrypt_failed"),
    "truncated-last-byte": (lambda w, f: h.encrypt_files(f, w.keys.recipient)[:-1], "decrypt_failed"),
    "wrong-recipient": (lambda w, f: h.encrypt_files(f, _other_recipient()), "decrypt_failed"),
    "too-many-stanzas": (
        lambda w, f: h.encrypt(
            bundle.compress(bundle.build_tar(f)), w.keys.recipient, *(_other_recipient() for _ in range(8))
        ),
        "too_many_stanzas",
    ),
    "not-zstd": (lambda w, f: h.encrypt(bundle.build_tar(f), w.keys.recipient), "bad_zstd"),
    "zstd-bomb": (_zstd_bomb, "decompressed_too_large"),
    "not-tar": (lambda w, f: h.encrypt(bundle.compress(b"\x01garbage" * 200), w.keys.recipient), "bad_tar"),
    "empty-tar": (lambda w, f: h.encrypt(bundle.compress(b"\0" * 1024), w.keys.recipient), "bad_tar"),
    "path-traversal": (lambda w, f: _with_member(w, f, h.member("../escape.json", data=b"{}")), "path_traversal"),
    "path-traversal-nested": (
        lambda w, f: _with_member(w, f, h.member("a/../../escape", data=b"x")),
        "path_traversal",
    ),
    "absolute-path": (lambda w, f: _with_member(w, f, h.member("/etc/cron.d/evil", data=b"x")), "absolute_path"),
    "symlink": (
        lambda w, f: _with_member(w, f, h.member("notes.txt", tarfile.SYMTYPE, link="/etc/shadow")),
        "symlink",
    ),
    "hardlink": (
        lambda w, f: _with_member(w, f, h.member("notes.txt", tarfile.LNKTYPE, link="manifest.json")),
        "hardlink",
    ),
    "char-device": (lambda w, f: _with_member(w, f, h.member("null", tarfile.CHRTYPE)), "device"),
    "block-device": (lambda w, f: _with_member(w, f, h.member("disk", tarfile.BLKTYPE)), "device"),
    "fifo": (lambda w, f: _with_member(w, f, h.member("pipe", tarfile.FIFOTYPE)), "device"),
    "directory": (lambda w, f: _with_member(w, f, h.member("dir", tarfile.DIRTYPE)), "directory"),
    "duplicate-member": (
        lambda w, f: _with_member(w, f, h.member("manifest.json", data=f["manifest.json"])),
        "duplicate_member",
    ),
    "too-many-files": (
        lambda w, f: _tar_bundle(w, *h.regular_members(f), *(h.member(f"x{i}.json", data=b"{}") for i in range(9))),
        "too_many_files",
    ),
    "extra-file": (lambda w, f: h.encrypt_files({**f, "notes.txt": b"hello\n"}, w.keys.recipient), "unexpected_file"),
    "missing-file": (
        lambda w, f: h.encrypt_files({n: d for n, d in f.items() if n != "faithfulness.json"}, w.keys.recipient),
        "missing_file",
    ),
}


@pytest.mark.parametrize("case", sorted(CONTAINER_CASES))
def test_container_check_fails(world: h.World, plain: dict[str, bytes], tmp_path: Path, case: str) -> None:
    build, reason = CONTAINER_CASES[case]
    reply, _ = _upload(world, tmp_path, build(world, dict(plain)))
    _assert_rejected(reply, reason)


def test_file_too_large(world: h.World, plain: dict[str, bytes], tmp_path: Path) -> None:
    reply, _ = _upload(world, tmp_path, h.encrypt_files(plain, world.keys.recipient), max_file_bytes=1024)
    _assert_rejected(reply, "file_too_large")


def test_decompressed_limit_is_a_setting(world: h.World, plain: dict[str, bytes], tmp_path: Path) -> None:
    data = h.encrypt_files(plain, world.keys.recipient)
    reply, _ = _upload(world, tmp_path, data, max_decompressed_bytes=4096)
    _assert_rejected(reply, "decompressed_too_large")


def test_empty_upload(world: h.World, tmp_path: Path) -> None:
    reply, _ = _upload(world, tmp_path, b"")
    assert (reply.status, reply.reason) == (400, "empty_upload")


# -- the documents --------------------------------------------------------------------------------


def _replace(files: dict[str, bytes], name: str, data: bytes) -> dict[str, bytes]:
    return h.seal({**files, name: data})


def _set(path: str, value: Any) -> Callable[[Any], None]:
    keys = path.split(".")

    def change(doc: Any) -> None:
        for k in keys[:-1]:
            doc = doc[int(k)] if isinstance(doc, list) else doc[k]
        if isinstance(doc, list):
            doc[int(keys[-1])] = value
        else:
            doc[keys[-1]] = value

    return change


def _events_bomb() -> bytes:
    """A trajectory of a few kB that decompresses past the 256 MiB trajectory limit."""
    out = io.BytesIO()
    with zstandard.ZstdCompressor(level=1).stream_writer(out, closefd=False) as writer:
        line = b"\n" * (1 << 20)
        for _ in range(257):
            writer.write(line)
    return out.getvalue()


def _pop(doc: dict[str, Any], key: str) -> None:
    del doc[key]


def _score(doc: dict[str, Any]) -> None:
    doc["tasks"][0]["final"] = 1.25


def _drop_event(files: dict[str, bytes], index: int, *, rehash: bool) -> dict[str, bytes]:
    events = h.read_events(files)
    del events[index]
    return h.seal(h.with_events(files, h.rehash(events) if rehash else events))


def _swap_events(files: dict[str, bytes], i: int, j: int, *, rehash: bool) -> dict[str, bytes]:
    events = h.read_events(files)
    events[i], events[j] = events[j], events[i]
    return h.seal(h.with_events(files, h.rehash(events) if rehash else events))


def _edit_event(files: dict[str, bytes], index: int) -> dict[str, bytes]:
    """Change an event's content but keep its recorded hash: the chain's hash check must fail."""
    events = h.read_events(files)
    events[index]["data"]["text"] = "rm -rf / (edited after the fact)"
    return h.seal(h.with_events(files, events))


def _add_task(doc: dict[str, Any]) -> None:
    from ale import catalog

    hopper = catalog.get_task("hopper-hop")
    s = hopper.spec
    doc["tasks"].append(
        {
            "id": s.id,
            "version": s.version,
            "digest": hopper.digest,
            "genre": s.genre,
            "mode": s.mode,
            "official_episodes": s.official_episodes,
            "episodes_run": 2,
            "agent": doc["tasks"][0]["agent"],
            "network": doc["tasks"][0]["network"],
        }
    )


def _active_past_wall_time(doc: dict[str, Any]) -> None:
    """A runtime longer than the run's wall-clock span (finished - started): no run's can be."""
    from ale.core.documents import wall_seconds

    run = doc["run"]
    run["active_s"] = round(wall_seconds(run["finished"]) - wall_seconds(run["started"]) + 3600, 6)


def _claim_full_coverage(doc: dict[str, Any]) -> None:
    agg = doc["aggregate"]
    agg["covered"] = sorted(agg["covered"] + agg["missing"])
    agg["missing"] = []
    agg["coverage_complete"] = True


DOCUMENT_CASES: dict[str, tuple[Callable[[dict[str, bytes]], dict[str, bytes]], str]] = {
    "malformed-json": (
        lambda f: _replace(f, "manifest.json", b'{"schema": "ale-bundle-manifest/v1",\n'),
        "schema_invalid",
    ),
    "not-utf8": (lambda f: _replace(f, "task_results.json", b"\xff\xfe{}\n"), "schema_invalid"),
    "json-not-canonical": (
        lambda f: _replace(f, "network_summary.json", f["network_summary.json"].replace(b",", b", ")),
        "schema_invalid",
    ),
    "json-array": (lambda f: _replace(f, "faithfulness.json", b"[]\n"), "schema_invalid"),
    "schema-wrong-type": (lambda f: h.edit(f, "manifest.json", _set("run_id", 12345)), "schema_invalid"),
    "schema-unknown-field": (lambda f: h.edit(f, "network_summary.json", _set("extra", 1)), "schema_invalid"),
    "schema-wrong-document": (
        lambda f: h.edit(f, "integrity.json", _set("schema", "ale-bundle-integrity/v0")),
        "schema_invalid",
    ),
    "schema-missing-field": (lambda f: h.edit(f, "score_breakdown.json", lambda d: _pop(d, "cap")), "schema_invalid"),
    "manifest-active-s-past-wall-time": (
        lambda f: h.edit(f, "manifest.json", _active_past_wall_time),
        "schema_invalid",
    ),
    # the trajectory's zstd frame gets the same reasons as the bundle's own (was schema_invalid, too_large)
    "events-not-zstd": (lambda f: _replace(f, "events.jsonl.zst", b"plain text events\n"), "bad_zstd"),
    "events-zstd-bomb": (lambda f: _replace(f, "events.jsonl.zst", _events_bomb()), "decompressed_too_large"),
    "results-self-contradicting": (
        lambda f: h.edit(f, "task_results.json", _set("tasks.0.result.headline_value", 499.0)),
        "inconsistent_results",
    ),
    "chain-edited-event": (lambda f: _edit_event(f, 5), "chain_invalid"),
    "chain-dropped-event": (lambda f: _drop_event(f, 7, rehash=False), "chain_invalid"),
    "chain-dropped-event-rehashed": (lambda f: _drop_event(f, 7, rehash=True), "chain_invalid"),
    "chain-dropped-first-event": (lambda f: _drop_event(f, 0, rehash=True), "chain_invalid"),
    "chain-reordered": (lambda f: _swap_events(f, 5, 6, rehash=False), "chain_invalid"),
    "chain-reordered-rehashed": (lambda f: _swap_events(f, 8, 12, rehash=True), "chain_invalid"),
    "integrity-wrong-root": (
        lambda f: h.edit(f, "integrity.json", _set("merkle_root", "ab" * 32), reseal=False),
        "integrity_mismatch",
    ),
    "integrity-wrong-chain-head": (
        lambda f: h.edit(f, "integrity.json", _set("chain_head", "cd" * 32), reseal=False),
        "integrity_mismatch",
    ),
    "integrity-file-digest-wrong": (
        lambda f: h.edit(
            f, "integrity.json", lambda d: d["files"].update({"faithfulness.json": "12" * 32}), reseal=False
        ),
        "integrity_mismatch",
    ),
    "manifest-trajectory-summary": (
        lambda f: h.edit(f, "manifest.json", lambda d: d["trajectory"].update(events=d["trajectory"]["events"] + 1)),
        "integrity_mismatch",
    ),
    "unknown-release": (
        lambda f: h.edit(f, "manifest.json", _set("release.manifest_sha256", "ee" * 32)),
        "unknown_release",
    ),
    "unknown-task-version": (
        lambda f: h.edit(f, "manifest.json", _set("tasks.0.version", "9.9.9")),
        "unknown_task_version",
    ),
    "unknown-task-digest": (
        lambda f: h.edit(f, "manifest.json", _set("tasks.0.digest", "0f" * 32)),
        "unknown_task_version",
    ),
    "task-misstated": (lambda f: h.edit(f, "manifest.json", _set("tasks.0.official_episodes", 2)), "task_mismatch"),
    "coverage-task-without-result": (lambda f: h.edit(f, "manifest.json", _add_task), "inconsistent_results"),
    "coverage-claimed-complete": (lambda f: h.edit(f, "score_breakdown.json", _claim_full_coverage), "score_mismatch"),
    "claimed-score-higher": (lambda f: h.edit(f, "score_breakdown.json", _score), "score_mismatch"),
    "claimed-macro-mean": (
        lambda f: h.edit(f, "score_breakdown.json", _set("aggregate.macro_mean", 0.999)),
        "score_mismatch",
    ),
    "claimed-pass-rate": (
        lambda f: h.edit(f, "score_breakdown.json", _set("aggregate.pass_rate", 0.5)),
        "score_mismatch",
    ),
    "faithful-without-judge": (
        lambda f: h.edit(f, "faithfulness.json", lambda d: d["tasks"]["cartpole-balance@1.0.0"].update(faithful=True)),
        "inconsistent_results",
    ),
    "self-elevation-declared": (
        lambda f: h.edit(f, "manifest.json", _set("agent.declared.verification_level", "audited")),
        "self_elevation",
    ),
    "self-elevation-declared-level": (
        lambda f: h.edit(f, "manifest.json", _set("agent.declared.officially_verified", True)),
        "self_elevation",
    ),
    "bad-signature": (
        lambda f: h.edit(
            f, "integrity.json", _set("signature", sign_root(Ed25519PrivateKey.generate(), "00" * 32)), reseal=False
        ),
        "bad_signature",
    ),
}


@pytest.mark.parametrize("case", sorted(DOCUMENT_CASES))
def test_document_check_fails(world: h.World, plain: dict[str, bytes], tmp_path: Path, case: str) -> None:
    build, reason = DOCUMENT_CASES[case]
    reply, _ = _upload(world, tmp_path, h.encrypt_files(build(dict(plain)), world.keys.recipient))
    _assert_rejected(reply, reason)


def test_self_elevation_manifest_field_is_named(world: h.World, plain: dict[str, bytes], tmp_path: Path) -> None:
    """A manifest claiming a level is refused as self-elevation (the issue's reason code), whatever
    the manifest schema says about unknown fields: a schema_invalid would hide the attempt."""
    for field in ("verification_level", "level", "audited"):
        files = h.edit(plain, "manifest.json", _set(field, "audited"))
        reply, _ = _upload(world, tmp_path / field, h.encrypt_files(files, world.keys.recipient))
        _assert_rejected(reply, "self_elevation")


def test_required_task_set_hash_must_be_the_releases(world: h.World, plain: dict[str, bytes], tmp_path: Path) -> None:
    """Coverage is measured against the release's required task set; a manifest naming another set
    (another hash) is not the release it claims, and must not be accepted."""
    files = h.edit(plain, "manifest.json", _set("release.required_task_set_hash", "0" * 64))
    reply, _ = _upload(world, tmp_path, h.encrypt_files(files, world.keys.recipient))
    assert reply.status == 422, reply.body
    assert reply.json["reason"] in {"unknown_release", "task_mismatch", "inconsistent_results", "coverage_mismatch"}


def test_results_must_belong_to_the_challenged_run(world: h.World, official: dict[str, bytes], tmp_path: Path) -> None:
    """The challenge's nonce makes the trajectory fresh; results spliced in from another (older,
    better) run must not ride on it. The trajectory's first event names its run: a manifest and
    results of another run id are not this trajectory's."""

    async def go() -> None:
        v = h.Verifier(world, tmp_path)
        other = world.files("signed")
        other_run = h.jdoc(other, "manifest.json")["run_id"]
        assert h.read_events(official)[0]["data"]["run_id"] != other_run
        c = await v.challenge()
        files = h.rebind(official, c["nonce"], c["token"])
        files["task_results.json"] = other["task_results.json"]
        files["score_breakdown.json"] = other["score_breakdown.json"]
        files = h.edit(files, "manifest.json", _set("run_id", other_run))
        reply = await v.upload(h.encrypt_files(files, world.keys.recipient))
        assert reply.status == 422, reply.body
        assert reply.json["reason"] in {"inconsistent_results", "chain_invalid", "integrity_mismatch"}
        await v.assert_healthy()

    h.run(go())


def test_manifest_episode_count_must_match_the_results(world: h.World, plain: dict[str, bytes], tmp_path: Path) -> None:
    """A manifest saying 100 episodes ran, over results of 2, is not self-consistent."""
    files = h.edit(plain, "manifest.json", _set("tasks.0.episodes_run", 100))
    reply, _ = _upload(world, tmp_path, h.encrypt_files(files, world.keys.recipient))
    assert reply.status == 422, reply.body
    assert reply.json["reason"] in {"inconsistent_results", "task_mismatch"}


def test_incomplete_coverage_is_reported_not_hidden(world: h.World, plain: dict[str, bytes], tmp_path: Path) -> None:
    reply, v = _upload(world, tmp_path, h.encrypt_files(plain, world.keys.recipient))
    assert reply.status == 201
    summary = h.run(v.submission(reply.json["id"]))["summary"]
    assert summary["coverage_complete"] is False
    assert summary["covered"] == ["cartpole-balance@1.0.0"]
    assert sorted(summary["missing"]) == ["hopper-hop@1.0.0", "pendulum-lqr@1.0.0", "reacher-jacobian@1.0.0"]


def _flip_text(data: bytes, anchor: bytes) -> bytes:
    """Flip one bit (ASCII case) of the first letter after ``anchor``: the JSON stays well-formed."""
    start = data.index(anchor) + len(anchor)
    pos = start + re.search(rb"[a-zA-Z]", data[start:]).start()  # type: ignore[union-attr]
    return data[:pos] + bytes([data[pos] ^ 0x20]) + data[pos + 1 :]


def _flip_digit(data: bytes, anchor: bytes) -> bytes:
    pos = data.index(anchor) + len(anchor)
    assert data[pos : pos + 1].isdigit()
    return data[:pos] + bytes([data[pos] ^ 0x01]) + data[pos + 1 :]


def _flip_hex(data: bytes, anchor: bytes) -> bytes:
    pos = data.index(anchor) + len(anchor)
    new = b"1" if data[pos : pos + 1] == b"0" else b"0"
    return data[:pos] + new + data[pos + 1 :]


FLIPS: dict[str, tuple[Callable[[bytes], bytes], str]] = {
    "artifacts_manifest.json": (lambda d: _flip_text(d, b'"path":"/'), "integrity_mismatch"),
    "events.jsonl.zst": (
        lambda d: d[: len(d) // 2] + bytes([d[len(d) // 2] ^ 0x01]) + d[len(d) // 2 + 1 :],
        "bad_zstd",
    ),
    "faithfulness.json": (lambda d: _flip_text(d, b'"rationale":"'), "integrity_mismatch"),
    "integrity.json": (lambda d: _flip_hex(d, b'"merkle_root":"'), "integrity_mismatch"),
    "manifest.json": (lambda d: _flip_text(d, b'"name":"ale-'), "integrity_mismatch"),
    "network_summary.json": (lambda d: _flip_text(d, b'"policy":"'), "integrity_mismatch"),
    "score_breakdown.json": (lambda d: _flip_digit(d, b'"paper_value":'), "integrity_mismatch"),
    "task_results.json": (lambda d: _flip_text(d, b'"run_id":"'), "integrity_mismatch"),
}


def test_flip_table_covers_every_file() -> None:
    assert sorted(FLIPS) == sorted(bundle.ALLOWED_FILES)


@pytest.mark.parametrize("name", sorted(bundle.ALLOWED_FILES))
def test_flipped_byte_in_any_file(world: h.World, plain: dict[str, bytes], tmp_path: Path, name: str) -> None:
    flip, reason = FLIPS[name]
    flipped = flip(plain[name])
    assert len(flipped) == len(plain[name])
    assert sum(a != b for a, b in zip(flipped, plain[name], strict=True)) == 1
    reply, _ = _upload(world, tmp_path, h.encrypt_files({**plain, name: flipped}, world.keys.recipient))
    _assert_rejected(reply, reason)


def test_flipped_byte_in_trajectory_text(world: h.World, plain: dict[str, bytes], tmp_path: Path) -> None:
    raw = h.events_bytes(h.read_events(plain))
    flipped = _flip_text(raw, b'"kind":"')
    files = {**plain, "events.jsonl.zst": zstandard.ZstdCompressor(write_checksum=True).compress(flipped)}
    reply, _ = _upload(world, tmp_path, h.encrypt_files(files, world.keys.recipient))
    _assert_rejected(reply, "chain_invalid")


# -- challenge tokens -----------------------------------------------------------------------------


def _bound(world: h.World, files: dict[str, bytes], challenge: dict[str, Any]) -> bytes:
    return h.encrypt_files(h.rebind(files, challenge["nonce"], challenge["token"]), world.keys.recipient)


def test_forged_token(world: h.World, official: dict[str, bytes], tmp_path: Path) -> None:
    async def go() -> None:
        v = h.Verifier(world, tmp_path)
        c = v.direct_challenge()
        forged = tokens.issue(
            b"not the site's key" * 2,
            challenge_id=c["challenge_id"],
            nonce=c["nonce"],
            user_id=h.PARTICIPANT,
            expires_at=c["expires_at"],
        )
        _assert_rejected(await v.upload(_bound(world, official, {**c, "token": forged})), "token_invalid")
        await v.assert_healthy()
        garbage = {**c, "token": "v1.e30.AAAA"}
        _assert_rejected(await v.upload(_bound(world, official, garbage)), "token_invalid")
        await v.assert_healthy()
        # the real token still works: a forgery does not burn the challenge
        reply = await v.upload(_bound(world, official, c))
        assert reply.status == 201
        assert reply.json["level"] == "validated"

    h.run(go())


def test_token_for_a_challenge_the_site_never_issued(
    world: h.World, official: dict[str, bytes], tmp_path: Path
) -> None:
    async def go() -> None:
        v = h.Verifier(world, tmp_path)
        nonce = "ab" * 32
        token = tokens.issue(
            world.keys.signing_key, challenge_id="chl_nope", nonce=nonce, user_id=h.PARTICIPANT, expires_at=2e9
        )
        _assert_rejected(await v.upload(_bound(world, official, {"nonce": nonce, "token": token})), "token_invalid")
        await v.assert_healthy()

    h.run(go())


def test_expired_token(world: h.World, official: dict[str, bytes], tmp_path: Path) -> None:
    async def go() -> None:
        v = h.Verifier(world, tmp_path)
        c = v.direct_challenge(ttl_s=-10)
        _assert_rejected(await v.upload(_bound(world, official, c)), "token_expired")
        await v.assert_healthy()

    h.run(go())


def test_replayed_token(world: h.World, official: dict[str, bytes], tmp_path: Path) -> None:
    async def go() -> None:
        v = h.Verifier(world, tmp_path)
        c = await v.challenge()
        data = _bound(world, official, c)
        first = await v.upload(data)
        assert first.status == 201
        assert first.json["level"] == "validated"
        again = await v.upload(data)
        _assert_rejected(again, "token_replayed")
        # re-encrypting (a different ciphertext) does not help
        _assert_rejected(await v.upload(_bound(world, official, c)), "token_replayed")
        await v.assert_healthy()
        assert (await v.submission(first.json["id"]))["level"] == "validated"

    h.run(go())


def test_challenge_of_another_user(world: h.World, official: dict[str, bytes], tmp_path: Path) -> None:
    async def go() -> None:
        v = h.Verifier(world, tmp_path)
        c = await v.challenge(user="someone-else")
        _assert_rejected(await v.upload(_bound(world, official, c), user=h.PARTICIPANT), "token_invalid")
        await v.assert_healthy()

    h.run(go())


def test_nonce_mismatch(world: h.World, official: dict[str, bytes], tmp_path: Path) -> None:
    async def go() -> None:
        v = h.Verifier(world, tmp_path)
        c1, c2 = await v.challenge(), await v.challenge()
        # the trajectory binds challenge 2's nonce; the manifest presents challenge 1
        files = h.rebind(official, c2["nonce"], c1["token"])
        files = h.edit(files, "manifest.json", _set("challenge.nonce", c1["nonce"]))
        _assert_rejected(await v.upload(h.encrypt_files(files, world.keys.recipient)), "nonce_mismatch")
        # the manifest's nonce is not the token's
        files = h.rebind(official, c2["nonce"], c2["token"])
        files = h.edit(files, "manifest.json", _set("challenge.nonce", "ff" * 32))
        _assert_rejected(await v.upload(h.encrypt_files(files, world.keys.recipient)), "nonce_mismatch")
        await v.assert_healthy()

    h.run(go())


def test_replay_race_in_process(world: h.World, official: dict[str, bytes], tmp_path: Path) -> None:
    """Ten concurrent uploads of one challenge-bound bundle through the app: exactly one wins."""

    async def go() -> None:
        v = h.Verifier(world, tmp_path)
        c = await v.challenge()
        data = _bound(world, official, c)
        replies = await asyncio.gather(*(v.upload(data) for _ in range(10)))
        accepted = [r for r in replies if r.status == 201]
        assert len(accepted) == 1, [r.json for r in replies]
        assert accepted[0].json["level"] == "validated"
        for r in replies:
            if r is not accepted[0]:
                _assert_rejected(r, "token_replayed")
        await v.assert_healthy()
        row = db.get_challenge(v.settings.database, c["challenge_id"])
        assert row is not None
        assert row["used_by_submission"] == accepted[0].json["id"]

    h.run(go())


def test_replay_race_in_threads(world: h.World, official: dict[str, bytes], tmp_path: Path) -> None:
    """The same race one level down: process_upload in ten threads, each with its own temp file."""
    v = h.Verifier(world, tmp_path)
    c = v.direct_challenge()
    data = _bound(world, official, c)
    v.settings.tmp_dir.mkdir(parents=True, exist_ok=True)
    barrier = threading.Barrier(10)
    outcomes: list[Any] = []
    errors: list[BaseException] = []

    def one(i: int) -> None:
        path = v.settings.tmp_dir / f"race-{i}.ale"
        path.write_bytes(data)
        barrier.wait()
        try:
            outcomes.append(process_upload(path, v.settings, world.keys.signing_key, user_id=h.PARTICIPANT))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert sorted(o.status for o in outcomes) == ["accepted"] + ["rejected"] * 9
    assert {o.reason for o in outcomes if o.status == "rejected"} == {"token_replayed"}
    assert list(v.settings.tmp_dir.iterdir()) == []


# -- property-based tamper tests on the codecs ----------------------------------------------------


@pytest.fixture(scope="module")
def tamper_env(world: h.World, plain: dict[str, bytes], tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("tamper")
    v = h.Verifier(world, tmp)
    v.settings.tmp_dir.mkdir(parents=True, exist_ok=True)
    counter = iter(range(10**9))

    def verdict(ciphertext: bytes) -> Any:
        path = v.settings.tmp_dir / f"t{next(counter)}.ale"
        path.write_bytes(ciphertext)
        outcome = process_upload(path, v.settings, world.keys.signing_key, user_id=h.PARTICIPANT)
        assert not path.exists()
        return outcome

    db.upsert_user(v.settings.database, h.PARTICIPANT, h.PARTICIPANT, "local")
    ciphertext = h.encrypt_files(plain, world.keys.recipient)
    assert verdict(ciphertext).status == "accepted"
    return verdict, ciphertext


FAST = settings(max_examples=30, deadline=None)


@FAST
@given(data=st.data())
def test_property_flipped_ciphertext_byte_is_rejected(tamper_env: Any, world: h.World, data: st.DataObject) -> None:
    verdict, ciphertext = tamper_env
    pos = data.draw(st.integers(0, len(ciphertext) - 1), label="position")
    mask = data.draw(st.integers(1, 255), label="xor")
    tampered = ciphertext[:pos] + bytes([ciphertext[pos] ^ mask]) + ciphertext[pos + 1 :]
    with pytest.raises(bundle.BundleError) as info:
        bundle.unpack(tampered, world.keys.identity)
    assert info.value.reason in h.REJECTION_REASONS
    outcome = verdict(tampered)
    assert outcome.status == "rejected"
    assert outcome.reason in h.REJECTION_REASONS


@FAST
@given(cut=st.integers(0, 10**6))
def test_property_truncated_ciphertext_is_rejected(tamper_env: Any, world: h.World, cut: int) -> None:
    verdict, ciphertext = tamper_env
    truncated = ciphertext[: cut % len(ciphertext)]
    with pytest.raises(bundle.BundleError):
        bundle.unpack(truncated, world.keys.identity)
    outcome = verdict(truncated)
    assert outcome.status == "rejected"
    assert outcome.reason in h.REJECTION_REASONS


@FAST
@given(data=st.data())
def test_property_flipped_zstd_or_tar_byte(
    tamper_env: Any, world: h.World, plain: dict[str, bytes], data: st.DataObject
) -> None:
    """A flip inside the compressed frame or the tar, encrypted correctly: refused, or (tar padding)
    the very same files come out and the bundle is as valid as before; never anything else."""
    verdict, _ = tamper_env
    layer = data.draw(st.sampled_from(["zstd", "tar"]), label="layer")
    tar = bundle.build_tar(plain)
    blob = bundle.compress(tar) if layer == "zstd" else tar
    pos = data.draw(st.integers(0, len(blob) - 1), label="position")
    mask = data.draw(st.integers(1, 255), label="xor")
    blob = blob[:pos] + bytes([blob[pos] ^ mask]) + blob[pos + 1 :]
    compressed = blob if layer == "zstd" else bundle.compress(blob)
    ciphertext = h.encrypt(compressed, world.keys.recipient)
    try:
        same, reason = bundle.unpack(ciphertext, world.keys.identity) == plain, None
    except bundle.BundleError as exc:
        same, reason = False, exc.reason
    assert reason is None or reason in h.REJECTION_REASONS
    outcome = verdict(ciphertext)
    if same:
        assert outcome.status == "accepted"
    else:
        assert outcome.status == "rejected"
        assert outcome.reason in h.REJECTION_REASONS


@FAST
@given(data=st.data())
def test_property_flipped_byte_in_any_file_is_rejected(
    tamper_env: Any, world: h.World, plain: dict[str, bytes], data: st.DataObject
) -> None:
    verdict, _ = tamper_env
    name = data.draw(st.sampled_from(sorted(bundle.ALLOWED_FILES)), label="file")
    raw = plain[name]
    pos = data.draw(st.integers(0, len(raw) - 1), label="position")
    mask = data.draw(st.integers(1, 255), label="xor")
    files = {**plain, name: raw[:pos] + bytes([raw[pos] ^ mask]) + raw[pos + 1 :]}
    outcome = verdict(h.encrypt_files(files, world.keys.recipient))
    assert outcome.status == "rejected"
    assert outcome.reason in h.REJECTION_REASONS


@FAST
@given(data=st.data())
def test_property_flipped_trajectory_byte_breaks_the_chain(plain: dict[str, bytes], data: st.DataObject) -> None:
    raw = h.events_bytes(h.read_events(plain))
    verify_chain(raw)  # the original is a valid chain
    pos = data.draw(st.integers(0, len(raw) - 1), label="position")
    mask = data.draw(st.integers(1, 255), label="xor")
    with pytest.raises(ChainError):
        verify_chain(raw[:pos] + bytes([raw[pos] ^ mask]) + raw[pos + 1 :])


@FAST
@given(data=st.data())
def test_property_rehashed_chain_still_needs_its_integrity_root(
    tamper_env: Any, world: h.World, plain: dict[str, bytes], data: st.DataObject
) -> None:
    """A forger who edits an event and re-hashes the chain, but cannot update integrity.json's chain
    head (say, because it is signed), is caught by the integrity check."""
    verdict, _ = tamper_env
    events = h.read_events(plain)
    index = data.draw(st.integers(1, len(events) - 1), label="event")
    events[index]["data"]["forged"] = data.draw(st.text(max_size=20), label="value")
    files = h.with_events(plain, h.rehash(events), summary=False)
    outcome = verdict(h.encrypt_files(files, world.keys.recipient))
    assert (outcome.status, outcome.reason) == ("rejected", "integrity_mismatch")


def test_rejections_are_stored_never_ranked(world: h.World, plain: dict[str, bytes], tmp_path: Path) -> None:
    async def go() -> None:
        v = h.Verifier(world, tmp_path)
        data = h.encrypt_files(h.edit(plain, "score_breakdown.json", _score), world.keys.recipient)
        bad = await v.upload(data)
        _assert_rejected(bad, "score_mismatch")
        stored = await v.submission(bad.json["id"])
        assert (stored["status"], stored["level"], stored["reason"]) == ("rejected", None, "score_mismatch")
        assert stored["history"][0]["action"] == "rejected"
        assert stored["history"][0]["actor"] == "verifier"
        assert stored["summary"]["ciphertext_sha256"] == hashlib.sha256(data).hexdigest()
        board = await v.get("/api/v1/leaderboard")
        assert board.status == 200
        assert board.json["rows"] == []
        await v.assert_healthy()

    h.run(go())
