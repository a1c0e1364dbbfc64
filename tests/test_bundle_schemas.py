"""ale/schemas/ and docs/formats.md, held to the real thing.

Two real bundles are produced by ``ale run`` in subprocesses (cartpole-balance: open genre, batch
mode; pendulum-lqr: reproduction genre, interactive mode), decrypted with the key file the run
wrote, and every file is validated against its published JSON Schema, every trajectory line against
the event schema. Mutated documents must fail. The test vectors of docs/formats.md are read from
the page and recomputed with the project's code and, independently, with the standard library.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import hmac
import importlib.metadata
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest
import rfc8785
import zstandard
from jsonschema import Draft202012Validator

import ale_evaluator
from ale import catalog
from ale.core import grammar
from ale.core.attestation import dependency_lock, dependency_lock_sha256
from ale.core.bundle import ALLOWED_FILES, build_tar, unpack
from ale.core.canonical import canonical_json, reference_canonical_json
from ale.core.merkle import file_leaves, files_root, leaf_hash
from ale.core.results import SCORES_SCHEMA, TASK_RESULTS_SCHEMA
from ale.core.signing import DOMAIN, new_private_key_pem, sign_root, verify_root
from ale.core.trajectory import EVENT_SCHEMA, GENESIS, PRODUCERS, ChainBuilder, verify_chain
from ale.core.verify import check_files
from ale.runner import bundle_writer, harness, retry, task_run
from ale.schemas import validate_document
from ale_evaluator.episodes import ABORT_REASONS
from ale_evaluator.seeds import RunConfig, commitment, hidden_seed
from ale_evaluator.service import METHODS

ROOT = Path(__file__).resolve().parents[1]
SCHEMAS = ROOT / "ale" / "schemas"
FORMATS = ROOT / "docs" / "formats.md"
JSON_FILES = {
    "manifest.json": ("manifest", bundle_writer.MANIFEST_SCHEMA),
    "task_results.json": ("task_results", TASK_RESULTS_SCHEMA),
    "score_breakdown.json": ("score_breakdown", SCORES_SCHEMA),
    "faithfulness.json": ("faithfulness", bundle_writer.FAITHFULNESS_SCHEMA),
    "network_summary.json": ("network_summary", bundle_writer.NETWORK_SCHEMA),
    "artifacts_manifest.json": ("artifacts_manifest", bundle_writer.ARTIFACTS_SCHEMA),
    "integrity.json": ("integrity", bundle_writer.INTEGRITY_SCHEMA),
}
SCHEMA_NAMES = [name for name, _ in JSON_FILES.values()] + ["trajectory_event"]
CLI = (sys.executable, "-m", "ale.runner.cli")
RUNS = {"batch": "cartpole-balance", "interactive": "pendulum-lqr"}
SIGNED = {"batch"}  # run with --runner-key: integrity.json carries a signature
FIRST_EVENT_HASH = "68536c37367c3c082f0f31bba65ea9c93b8d7e97f163cd3fef7635214efc2c2f"  # also in test_trajectory


def _schema(name: str) -> dict[str, Any]:
    return json.loads((SCHEMAS / f"{name}.schema.json").read_text(encoding="utf-8"))


def _validator(name: str) -> Draft202012Validator:
    return Draft202012Validator(_schema(name))


def _errors(name: str, document: Any) -> list[str]:
    return [f"{e.json_path}: {e.message[:300]}" for e in _validator(name).iter_errors(document)]


def _events(files: dict[str, bytes]) -> bytes:
    return zstandard.ZstdDecompressor().decompressobj().decompress(files["events.jsonl.zst"])


def _sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def _mth(leaves: list[bytes]) -> bytes:
    """RFC 6962 section 2.1, written out again here rather than imported."""
    if not leaves:
        return _sha256(b"")
    if len(leaves) == 1:
        return _sha256(b"\x00" + leaves[0])
    k = 1 << ((len(leaves) - 1).bit_length() - 1)  # the largest power of two smaller than n
    return _sha256(b"\x01" + _mth(leaves[:k]) + _mth(leaves[k:]))


def _ascii_canonical(value: Any) -> bytes:
    """RFC 8785 for ASCII-only data with simple numbers: the standard library's sorted compact JSON."""
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


