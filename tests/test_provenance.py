"""Image provenance: ``ale images attest`` writes an in-toto Statement v1 with a SLSA Provenance v1
predicate for a built layout (its manifest digest as the subject, the definition's SHA-256, every
pin and project file by SHA-256, the builder, the config and layers), optionally in a DSSE
envelope signed with a runner's Ed25519 key; the verifier checks it against the lock and refuses a
statement for another digest, a tampered one, an unsigned one (unless allowed) and one signed by a
key it does not trust. On the miniature image of tests/images_helpers.py: offline, a second."""

from __future__ import annotations

import base64
import contextlib
import copy
import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fuzzing import fuzz_settings, hostile_json, json_values
from hypothesis import assume, given
from hypothesis import strategies as st
from images_helpers import mini_image

from ale.core import provenance
from ale.core.canonical import CanonicalError, canonical_json
from ale.core.provenance import ProvenanceError
from ale.core.signing import key_id, new_private_key_pem, public_raw
from ale.core.verify import RunnerKey
from ale.images import attest as lockfile
from ale.images import definition
from ale.images.attest import AttestError
from ale.images.build import Built, build_image
from ale.images.provenance import attest
from ale_verify import db

EPOCH = 1700000000


@attrs.frozen
class Mini:
    checkout: Path
    defn: definition.Definition
    built: Built
    lock: dict[str, dict[str, Any]]  # the lock's images, as ale images lock writes them

    def statement(self) -> dict[str, Any]:
        return attest(self.defn, self.checkout, self.built.layout)


def _mini(root: Path, *, epoch: int = EPOCH) -> Mini:
    checkout, path, cache = mini_image(root)
    defn = definition.load(path)
    built = build_image(defn, checkout, root / "out" / "mini", cache, offline=True, epoch=epoch, log=lambda _l: None)
    return Mini(checkout, defn, built, lockfile.lock_document([built])["images"])


@pytest.fixture(scope="module")
def mini(tmp_path_factory: pytest.TempPathFactory) -> Mini:
    return _mini(tmp_path_factory.mktemp("mini"))


@pytest.fixture(scope="module")
def key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


def _runner(key: Ed25519PrivateKey, kind: str = "benchmark_team") -> RunnerKey:
    raw = public_raw(key)
    return RunnerKey(key_id(raw), base64.b64encode(raw).decode(), kind, "the test runner")


def _trusting(*keys: Ed25519PrivateKey) -> Callable[[str], RunnerKey | None]:
    known = {r.key_id: r for r in map(_runner, keys)}
    return known.get


def _signed(doc: dict[str, Any], key: Ed25519PrivateKey) -> bytes:
    return canonical_json(provenance.envelope(doc, key))


def _edit_payload(raw: bytes, change: Callable[[dict[str, Any]], None]) -> bytes:
    """The envelope with its statement changed and the signatures kept: what a forger without the key can do."""
    env = json.loads(raw)
    doc = json.loads(base64.b64decode(env["payload"]))
    change(doc)
    env["payload"] = base64.b64encode(canonical_json(doc)).decode()
    return canonical_json(env)


# --- what the statement says ---------------------------------------------------------------------


def test_attest_writes_an_in_toto_v1_statement_with_slsa_v1_provenance_of_the_layout(mini: Mini) -> None:
    doc = mini.statement()
    assert doc["_type"] == "https://in-toto.io/Statement/v1"
    assert doc["predicateType"] == "https://slsa.dev/provenance/v1"
    assert doc["subject"] == [{"name": "mini", "digest": {"sha256": mini.built.digest[7:]}}]
    build = doc["predicate"]["buildDefinition"]
    assert build["buildType"] == provenance.BUILD_TYPE
    assert build["externalParameters"] == {
        "image": "mini",
        "definition": {"path": "images/mini.toml", "sha256": hashlib.sha256(mini.defn.source.read_bytes()).hexdigest()},
        "epoch": EPOCH,
    }
    deps = {(d["annotations"]["kind"], d["name"]): d for d in build["resolvedDependencies"]}
    deb, wheel = mini.defn.debian.packages[0], mini.defn.python.wheels[0]
    assert deps["deb", "minibase"] == {
        "name": "minibase",
        "uri": f"http://deb.example.invalid/debian/{deb.path}",
        "digest": {"sha256": deb.sha256},
        "annotations": {"kind": "deb", "version": "1.0-1"},
    }
    assert deps["wheel", "mini"]["digest"] == {"sha256": wheel.sha256}
    assert deps["wheel", "mini"]["uri"] == wheel.url
    project = {name: d for (kind, name), d in deps.items() if kind == "project"}
    assert set(project) == {"ale/__init__.py", "evaluator/__init__.py", "evaluator/cli.py"}
    cli = (mini.checkout / "evaluator" / "cli.py").read_bytes()
    assert project["evaluator/cli.py"]["digest"] == {"sha256": hashlib.sha256(cli).hexdigest()}
    assert (
        project["evaluator/cli.py"]["annotations"]["path"]
        == "/usr/local/lib/python3.11/dist-packages/ale_evaluator/cli.py"
    )
    run = doc["predicate"]["runDetails"]
    assert run["builder"]["id"] == provenance.BUILDER_ID
    assert "ale-robotics" in run["builder"]["version"]
    layers = [b["digest"]["sha256"] for b in run["byproducts"][1:]]
    assert layers == [x.digest[7:] for x in mini.built.layers]
    assert run["byproducts"][0]["mediaType"] == "application/vnd.oci.image.config.v1+json"


