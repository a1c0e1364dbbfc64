"""The offline half of verification: everything that can be proven from the bundle's bytes.

Steps, in ``architecture.txt``'s order (the site adds the challenge token and persistence):

1. decrypt, bounded decompression, safe tar inspection, allow-list (:func:`ale.core.bundle.unpack`);
2. parse every JSON file strictly (``schema_invalid``);
3. verify the trajectory's hash chain and that it binds the challenge nonce (``chain_invalid``);
4. verify the integrity root: each file's SHA-256, the Merkle root, the chain head (``integrity_mismatch``);
5. verify benchmark and task versions against the release, and coverage (``unknown_task_version``);
6. recompute the scores from the evaluator results and compare them with the claimed ones
   (``score_mismatch``).

Each failure is a :class:`VerificationError` with a stable ``reason`` code.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from ale.core import bundle
from ale.core.canonical import CanonicalError, canonical_json
from ale.core.merkle import files_root
from ale.core.parse import ParseError
from ale.core.release import ReleaseManifest
from ale.core.results import (
    ResultInconsistency,
    RunScore,
    TaskResults,
    parse_task_results,
    score_breakdown_document,
    score_run,
)
from ale.core.tasks import TaskSpec
from ale.core.trajectory import ChainError, ChainSummary, ChunkReport, link_chunks, verify_chain

MAX_EVENTS_BYTES = 256 * 1024 * 1024


class VerificationError(ValueError):
    """A bundle that fails a check; ``reason`` is stable (stored and returned by the verifier)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@attrs.frozen
class Report:
    manifest: dict[str, Any]
    results: TaskResults
    chain: ChainSummary
    recomputed: RunScore
    claimed: dict[str, Any]
    faithfulness: dict[str, Any]
    integrity: dict[str, Any]
    network: dict[str, Any]
    artifacts: dict[str, Any]


def _object(files: Mapping[str, bytes], name: str, schema: str | None) -> dict[str, Any]:
    try:
        value = json.loads(files[name])
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        raise VerificationError("schema_invalid", f"{name} is not valid JSON") from None
    if not isinstance(value, dict) or (schema is not None and value.get("schema") != schema):
        raise VerificationError("schema_invalid", f"{name} is not a {schema or 'JSON object'} document")
    return value


def _events(raw: bytes, on_block: Callable[[bytes], None] | None = None) -> bytes:
    """Decompress the trajectory, refusing it as soon as it grows past its limit."""
    try:
        limits = bundle.Limits(max_decompressed=MAX_EVENTS_BYTES)
        return bundle.decompress(raw, limits, on_block, keep=on_block is None)
    except bundle.BundleError as exc:
        reason = "too_large" if exc.reason == "decompressed_too_large" else "schema_invalid"
        raise VerificationError(reason, f"events.jsonl.zst: {exc}") from None


def _close(a: Any, b: Any) -> bool:
    """Structural equality with floats compared to 1e-9 relative; booleans never equal numbers."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, float) or isinstance(b, float):
        return (
            isinstance(a, (int, float))
            and isinstance(b, (int, float))
            and math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
        )
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and bool(a == b)


@attrs.frozen
class Documents:
    """Step 2's output: every file parsed."""

    manifest: dict[str, Any]
    results: TaskResults
    claimed: dict[str, Any]
    faithfulness: dict[str, Any]
    network: dict[str, Any]
    artifacts: dict[str, Any]
    integrity: dict[str, Any]
    events: bytes


Validator = Callable[[str, Any], None]


def parse_documents(
    files: Mapping[str, bytes], validate: Validator | None = None, on_events: Callable[[bytes], None] | None = None
) -> Documents:
    """Step 2: every JSON file parses, is canonical (RFC 8785 plus a newline), and is the document it
    claims to be; with ``validate(file_name, document)`` (the published JSON Schemas) strictly so.
    ``on_events`` takes the trajectory's blocks as they are decompressed, instead of ``events``
    (which is then empty; see :func:`check_chain`)."""
    for name, data in files.items():
        if name.endswith(".json"):
            doc = _object(files, name, None)
            try:
                canonical = canonical_json(doc) + b"\n"
            except CanonicalError as exc:
                raise VerificationError("schema_invalid", f"{name}: {exc}") from None
            if canonical != data:
                raise VerificationError("schema_invalid", f"{name} is not in canonical form (RFC 8785 and a newline)")
            if validate is not None:
                try:
                    validate(name, doc)
                except ValueError as exc:
                    raise VerificationError("schema_invalid", str(exc)) from None
    manifest = _object(files, "manifest.json", "ale-bundle-manifest/v1")
    claimed = _object(files, "score_breakdown.json", "ale-score-breakdown/v1")
    faithfulness = _object(files, "faithfulness.json", "ale-faithfulness/v1")
    network = _object(files, "network_summary.json", "ale-network-summary/v1")
    artifacts = _object(files, "artifacts_manifest.json", "ale-artifacts-manifest/v1")
    integrity = _object(files, "integrity.json", "ale-bundle-integrity/v1")
    try:
        results = parse_task_results(files["task_results.json"])
    except ParseError as exc:
        raise VerificationError("schema_invalid", str(exc)) from None
    except ResultInconsistency as exc:
        raise VerificationError("inconsistent_results", str(exc)) from None
    return Documents(manifest, results, claimed, faithfulness, network, artifacts, integrity,
                     _events(files["events.jsonl.zst"], on_events))  # fmt: skip