# -- real bundles ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, bytes]]:
    """``ale run`` of one batch and one interactive task (concurrently), decrypted; the batch one signed."""
    root = tmp_path_factory.mktemp("bundles")
    env = {k: v for k, v in os.environ.items() if k not in ("ALE_RECIPIENT", "ALE_TOKEN")}
    runner_key = root / "runner.pem"
    runner_key.write_bytes(new_private_key_pem()[0])
    procs = {}
    for mode, task in RUNS.items():
        out = root / mode
        signed = ["--runner-key", str(runner_key)] if mode in SIGNED else []
        log = (root / f"{mode}.log").open("wb")
        procs[mode] = (
            subprocess.Popen(
                [*CLI, "run", task, "--plain", "--out", str(out), "--episodes", "2", "--agent-time", "30", *signed],
                cwd=root,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            ),
            log,
        )
    unpacked = {}
    try:
        for proc, log in procs.values():
            proc.wait(timeout=300)
            log.close()
    finally:
        for proc, log in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log.close()
    for mode, (proc, _) in procs.items():
        assert proc.returncode == 0, (root / f"{mode}.log").read_text(errors="replace")
        out = root / mode
        (bundle,) = out.glob("*.ale")
        (key,) = out.glob("*.key")
        identity = next(line for line in key.read_text().splitlines() if line.startswith("AGE-SECRET-KEY-"))
        unpacked[mode] = unpack(bundle.read_bytes(), identity)
    return unpacked


@pytest.mark.parametrize("name", SCHEMA_NAMES)
def test_schemas_are_valid_and_identified(name: str) -> None:
    schema = _schema(name)
    Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    version = {"faithfulness": "v2"}.get(name, "v1")  # the document type's version (ale-faithfulness/v2)
    assert schema["$id"] == f"https://ale-robotics.org/schemas/{name}/{version}"
    assert schema["title"]
    assert schema["description"]
    assert schema["additionalProperties"] is False
    for key, prop in schema["properties"].items():
        assert "description" in prop or "$ref" in prop, f"{name}: {key} has no description"
    assert f"schemas/{name}.schema.json" in FORMATS.read_text(encoding="utf-8")


def test_the_schema_folder_holds_exactly_the_published_schemas() -> None:
    schemas = sorted(p.name for p in SCHEMAS.iterdir() if p.suffix == ".json")
    assert schemas == sorted(f"{n}.schema.json" for n in SCHEMA_NAMES)


@pytest.mark.parametrize(("filename", "name", "document_type"), [(f, n, s) for f, (n, s) in JSON_FILES.items()])
def test_schema_constants_are_the_producers(filename: str, name: str, document_type: str) -> None:
    assert _schema(name)["properties"]["schema"]["const"] == document_type
    assert f"`{filename}`" in FORMATS.read_text(encoding="utf-8")


def test_enumerations_follow_the_code() -> None:
    """A new producer, kind, abort reason, RPC or bundle file must reach the schemas."""
    event = _schema("trajectory_event")
    assert event["properties"]["schema"]["const"] == EVENT_SCHEMA
    assert event["properties"]["producer"]["enum"] == list(PRODUCERS)
    defs = event["$defs"]
    harness_kinds = set(defs["trusted_harness"]["properties"]["kind"]["enum"])
    sources = [Path(m.__file__).read_text() for m in (harness, task_run, retry)]
    emitted = set(re.findall(r'emit\(\s*"trusted_harness",\s*"([a-z_]+)"', "".join(sources)))
    assert {"task_ended_early", "infrastructure_retry", "task_finished"} <= emitted
    assert emitted <= harness_kinds == grammar.KINDS["trusted_harness"]  # the grammar is the closed list
    evaluator_source = "".join(p.read_text() for p in Path(ale_evaluator.__file__).parent.glob("*.py"))
    recorded = set(re.findall(r'\.record\(\s*"([a-z_]+)"', evaluator_source)) | {"rpc", "rpc_summary"}
    assert set(defs["trusted_evaluator"]["properties"]["kind"]["enum"]) == recorded
    assert recorded <= grammar.KINDS["trusted_evaluator"]
    agent_kinds = set(defs["untrusted_agent"]["properties"]["kind"]["enum"])
    assert agent_kinds == set(harness.AGENT_EVENT_KINDS) | {"stdout", "stderr", "policy_stdout", "policy_stderr"}
    assert agent_kinds == grammar.KINDS["untrusted_agent"]
    assert set(defs["evaluator_rpc"]["properties"]["method"]["enum"]) == set(METHODS)
    reasons = set(_schema("task_results")["$defs"]["episode"]["properties"]["abort_reason"]["enum"])
    assert reasons == {"", *ABORT_REASONS}
    assert set(defs["evaluator_episode_end"]["properties"]["abort_reason"]["enum"]) == reasons
    integrity_files = _schema("integrity")["properties"]["files"]["required"]
    assert integrity_files == sorted(set(ALLOWED_FILES) - {"integrity.json"})