def test_attest_gives_the_same_bytes_for_the_same_layout_and_checkout(mini: Mini, key: Ed25519PrivateKey) -> None:
    """No time in it: a statement can be made again and compared (Ed25519 signatures are deterministic too)."""
    assert canonical_json(mini.statement()) == canonical_json(mini.statement())
    assert _signed(mini.statement(), key) == _signed(mini.statement(), key)


def test_attest_names_the_commit_of_a_clean_git_checkout(tmp_path: Path) -> None:
    checkout, path, cache = mini_image(tmp_path)
    git = ["git", "-C", str(checkout), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "mini"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    defn = definition.load(path)
    built = build_image(defn, checkout, tmp_path / "out" / "mini", cache, offline=True, log=lambda _l: None)
    deps = attest(defn, checkout, built.layout)["predicate"]["buildDefinition"]["resolvedDependencies"]
    assert deps[-1] == {"name": "checkout", "digest": {"gitCommit": head}, "annotations": {"kind": "source"}}
    (checkout / "README").write_text("untracked: still clean\n")
    assert attest(defn, checkout, built.layout)["predicate"]["buildDefinition"]["resolvedDependencies"] == deps


def test_attest_refuses_a_layout_built_from_another_definition(tmp_path: Path) -> None:
    m = _mini(tmp_path)
    m.defn.source.write_text(m.defn.source.read_text().replace("a test image", "another test image"))
    with pytest.raises(AttestError, match="another version"):
        attest(definition.load(m.defn.source), m.checkout, m.built.layout)


def test_attest_refuses_a_checkout_edited_since_the_build(tmp_path: Path) -> None:
    """The project files it lists are the image's: their layer is rebuilt and compared."""
    m = _mini(tmp_path)
    (m.checkout / "evaluator" / "cli.py").write_text("def main():\n    return 1\n")
    with pytest.raises(AttestError, match="project layer is not the checkout"):
        m.statement()


def test_pae_is_dsse_v1s_encoding() -> None:
    """The DSSE protocol's own example."""
    assert provenance.pae("http://example.com/HelloWorld", b"hello world") == (
        b"DSSEv1 29 http://example.com/HelloWorld 11 hello world"
    )


# --- the verifier's check against the lock -------------------------------------------------------


def test_signed_statement_matching_the_lock_is_accepted_with_its_signer(mini: Mini, key: Ed25519PrivateKey) -> None:
    checked = provenance.check(_signed(mini.statement(), key), "mini", mini.lock["mini"], trusted=_trusting(key))
    assert checked.signer == _runner(key)
    assert checked.provenance.digest == mini.built.digest
    assert checked.provenance.epoch == EPOCH
    assert {d.kind for d in checked.provenance.dependencies} == {"deb", "wheel", "project"}


def test_statement_for_another_digest_is_refused(tmp_path: Path, mini: Mini, key: Ed25519PrivateKey) -> None:
    other = _mini(tmp_path, epoch=EPOCH + 1)  # the same definition, another image
    assert other.built.digest != mini.built.digest
    raw = _signed(other.statement(), key)
    with pytest.raises(ProvenanceError) as refused:
        provenance.check(raw, "mini", mini.lock["mini"], trusted=_trusting(key))
    assert refused.value.reason == "subject_mismatch"


def test_statement_of_one_image_is_refused_for_another_name(mini: Mini, key: Ed25519PrivateKey) -> None:
    raw = _signed(mini.statement(), key)
    with pytest.raises(ProvenanceError) as refused:
        provenance.check(raw, "evaluator", mini.lock["mini"], trusted=_trusting(key))
    assert refused.value.reason == "subject_mismatch"


def _digest_to(doc: dict[str, Any], value: str) -> None:
    doc["subject"][0]["digest"]["sha256"] = value


TAMPERINGS: dict[str, Callable[[dict[str, Any]], None]] = {
    "a pin's hash": lambda d: d["predicate"]["buildDefinition"]["resolvedDependencies"][0]["digest"].update(
        sha256="0" * 64
    ),
    "the subject": lambda d: _digest_to(d, "1" * 64),
    "a project file dropped": lambda d: d["predicate"]["buildDefinition"]["resolvedDependencies"].pop(),
    "the builder's version": lambda d: d["predicate"]["runDetails"]["builder"]["version"].update({"ale-robotics": "9"}),
}  # fmt: skip


@pytest.mark.parametrize("what", sorted(TAMPERINGS))
def test_tampered_signed_statement_is_refused_bad_signature(mini: Mini, key: Ed25519PrivateKey, what: str) -> None:
    raw = _edit_payload(_signed(mini.statement(), key), TAMPERINGS[what])
    with pytest.raises(ProvenanceError) as refused:
        provenance.check(raw, "mini", mini.lock["mini"], trusted=_trusting(key))
    assert refused.value.reason == "bad_signature"


def test_signature_bound_to_the_payload_type(mini: Mini, key: Ed25519PrivateKey) -> None:
    """The type is inside what is signed: a signature made over another type does not verify as in-toto's."""
    payload = canonical_json(mini.statement())
    sig = key.sign(provenance.pae("application/json", payload))
    env = {
        "payload": base64.b64encode(payload).decode(),
        "payloadType": provenance.PAYLOAD_TYPE,
        "signatures": [{"keyid": _runner(key).key_id, "sig": base64.b64encode(sig).decode()}],
    }
    with pytest.raises(ProvenanceError) as refused:
        provenance.check(canonical_json(env), "mini", mini.lock["mini"], trusted=_trusting(key))
    assert refused.value.reason == "bad_signature"
    env["payloadType"] = "application/json"
    with pytest.raises(ProvenanceError, match="payloadType") as refused:
        provenance.check(canonical_json(env), "mini", mini.lock["mini"], trusted=_trusting(key))
    assert refused.value.reason == "malformed"


def test_statement_signed_by_a_key_the_site_does_not_trust_is_refused(mini: Mini, key: Ed25519PrivateKey) -> None:
    stranger = Ed25519PrivateKey.generate()
    raw = _signed(mini.statement(), stranger)
    with pytest.raises(ProvenanceError) as refused:
        provenance.check(raw, "mini", mini.lock["mini"], trusted=_trusting(key))
    assert refused.value.reason == "untrusted_signer"
    with pytest.raises(ProvenanceError) as refused:
        provenance.check(raw, "mini", mini.lock["mini"], trusted=None)
    assert refused.value.reason == "untrusted_signer"


def test_a_lookup_whose_key_is_not_the_one_named_verifies_nothing(mini: Mini, key: Ed25519PrivateKey) -> None:
    """A registry that answers a key id with another public key does not make a signature valid."""
    other = _runner(Ed25519PrivateKey.generate())
    raw = _signed(mini.statement(), key)
    with pytest.raises(ProvenanceError) as refused:
        provenance.check(raw, "mini", mini.lock["mini"], trusted=lambda kid: attrs.evolve(other, key_id=kid))
    assert refused.value.reason == "bad_signature"


def test_one_good_signature_among_others_is_enough(mini: Mini, key: Ed25519PrivateKey) -> None:
    stranger = Ed25519PrivateKey.generate()
    env = provenance.envelope(mini.statement(), key)
    env["signatures"] = provenance.envelope(mini.statement(), stranger)["signatures"] + env["signatures"]
    checked = provenance.check(canonical_json(env), "mini", mini.lock["mini"], trusted=_trusting(key))
    assert checked.signer == _runner(key)


def test_unsigned_statement_is_refused_unless_allowed(mini: Mini) -> None:
    raw = canonical_json(mini.statement())
    with pytest.raises(ProvenanceError) as refused:
        provenance.check(raw, "mini", mini.lock["mini"], trusted=None)
    assert refused.value.reason == "unsigned"
    checked = provenance.check(raw, "mini", mini.lock["mini"], trusted=None, allow_unsigned=True)
    assert checked.signer is None


def _set_definition(doc: dict[str, Any]) -> None:
    doc["predicate"]["buildDefinition"]["externalParameters"]["definition"]["sha256"] = "2" * 64


def _swap_layers(doc: dict[str, Any]) -> None:
    b = doc["predicate"]["runDetails"]["byproducts"]
    b[1]["digest"], b[2]["digest"] = b[2]["digest"], b[1]["digest"]


@pytest.mark.parametrize(
    ("change", "reason"),
    [(TAMPERINGS["the subject"], "subject_mismatch"), (_set_definition, "definition_mismatch"),
     (_swap_layers, "layers_mismatch")],
)  # fmt: skip
def test_unsigned_statement_that_contradicts_the_lock_is_refused(
    mini: Mini, change: Callable[[dict[str, Any]], None], reason: str
) -> None:
    doc = copy.deepcopy(mini.statement())
    change(doc)
    with pytest.raises(ProvenanceError) as refused:
        provenance.check(canonical_json(doc), "mini", mini.lock["mini"], trusted=None, allow_unsigned=True)
    assert refused.value.reason == reason


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda d: d.update(extra=1), "needs exactly"),
        (lambda d: d.update(_type="https://in-toto.io/Statement/v0.1"), "_type"),
        (lambda d: d.update(predicateType="https://slsa.dev/provenance/v0.2"), "predicateType"),
        (lambda d: d["predicate"]["buildDefinition"].update(buildType="https://example.com/other"), "buildType"),
        (lambda d: d["predicate"]["buildDefinition"]["resolvedDependencies"][0]["annotations"].update(kind="npm"),
         "kind"),
        (lambda d: d["predicate"]["buildDefinition"]["resolvedDependencies"][0].pop("uri"), "a deb has exactly"),
        (lambda d: d["predicate"]["buildDefinition"]["externalParameters"].update(epoch=-1), "epoch"),
        (lambda d: d["predicate"]["buildDefinition"]["externalParameters"].update(image="other"), "image"),
        (lambda d: d["predicate"]["runDetails"]["byproducts"].reverse(), "byproducts"),
    ],
)  # fmt: skip
def test_statement_of_another_shape_is_refused_as_malformed(
    mini: Mini, change: Callable[[dict[str, Any]], None], match: str
) -> None:
    doc = copy.deepcopy(mini.statement())
    change(doc)
    with pytest.raises(ProvenanceError, match=match) as refused:
        provenance.read(canonical_json(doc), trusted=None, allow_unsigned=True)
    assert refused.value.reason == "malformed"