def check_chain(
    docs: Documents,
    *,
    expected_nonce: str | None = None,
    check_nonce: bool = False,
    reports: Callable[[], list[ChunkReport] | bytes] | None = None,
) -> ChainSummary:
    """Hash chains: every link, counter and hash of the trajectory, and the nonce in its first event.

    ``reports`` is for a trajectory that went to ``parse_documents(on_events=...)``: it gives the
    chunks' reports, checked elsewhere (by worker processes, in order), so that only the links
    between them are checked here; or the whole stream, to check in one pass. The verdict is the
    same either way.
    """
    try:
        checked = reports() if reports is not None else docs.events
        if isinstance(checked, bytes):
            return verify_chain(checked, expected_nonce=expected_nonce, check_nonce=check_nonce)
        return link_chunks(checked, expected_nonce=expected_nonce, check_nonce=check_nonce)
    except ChainError as exc:
        raise VerificationError(
            "nonce_mismatch" if exc.reason == "nonce_mismatch" else "chain_invalid", f"trajectory: {exc} ({exc.reason})"
        ) from None


def file_digests(files: Mapping[str, bytes]) -> dict[str, str]:
    """SHA-256 (hex) of every file but ``integrity.json``, which records them."""
    return {name: hashlib.sha256(data).hexdigest() for name, data in files.items() if name != "integrity.json"}


def check_integrity(
    files: Mapping[str, bytes], docs: Documents, chain: ChainSummary, digests: Mapping[str, str] | None = None
) -> str:
    """The integrity root: file digests, the Merkle root, the chain head. Returns the root.
    ``digests`` are :func:`file_digests` of ``files`` when the caller computed them already."""
    digests = dict(file_digests(files) if digests is None else digests)
    integrity = docs.integrity
    if integrity.get("files") != digests:
        raise VerificationError("integrity_mismatch", "a file's SHA-256 differs from integrity.json")
    root = files_root(digests)
    if integrity.get("merkle_root") != root:
        raise VerificationError("integrity_mismatch", "the Merkle root differs from integrity.json")
    if integrity.get("chain_head") != chain.head:
        raise VerificationError("integrity_mismatch", "the trajectory's chain head differs from integrity.json")
    trajectory = docs.manifest.get("trajectory") or {}
    if trajectory.get("chain_head") != chain.head or trajectory.get("events") != chain.events:
        raise VerificationError("integrity_mismatch", "the manifest's trajectory summary differs from the trajectory")
    check_results_in_trajectory(docs, chain)
    return root


def check_results_in_trajectory(docs: Documents, chain: ChainSummary) -> None:
    """The results belong to the recorded run: the run id of the trajectory's first event, and for
    every completed task the evaluator's own ``eval_result`` event with the same numbers."""
    if chain.run_id is None or chain.run_id != docs.manifest.get("run_id") or chain.run_id != docs.results.run_id:
        raise VerificationError("inconsistent_results", "the results do not belong to the run the trajectory records")
    for t in docs.results.tasks:
        r = t.result
        if t.status != "completed" or r is None:
            continue
        seen = chain.eval_results.get(r.session_id)
        if seen is None:
            raise VerificationError("inconsistent_results", f"{t.task}: the trajectory has no evaluator result for it")
        recorded = (seen.get("complete"), seen.get("headline_value"), seen.get("passed_episodes"))
        if recorded != (r.complete, r.headline_value, r.passed_episodes):
            raise VerificationError(
                "inconsistent_results", f"{t.task}: the result differs from what the evaluator logged"
            )