@pytest.mark.parametrize("mode", list(RUNS))
@pytest.mark.parametrize("filename", list(JSON_FILES))
def test_real_bundle_files_match_their_schema(bundles: dict[str, dict[str, bytes]], mode: str, filename: str) -> None:
    raw = bundles[mode][filename]
    document = json.loads(raw)
    assert raw == canonical_json(document) + b"\n", "bundle JSON files are canonical JSON plus a newline"
    assert _errors(JSON_FILES[filename][0], document) == []


@pytest.mark.parametrize("mode", list(RUNS))
def test_every_real_event_matches_the_event_schema(bundles: dict[str, dict[str, bytes]], mode: str) -> None:
    files = bundles[mode]
    stream = _events(files)
    summary = verify_chain(stream)
    validator = _validator("trajectory_event")
    kinds = set()
    for number, line in enumerate(stream.split(b"\n")[:-1], start=1):
        event = json.loads(line)
        errors = [f"{e.json_path}: {e.message[:300]}" for e in validator.iter_errors(event)]
        assert errors == [], f"line {number} ({event['producer']} {event['kind']}): {errors}"
        kinds.add((event["producer"], event["kind"]))
    manifest = json.loads(files["manifest.json"])
    assert manifest["trajectory"] == {"schema": EVENT_SCHEMA, "events": summary.events, "chain_head": summary.head}
    common = {"run_started", "task_started", "evaluator_started", "agent_started", "agent_finished"}
    common |= {"official_evaluation_started", "official_evaluation_finished", "task_finished", "run_finished"}
    per_mode = {"batch": {"policy_artifact"}, "interactive": {"eval_session_opened", "policy_finished"}}
    assert {("trusted_harness", k) for k in common | per_mode[mode]} <= kinds
    assert {("trusted_evaluator", k) for k in ("evaluator_ready", "episode_end", "eval_result")} <= kinds


@pytest.mark.parametrize("mode", list(RUNS))
def test_integrity_json_is_what_formats_md_describes(bundles: dict[str, dict[str, bytes]], mode: str) -> None:
    """Per-file digests and the RFC 6962 root recomputed from scratch; the verifier agrees."""
    files = bundles[mode]
    integrity = json.loads(files["integrity.json"])
    others = {name: data for name, data in files.items() if name != "integrity.json"}
    assert integrity["files"] == {name: hashlib.sha256(data).hexdigest() for name, data in others.items()}
    names = sorted(others, key=lambda n: n.encode())
    leaves = [n.encode() + b"\x00" + _sha256(others[n]) for n in names]
    assert integrity["merkle_root"] == _mth(leaves).hex()
    assert integrity["chain_head"] == json.loads(_events(files).split(b"\n")[-2])["hash"]
    if mode in SIGNED:
        assert verify_root(integrity["signature"], integrity["merkle_root"]) == integrity["signature"]["key_id"]
    else:
        assert integrity["signature"] is None
    release, sha = catalog.release("2026.11")
    known = {t.spec.ref: (t.spec, t.digest) for t in catalog.tasks().values()}
    check_files(
        files,
        release_for=lambda s: (release, s) if s == sha else None,
        known_tasks=known,
        validate=validate_document,
        contexts=catalog.judge_contexts(),
    )