def test_check_lock_needs_a_statement_for_each_locked_image_and_no_other(mini: Mini, key: Ed25519PrivateKey) -> None:
    raw = _signed(mini.statement(), key)
    lock = {"mini": mini.lock["mini"], "other": mini.lock["mini"]}
    with pytest.raises(ProvenanceError) as refused:
        provenance.check_lock(lock, {"mini": raw}, trusted=_trusting(key))
    assert refused.value.reason == "missing"
    with pytest.raises(ProvenanceError) as refused:
        provenance.check_lock(mini.lock, {"mini": raw, "stray": raw}, trusted=_trusting(key))
    assert refused.value.reason == "subject_mismatch"
    assert set(provenance.check_lock(mini.lock, {"mini": raw}, trusted=_trusting(key))) == {"mini"}


def test_parse_lock_reads_what_ale_images_lock_writes(mini: Mini, tmp_path: Path) -> None:
    lockfile.write_lock(tmp_path / "lock.json", mini.lock)
    assert provenance.parse_lock((tmp_path / "lock.json").read_bytes()) == mini.lock


@pytest.mark.parametrize(
    "raw",
    [b"", b"[]", b'{"format":"ale-images-lock/v1","images":{}}', b'{"format":"x","images":{"a":{}}}',
     b'{"format":"ale-images-lock/v1","images":{"a":{"digest":"sha256:00","definition_sha256":"","layers":[]}}}',
     b"[" * 100000],
)  # fmt: skip
def test_parse_lock_refuses_garbage_as_malformed(raw: bytes) -> None:
    with pytest.raises(ProvenanceError) as refused:
        provenance.parse_lock(raw)
    assert refused.value.reason == "malformed"