def check_versions(
    docs: Documents,
    *,
    release_for: Callable[[str], tuple[ReleaseManifest, str] | None],
    known_tasks: Mapping[str, tuple[TaskSpec, str]],
) -> ReleaseManifest:
    """Benchmark and task versions: a known release, known task definitions (by digest), and every
    property the score depends on (genre, mode, metric, direction, episode count) taken from the
    task definition, never from the bundle's word."""
    release_info = docs.manifest.get("release") or {}
    found = release_for(str(release_info.get("manifest_sha256")))
    if found is None:
        raise VerificationError("unknown_release", f"unknown release manifest {release_info.get('manifest_sha256')!r}")
    release, _ = found
    if release_info.get("required_task_set_hash") != release.required_task_set_hash:
        raise VerificationError("unknown_release", "the manifest's required task set hash is not the release's")
    results = docs.results
    by_ref = {t.task: t for t in results.tasks}
    if results.run_id != docs.manifest.get("run_id"):
        raise VerificationError("inconsistent_results", "task_results.json belongs to another run")
    official_counts = bool((docs.manifest.get("run") or {}).get("official_episode_counts"))
    listed = []
    for task in docs.manifest.get("tasks") or []:
        ref = f"{task.get('id')}@{task.get('version')}"
        listed.append(ref)
        known = known_tasks.get(ref)
        if known is None or known[1] != task.get("digest"):
            raise VerificationError("unknown_task_version", f"{ref} (digest {task.get('digest')}) is not a known task")
        spec = known[0]
        if (task.get("genre"), task.get("mode"), task.get("official_episodes")) != (
            spec.genre,
            spec.mode,
            spec.official_episodes,
        ):
            raise VerificationError("task_mismatch", f"{ref}: the manifest misstates its genre, mode or episodes")
        if ref not in release.tasks:
            raise VerificationError("unknown_task_version", f"{ref} is not part of release {release.release}")
        result = by_ref[ref].result if ref in by_ref else None
        if result is not None and task.get("episodes_run") != result.num_episodes:
            raise VerificationError("inconsistent_results", f"{ref}: the manifest's episode count is not the result's")
    if sorted(listed) != sorted(t.task for t in results.tasks):
        raise VerificationError("inconsistent_results", "the manifest and task_results.json list different tasks")
    for t in results.tasks:
        known = known_tasks.get(t.task)
        if known is None or t.task not in release.tasks:
            raise VerificationError("unknown_task_version", f"{t.task} is not part of release {release.release}")
        spec, digest = known
        if (t.genre, t.mode, t.official_episodes) != (spec.genre, spec.mode, spec.official_episodes):
            raise VerificationError(
                "task_mismatch", f"{t.task}: task_results.json misstates its genre, mode or episodes"
            )
        r = t.result
        if r is None:
            continue
        if r.task_digest != digest:
            raise VerificationError("unknown_task_version", f"{t.task}: the evaluator ran a different task definition")
        if r.run_id != results.run_id:
            raise VerificationError("inconsistent_results", f"{t.task}: the evaluator result belongs to another run")
        if (r.mode, r.headline_metric, r.headline_direction) != (
            spec.mode,
            spec.headline.metric,
            spec.headline.direction,
        ):
            raise VerificationError(
                "task_mismatch", f"{t.task}: the result's mode or headline metric is not the task's"
            )
        if {s.name for s in r.safety} != set(spec.safety_metrics):
            raise VerificationError("task_mismatch", f"{t.task}: the result's safety metrics are not the task's")
        if official_counts and r.num_episodes != spec.official_episodes:
            raise VerificationError(
                "task_mismatch", f"{t.task}: {r.num_episodes} episodes, but the task's official count is "
                f"{spec.official_episodes} and the run claims official counts"
            )  # fmt: skip
    return release


def recompute_scores(docs: Documents, release: ReleaseManifest) -> RunScore:
    """Recompute the scores from the evaluator results and compare them with the claimed ones."""
    verdicts: dict[str, bool | None] = {}
    for ref, v in (docs.faithfulness.get("tasks") or {}).items():
        if not isinstance(v, dict):
            continue
        verdict = v.get("verdict")
        if verdict is True and not v.get("judge"):
            raise VerificationError("inconsistent_results", f"{ref}: a faithful verdict without a judge")
        verdicts[ref] = verdict if isinstance(verdict, bool) else None
    recomputed = score_run(docs.results, release, verdicts)
    if not _close(json.loads(canonical_json(score_breakdown_document(recomputed, release))), docs.claimed):
        raise VerificationError(
            "score_mismatch", "the claimed scores differ from the scores recomputed from the results"
        )
    return recomputed


def check_files(
    files: Mapping[str, bytes],
    *,
    release_for: Callable[[str], tuple[ReleaseManifest, str] | None],
    known_tasks: Mapping[str, tuple[TaskSpec, str]],
    validate: Validator | None = None,
    expected_nonce: str | None = None,
    check_nonce: bool = False,
) -> Report:
    """Steps 2 to 6 over the unpacked files, for offline use (``ale inspect``, ``ale-verify check``).

    ``release_for(sha256)`` returns the release manifest with that hash (or None when unknown);
    ``known_tasks`` maps ``id@version`` to the task definition and digest this verifier knows;
    ``validate`` checks a document against its published JSON Schema.
    """
    docs = parse_documents(files, validate)
    chain = check_chain(docs, expected_nonce=expected_nonce, check_nonce=check_nonce)
    check_integrity(files, docs, chain)
    release = check_versions(docs, release_for=release_for, known_tasks=known_tasks)
    recomputed = recompute_scores(docs, release)
    return Report(docs.manifest, docs.results, chain, recomputed, docs.claimed, docs.faithfulness, docs.integrity,
                  docs.network, docs.artifacts)  # fmt: skip


def unpack(ciphertext: bytes, identity: str, limits: bundle.Limits | None = None) -> dict[str, bytes]:
    """Step 1, with bundle errors as VerificationError (same reason codes)."""
    try:
        return bundle.unpack(ciphertext, identity, limits)
    except bundle.BundleError as exc:
        raise VerificationError(exc.reason, str(exc)) from None