def test_genre_specific_content(bundles: dict[str, dict[str, bytes]]) -> None:
    batch, interactive = bundles["batch"], bundles["interactive"]
    (artifact,) = json.loads(batch["artifacts_manifest.json"])["artifacts"]
    events = [json.loads(line) for line in _events(batch).split(b"\n")[:-1]]
    (policy_event,) = [e for e in events if e["kind"] == "policy_artifact"]
    assert policy_event["data"] == artifact
    assert json.loads(interactive["artifacts_manifest.json"])["artifacts"] == []
    ((ref, verdict),) = json.loads(interactive["faithfulness.json"])["tasks"].items()
    assert ref == "pendulum-lqr@1.0.0"
    assert (verdict["outcome"], verdict["faithful"]) == ("no_judge", False)
    (score,) = json.loads(interactive["score_breakdown.json"])["tasks"]
    assert (score["genre"], score["faithful"], score["final"]) == ("reproduction", False, 0)
    (score,) = json.loads(batch["score_breakdown.json"])["tasks"]
    assert (score["genre"], score["faithful"]) == ("open", None)


# -- mutations must fail --------------------------------------------------------------------------


DELETE = object()


def _mutate(document: Any, path: str, value: Any) -> None:
    """Set (or, with DELETE, remove) the member at a /-separated path (list indices as numbers)."""
    *parents, last = path.split("/")
    for part in parents:
        document = document[int(part)] if part.lstrip("-").isdigit() else document[part]
    key: Any = int(last) if last.isdigit() else last
    if value is DELETE:
        del document[key]
    else:
        document[key] = value


MUTATIONS = [
    ("batch", "manifest.json", "surprise", 1),  # extra key at the top
    ("batch", "manifest.json", "tasks/0/agent/extra", 1),  # extra key deep inside
    ("batch", "manifest.json", "tasks/0/genre", "closed"),  # wrong enum
    ("batch", "manifest.json", "release/manifest_sha256", "A" * 64),  # uppercase digest
    ("batch", "manifest.json", "run/started", "2026-11-30T05:04:22Z"),  # no microseconds
    ("batch", "manifest.json", "run/finished", "2026-11-30T05:04:22.123456+00:00"),  # not Z
    ("batch", "manifest.json", "challenge", DELETE),  # required even when null
    ("batch", "manifest.json", "tasks/0/version", "1.0"),  # not MAJOR.MINOR.PATCH
    ("batch", "task_results.json", "tasks/0/mode", "online"),
    ("batch", "task_results.json", "tasks/0/task", "cartpole-balance"),  # not id@version
    ("batch", "task_results.json", "tasks/0/result", None),  # completed without a result
    ("batch", "task_results.json", "tasks/0/result/episodes/0/seed_commitment", "ab" * 31),  # 62 digits
    ("batch", "task_results.json", "tasks/0/result/episodes/0/aborted", True),  # aborted, no reason
    ("batch", "task_results.json", "tasks/0/result/episodes/0/abort_reason", "bored"),
    ("batch", "task_results.json", "tasks/0/result/headline_direction", "up"),
    ("batch", "task_results.json", "tasks/0/result/num_episodes", -1),
    ("batch", "task_results.json", "tasks/0/result/official", "yes"),
    ("batch", "task_results.json", "tasks/0/status", "done"),
    ("batch", "score_breakdown.json", "tasks/0/faithful", True),  # open genre has no gate
    ("interactive", "score_breakdown.json", "tasks/0/faithful", None),  # reproduction needs one
    ("batch", "score_breakdown.json", "aggregate/method", "median"),
    ("batch", "score_breakdown.json", "aggregate/coverage_complete", True),  # tasks are missing
    ("batch", "score_breakdown.json", "tasks/0/penalties/falls", 1.5),
    ("batch", "faithfulness.json", "tasks/cartpole-balance@1.0.0/faithful", "yes"),
    ("batch", "faithfulness.json", "tasks/cartpole-balance@1.0.0/outcome", "vibes"),
    ("interactive", "faithfulness.json", "tasks/pendulum-lqr@1.0.0/input_sha256", "A" * 64),
    ("interactive", "faithfulness.json", "tasks/pendulum-lqr@1.0.0/findings", [{"item": "x", "kind": "method"}]),
    ("batch", "faithfulness.json", "judge_input", "ale-judge-input/v0"),
    ("batch", "faithfulness.json", "tasks/not a ref", {"verdict": None, "judge": None, "reason": ""}),
    ("batch", "network_summary.json", "requests/total", -1),
    ("batch", "network_summary.json", "usage", DELETE),
    ("batch", "artifacts_manifest.json", "artifacts/0/sha256", "g" * 64),
    ("batch", "artifacts_manifest.json", "artifacts/0/path", "policy.safetensors"),  # not absolute
    ("batch", "integrity.json", "files/extra.json", "0" * 64),
    ("batch", "integrity.json", "files/manifest.json", DELETE),
    ("batch", "integrity.json", "merkle_root", "0" * 63),
    ("interactive", "integrity.json", "signature", "c2lnbmF0dXJl"),
    ("batch", "integrity.json", "signature/algorithm", "rsa"),
    ("batch", "integrity.json", "signature/key_id", "KEY"),
    ("batch", "integrity.json", "signature/value", "c2lnbmF0dXJl"),  # not 64 bytes
    ("batch", "integrity.json", "signature/comment", "hi"),
    ("batch", "integrity.json", "schema", "ale-bundle-integrity/v2"),
]