@pytest.mark.fuzz
@fuzz_settings
@given(raw=st.one_of(hostile_json, json_values.map(lambda v: json.dumps(v).encode())))
def test_fuzz_statement_reader_raises_only_provenance_errors(raw: bytes) -> None:
    for allow in (False, True):
        with pytest.raises(ProvenanceError):
            provenance.read(raw, trusted=None, allow_unsigned=allow)
    with pytest.raises(ProvenanceError):
        provenance.parse_lock(raw)


@pytest.mark.fuzz
@fuzz_settings
@given(data=st.data())
def test_fuzz_mutated_statement_raises_only_provenance_errors(mini: Mini, key: Ed25519PrivateKey, data: Any) -> None:
    """Valid statements and envelopes with one value anywhere replaced by any JSON value."""
    doc = copy.deepcopy(mini.statement())
    target = data.draw(st.sampled_from(["statement", "envelope"]))
    root: Any = provenance.envelope(doc, key) if target == "envelope" else doc
    node, path = root, []
    while isinstance(node, (dict, list)) and node and data.draw(st.booleans()):
        step = data.draw(st.sampled_from(sorted(node) if isinstance(node, dict) else list(range(len(node)))))
        path.append(step)
        node = node[step]
    value = data.draw(json_values)
    if not path:
        root = value
    else:
        parent = root
        for step in path[:-1]:
            parent = parent[step]
        parent[path[-1]] = value
    try:
        raw = canonical_json(root)
    except CanonicalError:
        assume(False)  # no canonical form (an integer past 2**53): not something a producer writes
    with contextlib.suppress(ProvenanceError):  # any verdict, but only this exception
        provenance.check(raw, "mini", mini.lock["mini"], trusted=_trusting(key), allow_unsigned=True)