@pytest.mark.parametrize(
    ("mode", "filename", "path", "value"), MUTATIONS, ids=[f"{m}-{f}:{p}" for m, f, p, _ in MUTATIONS]
)
def test_mutated_documents_fail(
    bundles: dict[str, dict[str, bytes]], mode: str, filename: str, path: str, value: Any
) -> None:
    document = copy.deepcopy(json.loads(bundles[mode][filename]))
    assert _errors(JSON_FILES[filename][0], document) == []
    _mutate(document, path, value)
    assert _errors(JSON_FILES[filename][0], document) != []


EVENT_MUTATIONS = [
    (0, "extra", 1),
    (0, "producer", "root"),
    (0, "kind", "Run Started"),
    (0, "seq", True),  # a boolean is not an integer (verify_chain lets it through)
    (0, "prev_hash", "1" * 64),  # the first event links to the genesis
    (0, "wall_time", "2026-11-30 05:04:22.123456Z"),
    (0, "data/nonce", 7),
    (0, "data/run_id", DELETE),
    (0, "hash", "F" * 64),
    (0, "monotonic", DELETE),
    (1, "kind", "run_started"),  # only as the first event
    (1, "kind", "teleported"),  # not a harness kind
    (1, "data/surprise", True),  # harness data keys are fixed
    (-1, "data/tasks", {"cartpole-balance@1.0.0": "done"}),
]


@pytest.mark.parametrize(
    ("index", "path", "value"), EVENT_MUTATIONS, ids=[f"event{i}:{p}={v!r}" for i, p, v in EVENT_MUTATIONS]
)
def test_mutated_events_fail(bundles: dict[str, dict[str, bytes]], index: int, path: str, value: Any) -> None:
    event = json.loads(_events(bundles["batch"]).split(b"\n")[:-1][index])
    assert event["producer"] == "trusted_harness"
    assert _errors("trajectory_event", event) == []
    _mutate(event, path, value)
    assert _errors("trajectory_event", event) != []


def test_agent_and_evaluator_event_data_are_checked() -> None:
    base = {"schema": EVENT_SCHEMA, "seq": 5, "producer_sequence": 0, "wall_time": "2026-11-30T05:04:22.000000Z"}
    base |= {"monotonic": 1.5, "prev_hash": "a" * 64, "hash": "b" * 64}
    ok_agent = {**base, "producer": "untrusted_agent", "kind": "stdout", "data": {"text": "hi"}}
    ok_channel = {**ok_agent, "kind": "tool_call", "data": {"tool": "shell", "input": "ls", "anything": [1]}}
    assert _errors("trajectory_event", ok_agent) == _errors("trajectory_event", ok_channel) == []
    assert _errors("trajectory_event", {**ok_agent, "data": {"text": "hi", "pid": 1}})
    assert _errors("trajectory_event", {**ok_agent, "kind": "thinking"})  # never recorded
    episode_end = {"task": "pendulum-lqr@1.0.0", "evaluator_seq": 9, "session_id": "s", "index": 0, "length": 5}
    episode_end |= {"seed_commitment": "c" * 64, "aborted": False, "abort_reason": ""}
    ok_evaluator = {**base, "producer": "trusted_evaluator", "kind": "episode_end", "data": episode_end}
    assert _errors("trajectory_event", ok_evaluator) == []
    assert _errors("trajectory_event", {**ok_evaluator, "data": {**episode_end, "seed": 42}})  # never the seed


# -- docs/formats.md test vectors -----------------------------------------------------------------


@pytest.fixture(scope="module")
def vectors() -> dict[str, str]:
    text = FORMATS.read_text(encoding="utf-8")
    found = re.findall(r"<!-- vector:([a-z0-9-]+) -->\n```[a-z]*\n(.*?)\n```", text, flags=re.DOTALL)
    blocks = dict(found)
    assert len(blocks) == len(found), "a vector name repeats"
    return blocks


def test_vector_a_canonical_json(vectors: dict[str, str]) -> None:
    value = json.loads(vectors["a-input"])
    canonical = canonical_json(value)
    assert canonical == vectors["a-canonical"].encode("utf-8")
    assert reference_canonical_json(value) == canonical
    value["\U0001f600"] = value.pop("\U0001f600")  # member order of the input does not matter
    assert canonical_json(value) == canonical
    assert hashlib.sha256(canonical).hexdigest() == vectors["a-sha256"]
    assert f"({len(canonical)} bytes of UTF-8" in FORMATS.read_text(encoding="utf-8")
    # What the vector is there to exercise: UTF-16 key order, raw non-ASCII, ECMAScript numbers.
    text = canonical.decode("utf-8")
    assert text.index('"😀"') < text.index('"ａ"')
    assert ",1e+21,1e-7," in text
    assert "[1,0.1,0," in text
    assert "\\u0000\\t\\n\\u001f" in text


def _chain_from(vectors: dict[str, str]) -> tuple[ChainBuilder, list[tuple[dict[str, Any], bytes]]]:
    chain, out = ChainBuilder(), []
    for name in ("b-input", "c-input"):
        spec = json.loads(vectors[name])
        out.append(
            chain.append(
                spec["producer"],
                spec["kind"],
                spec["data"],
                wall_time=spec["wall_time_epoch_s"],
                monotonic=spec["monotonic"],
            )
        )
    return chain, out


def test_vectors_b_and_c_trajectory(vectors: dict[str, str]) -> None:
    chain, [(first, line_b), (second, line_c)] = _chain_from(vectors)
    assert line_b == vectors["b-line"].encode() + b"\n"
    assert line_c == vectors["c-line"].encode() + b"\n"
    assert first["hash"] == vectors["b-hash"] == FIRST_EVENT_HASH
    assert second["prev_hash"] == first["hash"]
    assert chain.head == second["hash"] == vectors["c-head"]
    assert verify_chain(line_b + line_c, check_grammar=False).head == vectors["c-head"]  # a chain, not a run
    # Independently: standard-library JSON (all ASCII, simple numbers) and hashlib.
    head = GENESIS
    for line in (line_b, line_c):
        event = json.loads(line)
        assert _ascii_canonical(event) + b"\n" == line
        assert reference_canonical_json(event) + b"\n" == line  # the fast path agrees with the reference
        body = {k: v for k, v in event.items() if k != "hash"}
        assert body["prev_hash"] == head
        head = hashlib.sha256(_ascii_canonical(body)).hexdigest()
        assert event["hash"] == head
        # The envelope is valid; the vector's run_started data is shorter than a real run's.
        assert all(e.json_path.startswith("$.data") for e in _validator("trajectory_event").iter_errors(event))
    assert head == vectors["c-head"]


def test_vector_d_merkle_three_files(vectors: dict[str, str]) -> None:
    contents = {name: text.encode() for name, text in json.loads(vectors["d-input"]).items()}
    digests = {name: hashlib.sha256(data).hexdigest() for name, data in contents.items()}
    rows = [(leaf.hex(), leaf_hash(leaf).hex()) for leaf in file_leaves(digests)]
    assert rows == [tuple(row.split(" ")) for row in vectors["d-leaves"].splitlines()]
    assert files_root(digests) == vectors["d-root"]
    names = sorted(contents, key=str.encode)
    assert names == ["B.txt", "a.txt", "c.txt"]
    leaves = [_sha256(b"\x00" + n.encode() + b"\x00" + _sha256(contents[n])) for n in names]
    assert _sha256(b"\x01" + _sha256(b"\x01" + leaves[0] + leaves[1]) + leaves[2]).hex() == vectors["d-root"]