# --- the commands --------------------------------------------------------------------------------


def _run(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *argv], capture_output=True, text=True, timeout=120, env=env)


def test_ale_images_attest_then_ale_verify_check_provenance(tmp_path: Path) -> None:
    m = _mini(tmp_path)
    out = m.built.layout.parent
    pem, public, kid = new_private_key_pem()
    (tmp_path / "runner.pem").write_bytes(pem)
    r = _run("ale.images", "attest", "mini", "--source", str(m.checkout), "--out", str(out),
             "--key", str(tmp_path / "runner.pem"))  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"mini signed {out / 'mini.intoto.json'}"
    r = _run("ale.images", "lock", "mini", "--source", str(m.checkout), "--out", str(out),
             "--lock", str(tmp_path / "lock.json"))  # fmt: skip
    assert r.returncode == 0, r.stderr

    env = {**os.environ, "ALE_VERIFY_DATA": str(tmp_path / "site")}
    check = ["ale_verify.cli", "check-provenance", "--lock", str(tmp_path / "lock.json"), "--statements", str(out)]
    r = _run(*check, env=env)
    assert r.returncode == 1
    assert "provenance refused (untrusted_signer)" in r.stderr
    r = _run(*check, "--runner-public-key", public, "--json", env=env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["images"]["mini"] == {
        "digest": m.built.digest,
        "definition_sha256": m.defn.sha256,
        "signed_by": {"key_id": kid, "kind": "given"},
    }

    # the site's own registered runner keys are trusted; a retired one no longer is
    database = tmp_path / "site" / "verifier.sqlite3"
    db.migrate(database)
    db.register_runner_key(database, key_id=kid, public_key=public, kind="benchmark_team", label="ci", actor="test")
    r = _run(*check, env=env)
    assert r.returncode == 0, r.stderr
    assert f"signed by runner key {kid} (benchmark_team)" in r.stdout
    db.retire_runner_key(database, kid)
    assert _run(*check, env=env).returncode == 1

    (out / "mini.intoto.json").write_bytes(_edit_payload((out / "mini.intoto.json").read_bytes(), _set_definition))
    r = _run(*check, "--runner-public-key", public, env=env)
    assert r.returncode == 1
    assert "provenance refused (bad_signature)" in r.stderr
    r = _run(*check, "--runner-public-key", "not base64!", env=env)
    assert r.returncode == 2


def test_ale_images_attest_without_a_layout_says_so(tmp_path: Path) -> None:
    checkout, _path, _cache = mini_image(tmp_path)
    r = _run("ale.images", "attest", "mini", "--source", str(checkout), "--out", str(tmp_path / "none"))
    assert r.returncode == 2
    assert "ale: images attest:" in r.stderr