def test_vector_d7_merkle_bundle_names(vectors: dict[str, str]) -> None:
    names = sorted(set(ALLOWED_FILES) - {"integrity.json"})
    digests = {n: hashlib.sha256(n.encode()).hexdigest() for n in names}
    assert files_root(digests) == vectors["d7-root"]
    leaf = [_sha256(b"\x00" + n.encode() + b"\x00" + _sha256(n.encode())) for n in names]

    def node(a: bytes, b: bytes) -> bytes:
        return _sha256(b"\x01" + a + b)

    root = node(node(node(leaf[0], leaf[1]), node(leaf[2], leaf[3])), node(node(leaf[4], leaf[5]), leaf[6]))
    assert root.hex() == vectors["d7-root"]


def test_vector_e_seeds(vectors: dict[str, str]) -> None:
    spec = json.loads(vectors["e-input"])
    assert spec["seed"] == int(spec["seed_hex"], 16)
    secret = bytes.fromhex(spec["secret_hex"])
    config = RunConfig(run_id=spec["run_id"], secret=secret)
    assert commitment(config, spec["seed"]).hex() == vectors["e-commitment"]
    independent = hashlib.sha256(bytes.fromhex(spec["seed_hex"]) + spec["run_id"].encode() + secret)
    assert independent.hexdigest() == vectors["e-commitment"]
    seed = hidden_seed(config, spec["task_id"], spec["episode"])
    assert str(seed) == vectors["e-hidden-seed"]
    message = b"\x00".join(
        [b"ale/hidden-seed/v1", spec["run_id"].encode(), spec["task_id"].encode(), str(spec["episode"]).encode()]
    )
    digest = hmac.new(secret, message, hashlib.sha256).digest()
    assert f"(digest `{digest.hex()}`" in FORMATS.read_text(encoding="utf-8")
    assert int.from_bytes(digest[:8], "big") & ((1 << 63) - 1) == seed


def test_vector_f_release(vectors: dict[str, str]) -> None:
    raw = catalog.release_bytes("2026.11")
    release, sha = catalog.parse_installed_release(raw)
    assert canonical_json(sorted(release.required_tasks)) == vectors["f-required"].encode()
    assert release.required_task_set_hash == vectors["f-required-task-set-hash"]
    assert (
        hashlib.sha256(_ascii_canonical(sorted(release.required_tasks))).hexdigest() == release.required_task_set_hash
    )
    assert (
        sha
        == vectors["f-manifest-sha256"]
        == hashlib.sha256((ROOT / "ale/releases/2026.11.json").read_bytes()).hexdigest()
    )


def test_vector_g_reference_tar(vectors: dict[str, str]) -> None:
    contents = {name: text.encode() for name, text in json.loads(vectors["d-input"]).items()}
    tar = build_tar(contents)
    assert hashlib.sha256(tar).hexdigest() == vectors["g-tar-sha256"]
    with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
        members = archive.getmembers()
    assert [m.name for m in members] == ["B.txt", "a.txt", "c.txt"]
    assert {(m.type, m.mode, m.mtime, m.uid, m.gid, m.uname, m.gname) for m in members} == {
        (tarfile.REGTYPE, 0o644, 0, 0, 0, "", "")
    }


@pytest.mark.skipif(not all(shutil.which(t) for t in ("age", "zstd", "tar")), reason="needs the age, zstd and tar CLIs")
def test_the_documented_cli_recipe_packs_a_bundle_the_verifier_opens(
    bundles: dict[str, dict[str, bytes]], tmp_path: Path
) -> None:
    """formats.md's tar | zstd | age pipeline (GNU tar, not the reference packer) is a valid bundle."""
    import pyrage

    identity = pyrage.x25519.Identity.generate()
    files = bundles["batch"]
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    text = FORMATS.read_text(encoding="utf-8")
    recipe = re.search(r"```sh\n(.*?)\n *```", text, flags=re.DOTALL)
    assert recipe is not None
    command = recipe.group(1).replace("age1...", str(identity.to_public()))
    subprocess.run(["bash", "-c", f"set -o pipefail; {command}"], check=True, cwd=tmp_path, timeout=60)
    assert unpack((tmp_path / "run.ale").read_bytes(), str(identity)) == files


RFC8032_TEST1_PUBLIC = "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a"
RFC8032_TEST1_EMPTY_SIGNATURE = (
    "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e06522490155"
    "5fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b"
)


def test_vector_h_signature(vectors: dict[str, str]) -> None:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

    spec = json.loads(vectors["h-input"])
    key = Ed25519PrivateKey.from_private_bytes(bytes.fromhex(spec["private_key_seed_hex"]))
    assert key.sign(b"").hex() == RFC8032_TEST1_EMPTY_SIGNATURE  # the key is RFC 8032's, as the page says
    block = json.loads(vectors["h-signature"])
    assert sign_root(key, spec["merkle_root"]) == block
    assert spec["merkle_root"] == vectors["d7-root"]
    public = base64.b64decode(block["public_key"])
    assert public.hex() == RFC8032_TEST1_PUBLIC
    assert block["key_id"] == hashlib.sha256(public).hexdigest()
    message = b"ale-bundle-integrity/v1\n" + spec["merkle_root"].encode()
    assert message == DOMAIN + spec["merkle_root"].encode()
    assert f"{len(message)} bytes)" in FORMATS.read_text(encoding="utf-8")
    Ed25519PublicKey.from_public_bytes(public).verify(base64.b64decode(block["value"]), message)
    assert verify_root(block, spec["merkle_root"]) == block["key_id"]
    document = {
        "schema": "ale-bundle-integrity/v1",
        "files": {n: "0" * 64 for n in sorted(set(ALLOWED_FILES) - {"integrity.json"})},
    }
    document |= {"merkle_root": spec["merkle_root"], "chain_head": "1" * 64, "signature": block}
    assert _errors("integrity", document) == []


def test_vector_i_dependency_lock(vectors: dict[str, str]) -> None:
    pairs = [tuple(pair) for pair in json.loads(vectors["i-input"])]
    assert dependency_lock(pairs) == vectors["i-lock"].encode()
    assert dependency_lock_sha256(pairs) == vectors["i-sha256"]
    assert hashlib.sha256(vectors["i-lock"].encode()).hexdigest() == vectors["i-sha256"]


def test_vector_j_task_digest(vectors: dict[str, str]) -> None:
    folder = ROOT / "ale/tasks/cartpole-balance"
    paper = (folder / "paper.md").read_bytes()
    assert hashlib.sha256(paper).hexdigest() == vectors["j-paper-sha256"]
    body = {"paper_sha256": vectors["j-paper-sha256"], "task": json.loads((folder / "task.json").read_bytes())}
    assert hashlib.sha256(rfc8785.dumps(body)).hexdigest() == vectors["j-digest"]
    assert catalog.get_task("cartpole-balance").digest == vectors["j-digest"]


def test_code_digest_is_what_formats_md_says() -> None:
    import ale
    from ale.runner.local import code_digest

    stated = code_digest()
    concatenation = b""
    for package in (ale, ale_evaluator):
        root = Path(package.__file__).resolve().parent
        for path in sorted(root.rglob("*")):
            if path.suffix in {".py", ".json", ".md", ".proto", ".pyi"} and "__pycache__" not in path.parts:
                name = f"{package.__name__}/{path.relative_to(root).as_posix()}"
                concatenation += name.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest()
    assert stated["code_sha256"] == hashlib.sha256(concatenation).hexdigest()
    # Recompute the lock from the installed distributions with the documented rule, by hand.
    lines = sorted(
        "{}=={}".format(re.sub(r"[-_.]+", "-", d.metadata["Name"]).lower(), d.version)
        for d in importlib.metadata.distributions()
    )
    assert stated["dependency_lock_sha256"] == hashlib.sha256("\n".join(lines).encode()).hexdigest()
