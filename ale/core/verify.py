"""The offline half of verification: everything that can be proven from the bundle's bytes.

The site (``verify/pipeline.py``) and the offline checks (``ale inspect``, ``ale-verify check``:
:func:`check_files`) run these same functions, in ``architecture.txt``'s order; the site adds
only what needs its own records (the challenge token, one-time use, persistence):

1. decrypt, bounded decompression, safe and canonical tar, allow-list (:func:`ale.core.bundle.unpack`);
2. every document parses (:func:`ale.core.parse.parse_json`), claims no level (``self_elevation``),
   is canonical and schema-valid and structures into its model (``schema_invalid``), and
   task_results.json is self-consistent (``inconsistent_results``): :func:`parse_documents`;
3. the trajectory's hash chain, and the nonce bound in its first event (``chain_invalid``,
   ``nonce_mismatch``): :func:`check_chain`; network_summary.json recomputed from its network events
   (``network_mismatch``): :func:`check_network`;
4. the integrity root: each file's SHA-256, the Merkle root, the chain head (``integrity_mismatch``),
   and a runner signature (``bad_signature``, ``unregistered_runner``): :func:`check_integrity`,
   :func:`check_signature`;
5. benchmark and task versions against the release, the images that ran against the release's
   (``image_mismatch``), and coverage (``unknown_release``, ...): :func:`check_versions`;
6. the faithfulness verdicts, then the scores recomputed from the evaluator results and compared
   with the claimed ones (``inconsistent_results``, ``score_mismatch``): :func:`recompute_scores`.

Each failure is a :class:`VerificationError` with a stable :class:`~ale.core.reasons.Reason`.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import attrs

from ale.core import bundle
from ale.core.canonical import CanonicalError, canonical_json
from ale.core.documents import (
    DOCUMENT_CLASSES,
    ArtifactsManifest,
    CodeAttestation,
    Faithfulness,
    ImageAgentEnvironment,
    ImagesCodeAttestation,
    Integrity,
    Manifest,
    NetworkSummary,
    ScoreBreakdown,
    Signature,
    find_elevation,
)
from ale.core.faithfulness import Credit, JudgeKeyLookup, check_faithfulness, credit, judge_inputs
from ale.core.judge_input import JudgeInput, JudgeInputError, TaskContext
from ale.core.merkle import files_root
from ale.core.parse import ParseError, converter, parse_json, structure
from ale.core.reasons import Level, Reason, VerificationError
from ale.core.release import ReleaseManifest, image_mismatches
from ale.core.results import (
    ResultInconsistency,
    RunScore,
    TaskResults,
    check_task_results,
    score_breakdown_document,
    score_run,
)
from ale.core.signing import SignatureError, verify_root
from ale.core.tasks import TaskSpec
from ale.core.trajectory import ChainError, ChainSummary, ChunkReport, link_chunks, verify_chain

__all__ = ["Reason", "VerificationError"]  # re-exported: callers catch them from here

MAX_EVENTS_BYTES = 256 * bundle.MiB
MAX_DOCUMENT_BYTES = 32 * bundle.MiB  # one JSON document (task_results.json is the largest)
T = TypeVar("T")


@attrs.frozen
class RunnerKey:
    """A registered, active runner key, as the site (or an operator's command line) knows it."""

    key_id: str
    public_key: str  # base64 of the raw 32 bytes, as integrity.json writes it
    kind: str = "given"
    label: str = ""


#: Looks up an active runner key by key id; None when there is none.
KeyLookup = Callable[[str], RunnerKey | None]
Validator = Callable[[str, Any], None]


@attrs.frozen
class Documents:
    """Step 2's output: every file parsed into its model."""

    manifest: Manifest
    results: TaskResults
    claimed: ScoreBreakdown
    faithfulness: Faithfulness
    network: NetworkSummary
    artifacts: ArtifactsManifest
    integrity: Integrity
    events: bytes


@attrs.frozen
class Report:
    """What the offline checks proved, and what they could not check."""

    docs: Documents
    chain: ChainSummary
    root: str
    recomputed: RunScore
    runner: RunnerKey | None  # the registered key that signed it (None: unsigned, or not looked up)
    registration_checked: bool  # whether runner keys were given to look the signature's key up in
    not_checked: tuple[str, ...]
    inputs: Mapping[str, JudgeInput] = attrs.Factory(dict)  # the rebuilt judge inputs (none without rubrics)
    credits: Mapping[str, Credit] = attrs.Factory(dict)  # what a verifier without a judge of its own credits
    credited: RunScore | None = None  # the scores with those credits

    @property
    def manifest(self) -> Manifest:
        return self.docs.manifest

    @property
    def results(self) -> TaskResults:
        return self.docs.results

    @property
    def claimed(self) -> ScoreBreakdown:
        return self.docs.claimed


def plain(value: Any) -> Any:
    """A model as the JSON value it was parsed from (canonical numbers: 1.0 is 1)."""
    return parse_json(canonical_json(converter.unstructure(value)), what="a model", max_bytes=MAX_DOCUMENT_BYTES)


# -- step 2: the documents --------------------------------------------------------------------


def _parse(files: Mapping[str, bytes], name: str) -> Any:
    try:
        return parse_json(files[name], what=name, max_bytes=MAX_DOCUMENT_BYTES)
    except ParseError as exc:
        raise VerificationError(Reason.SCHEMA_INVALID, str(exc)) from None


def _check_form(name: str, raw: bytes, document: Any, validate: Validator | None) -> None:
    try:
        canonical = canonical_json(document) + b"\n"
    except CanonicalError as exc:
        raise VerificationError(Reason.SCHEMA_INVALID, f"{name}: {exc}") from None
    if canonical != raw:
        raise VerificationError(Reason.SCHEMA_INVALID, f"{name} is not in canonical form (RFC 8785 and a newline)")
    if validate is not None:
        try:
            validate(name, document)
        except ValueError as exc:
            raise VerificationError(Reason.SCHEMA_INVALID, str(exc)) from None


def _model(document: Any, cls: type[T], name: str) -> T:
    try:
        return structure(document, cls, what=name)
    except ParseError as exc:
        raise VerificationError(Reason.SCHEMA_INVALID, str(exc)) from None


def decompress_events(raw: bytes, on_block: Callable[[bytes], None] | None = None) -> bytes:
    """Decompress the trajectory (one zstd frame), refusing it as soon as it grows past its limit.
    With ``on_block``, each block goes to it as it comes, and the result is empty."""
    try:
        return bundle.decompress(raw, bundle.Limits(max_decompressed=MAX_EVENTS_BYTES), on_block, keep=on_block is None)
    except bundle.BundleError as exc:
        raise VerificationError(exc.reason, f"events.jsonl.zst: {exc}") from None


def decompress_events_into(raw: bytes, into: memoryview, on_block: Callable[[int, int], None] | None = None) -> int:
    """:func:`decompress_events` into ``into`` (MAX_EVENTS_BYTES at least; see
    :func:`ale.core.bundle.decompress_into`): the trajectory's size."""
    try:
        return bundle.decompress_into(raw, bundle.Limits(max_decompressed=MAX_EVENTS_BYTES), into, on_block)
    except bundle.BundleError as exc:
        raise VerificationError(exc.reason, f"events.jsonl.zst: {exc}") from None


def parse_documents(
    files: Mapping[str, bytes], validate: Validator | None = None, events: Callable[[], bytes] | None = None
) -> Documents:
    """Step 2: every JSON file parses and claims no level; then each is canonical (RFC 8785 plus
    a newline), valid against its published JSON Schema (with ``validate(file_name, document)``)
    and structured into its model; then the trajectory is decompressed. ``events`` stands for
    that last part: it gives what :func:`decompress_events` would (or raises what it would), e.g.
    the result of a decompression that went elsewhere while the documents were checked (empty:
    see :func:`check_chain`)."""
    names = sorted(n for n in files if n.endswith(".json"))
    parsed = {name: _parse(files, name) for name in names}
    for name in names:  # a level claim is named for what it is before any other fault of the documents
        where = find_elevation(parsed[name])
        if where is not None:
            raise VerificationError(
                Reason.SELF_ELEVATION, f"{name} carries {where!r}: verification levels are assigned by the verifier"
            )
    for name in names:
        _check_form(name, files[name], parsed[name], validate)
    models: dict[str, Any] = {name: _model(parsed[name], cls, name) for name, cls in DOCUMENT_CLASSES.items()}
    try:
        results = check_task_results(_model(parsed["task_results.json"], TaskResults, "task_results.json"))
    except ResultInconsistency as exc:
        raise VerificationError(Reason.INCONSISTENT_RESULTS, str(exc)) from None
    return Documents(
        manifest=models["manifest.json"],
        results=results,
        claimed=models["score_breakdown.json"],
        faithfulness=models["faithfulness.json"],
        network=models["network_summary.json"],
        artifacts=models["artifacts_manifest.json"],
        integrity=models["integrity.json"],
        events=decompress_events(files["events.jsonl.zst"]) if events is None else events(),
    )


# -- steps 3 and 4: chain, integrity, signature -----------------------------------------------


def check_chain(
    docs: Documents,
    *,
    expected_nonce: str | None = None,
    check_nonce: bool = False,
    reports: Callable[[], list[ChunkReport] | bytes] | None = None,
) -> ChainSummary:
    """Hash chains: every link, counter and hash of the trajectory, and the nonce in its first event.

    ``reports`` is for a trajectory decompressed elsewhere (``parse_documents(events=...)``): it
    gives the chunks' reports, checked elsewhere (by worker processes, in order), so that only the
    links between them are checked here; or the whole stream, to check in one pass. The verdict is
    the same either way.
    """
    try:
        checked = reports() if reports is not None else docs.events
        if isinstance(checked, bytes):
            return verify_chain(checked, expected_nonce=expected_nonce, check_nonce=check_nonce)
        return link_chunks(checked, expected_nonce=expected_nonce, check_nonce=check_nonce)
    except ChainError as exc:
        reason = Reason.NONCE_MISMATCH if exc.reason == "nonce_mismatch" else Reason.CHAIN_INVALID
        raise VerificationError(reason, f"trajectory: {exc} ({exc.reason})") from None


def check_network(docs: Documents, chain: ChainSummary) -> None:
    """network_summary.json against the trajectory (``network_mismatch``): the requests and tokens
    its network events add up to (:mod:`ale.core.network`), a proxy exactly when a gateway started
    (once, with the upstreams the summary names), and the same phase policies as every task's in
    the manifest, which are a gateway's (open, closed) exactly when there was one."""
    totals, summary = chain.network, docs.network
    if totals.get("unreadable"):
        raise VerificationError(
            Reason.NETWORK_MISMATCH, f"{totals['unreadable']} network events of the trajectory cannot be read"
        )
    claimed = {**converter.unstructure(summary.requests), **converter.unstructure(summary.usage)}
    recomputed = {name: totals.get(name, 0) for name in claimed}
    if claimed != recomputed:
        differ = ", ".join(
            f"{k} {claimed[k]} (trajectory: {recomputed[k]})" for k in claimed if claimed[k] != recomputed[k]
        )
        raise VerificationError(Reason.NETWORK_MISMATCH, f"network_summary.json's totals differ: {differ}")
    _check_proxy(summary, chain.gateways, len(docs.manifest.tasks))
    phases = converter.unstructure(summary.phases)
    expected = {"agent": "open", "official": "closed"} if chain.gateways else {"agent": "none", "official": "none"}
    if phases != expected or any(converter.unstructure(t.network) != phases for t in docs.manifest.tasks):
        raise VerificationError(
            Reason.NETWORK_MISMATCH, "the phases' network policies differ between the summary, the manifest and the run"
        )


def _check_proxy(summary: NetworkSummary, gateways: tuple[Any, ...], tasks: int) -> None:
    """A proxy exactly when a gateway started: one per task at most (each task has its own), all of
    them forwarding to the same upstreams, the summary's."""
    if len(gateways) > max(1, tasks):
        raise VerificationError(
            Reason.NETWORK_MISMATCH, f"the trajectory has {len(gateways)} gateway_started events for {tasks} tasks"
        )
    if any(g != gateways[0] for g in gateways):
        raise VerificationError(Reason.NETWORK_MISMATCH, "the tasks' gateways name different upstreams")
    if (summary.proxy is None) != (not gateways):
        had = "a gateway" if gateways else "no gateway"
        raise VerificationError(
            Reason.NETWORK_MISMATCH, f"the trajectory has {had}, which network_summary.json's proxy misstates"
        )
    if summary.proxy is not None and converter.unstructure(summary.proxy.upstreams) != gateways[0]:
        raise VerificationError(
            Reason.NETWORK_MISMATCH, "the summary's upstreams are not those the gateway_started event names"
        )


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
    if integrity.files != digests:
        raise VerificationError(Reason.INTEGRITY_MISMATCH, "a file's SHA-256 differs from integrity.json")
    root = files_root(digests)
    if integrity.merkle_root != root:
        raise VerificationError(Reason.INTEGRITY_MISMATCH, "the Merkle root differs from integrity.json")
    if integrity.chain_head != chain.head:
        raise VerificationError(Reason.INTEGRITY_MISMATCH, "the trajectory's chain head differs from integrity.json")
    summary = docs.manifest.trajectory
    if (summary.chain_head, summary.events) != (chain.head, chain.events):
        raise VerificationError(
            Reason.INTEGRITY_MISMATCH, "the manifest's trajectory summary differs from the trajectory"
        )
    check_results_in_trajectory(docs, chain)
    return root


def check_signature(docs: Documents, root: str, lookup: KeyLookup | None) -> tuple[Signature | None, RunnerKey | None]:
    """A runner signature over the root, if any: it must verify (``bad_signature``: no key is
    needed for that, the block carries its public key) and, with ``lookup``, name a registered,
    active runner key with that public key (``unregistered_runner``). Without ``lookup`` the
    registration is not checked, and the runner is None."""
    signature = docs.integrity.signature
    if signature is None:
        return None, None
    try:
        key_id = verify_root(converter.unstructure(signature), root)
    except SignatureError as exc:
        raise VerificationError(Reason.BAD_SIGNATURE, str(exc)) from None
    if lookup is None:
        return signature, None
    key = lookup(key_id)
    if key is None or key.public_key != signature.public_key:
        raise VerificationError(
            Reason.UNREGISTERED_RUNNER, "the bundle is signed by a key that is not a registered runner"
        )
    return signature, key


def check_results_in_trajectory(docs: Documents, chain: ChainSummary) -> None:
    """The results belong to the recorded run: the run id of the trajectory's first event, and for
    every completed task the evaluator's own ``eval_result`` event with the same numbers."""
    if chain.run_id is None or chain.run_id != docs.manifest.run_id or chain.run_id != docs.results.run_id:
        raise VerificationError(
            Reason.INCONSISTENT_RESULTS, "the results do not belong to the run the trajectory records"
        )
    _check_endings(docs, chain)
    for t in docs.results.tasks:
        r = t.result
        if t.status != "completed" or r is None:
            continue
        seen = chain.eval_results.get(r.session_id)
        if seen is None:
            raise VerificationError(
                Reason.INCONSISTENT_RESULTS, f"{t.task}: the trajectory has no evaluator result for it"
            )
        recorded = (seen.get("complete"), seen.get("headline_value"), seen.get("passed_episodes"))
        if recorded != (r.complete, r.headline_value, r.passed_episodes):
            raise VerificationError(
                Reason.INCONSISTENT_RESULTS, f"{t.task}: the result differs from what the evaluator logged"
            )


def _check_endings(docs: Documents, chain: ChainSummary) -> None:
    """How each task ended early, where it did: the same in task_results.json, in the manifest and
    in the trajectory's task_finished (docs/formats.md, "How a task ended early"; a bundle of an
    older harness has it in none of them)."""
    manifest = {t.ref: t.ended for t in docs.manifest.tasks}
    for t in docs.results.tasks:
        recorded = chain.task_ends.get(t.task)
        ended = None if t.ended is None else t.ended.entry()
        if manifest.get(t.task) != t.ended or recorded != ended:
            raise VerificationError(
                Reason.INCONSISTENT_RESULTS,
                f"{t.task}: how the task ended differs between task_results.json, the manifest and the trajectory",
            )


# -- step 5: versions -------------------------------------------------------------------------


def _find_release(docs: Documents, release_for: Callable[[str], tuple[ReleaseManifest, str] | None]) -> ReleaseManifest:
    ref = docs.manifest.release
    found = release_for(ref.manifest_sha256)
    if found is None:
        raise VerificationError(Reason.UNKNOWN_RELEASE, f"unknown release manifest {ref.manifest_sha256!r}")
    release, _ = found
    if ref.required_task_set_hash != release.required_task_set_hash:
        raise VerificationError(Reason.UNKNOWN_RELEASE, "the manifest's required task set hash is not the release's")
    return release


def _check_manifest_tasks(
    docs: Documents, release: ReleaseManifest, known_tasks: Mapping[str, tuple[TaskSpec, str]]
) -> None:
    by_ref = {t.task: t for t in docs.results.tasks}
    for task in docs.manifest.tasks:
        ref = task.ref
        known = known_tasks.get(ref)
        if known is None or known[1] != task.digest:
            raise VerificationError(Reason.UNKNOWN_TASK_VERSION, f"{ref} (digest {task.digest}) is not a known task")
        spec = known[0]
        if (task.genre, task.mode, task.official_episodes) != (spec.genre, spec.mode, spec.official_episodes):
            raise VerificationError(Reason.TASK_MISMATCH, f"{ref}: the manifest misstates its genre, mode or episodes")
        if ref not in release.tasks:
            raise VerificationError(Reason.UNKNOWN_TASK_VERSION, f"{ref} is not part of release {release.release}")
        result = by_ref[ref].result if ref in by_ref else None
        if result is not None and task.episodes_run != result.num_episodes:
            raise VerificationError(
                Reason.INCONSISTENT_RESULTS, f"{ref}: the manifest's episode count is not the result's"
            )
    if sorted(t.ref for t in docs.manifest.tasks) != sorted(by_ref):
        raise VerificationError(Reason.INCONSISTENT_RESULTS, "the manifest and task_results.json list different tasks")


def _check_result_tasks(
    docs: Documents, release: ReleaseManifest, known_tasks: Mapping[str, tuple[TaskSpec, str]]
) -> None:
    results = docs.results
    official_counts = docs.manifest.run.official_episode_counts
    for t in results.tasks:
        known = known_tasks.get(t.task)
        if known is None or t.task not in release.tasks:
            raise VerificationError(Reason.UNKNOWN_TASK_VERSION, f"{t.task} is not part of release {release.release}")
        spec, digest = known
        if (t.genre, t.mode, t.official_episodes) != (spec.genre, spec.mode, spec.official_episodes):
            raise VerificationError(
                Reason.TASK_MISMATCH, f"{t.task}: task_results.json misstates its genre, mode or episodes"
            )
        r = t.result
        if r is None:
            continue
        if r.task_digest != digest:
            raise VerificationError(
                Reason.UNKNOWN_TASK_VERSION, f"{t.task}: the evaluator ran a different task definition"
            )
        if r.run_id != results.run_id:
            raise VerificationError(
                Reason.INCONSISTENT_RESULTS, f"{t.task}: the evaluator result belongs to another run"
            )
        if (r.mode, r.headline_metric, r.headline_direction) != (
            spec.mode,
            spec.headline.metric,
            spec.headline.direction,
        ):
            raise VerificationError(
                Reason.TASK_MISMATCH, f"{t.task}: the result's mode or headline metric is not the task's"
            )
        if {s.name for s in r.safety} != set(spec.safety_metrics):
            raise VerificationError(Reason.TASK_MISMATCH, f"{t.task}: the result's safety metrics are not the task's")
        if official_counts and r.num_episodes != spec.official_episodes:
            raise VerificationError(
                Reason.TASK_MISMATCH, f"{t.task}: {r.num_episodes} episodes, but the task's official count is "
                f"{spec.official_episodes} and the run claims official counts"
            )  # fmt: skip


def check_images(docs: Documents, release: ReleaseManifest) -> None:
    """The images an OCI runtime ran (``runtime.images``) are the release's, where the release names
    them (``image_mismatch``), and the manifest says the same of them twice (``runtime.code``). A
    run of the local runtime ran no image: there is nothing to compare (the submission page says so)."""
    runtime, environment = docs.manifest.runtime, docs.manifest.agent.environment
    if runtime.images is None:
        if not isinstance(runtime.code, CodeAttestation):
            raise VerificationError(Reason.IMAGE_MISMATCH, "the manifest names image digests but no images")
        if isinstance(environment, ImageAgentEnvironment):
            raise VerificationError(Reason.IMAGE_MISMATCH, "the agent environment names an image, but none ran")
        return
    ran = {name: entry.digest for name, entry in runtime.images.images.items()}
    agent_image = environment.image if isinstance(environment, ImageAgentEnvironment) else None
    if agent_image is None or agent_image.name != "agent-base" or ran.get("agent-base") != agent_image.digest:
        raise VerificationError(Reason.IMAGE_MISMATCH, "the agent environment is not the agent image that ran")
    code = runtime.code
    if not isinstance(code, ImagesCodeAttestation):
        raise VerificationError(Reason.IMAGE_MISMATCH, "the manifest names images but no image digests")
    claimed = {"evaluator": f"sha256:{code.evaluator_image_sha256}", "agent-base": f"sha256:{code.agent_image_sha256}"}
    if any(ran.get(name) != digest for name, digest in claimed.items()):
        raise VerificationError(Reason.IMAGE_MISMATCH, "the manifest's image digests contradict each other")
    if code.images_lock_sha256 != runtime.images.lock_sha256:
        raise VerificationError(Reason.IMAGE_MISMATCH, "the manifest names two different images locks")
    problems = image_mismatches(release.images, ran)
    if problems:
        raise VerificationError(Reason.IMAGE_MISMATCH, f"release {release.release}: {'; '.join(problems)}")


def check_versions(
    docs: Documents,
    *,
    release_for: Callable[[str], tuple[ReleaseManifest, str] | None],
    known_tasks: Mapping[str, tuple[TaskSpec, str]],
) -> ReleaseManifest:
    """Benchmark and task versions: a known release, known task definitions (by digest), and every
    property the score depends on (genre, mode, metric, direction, episode count) taken from the
    task definition, never from the bundle's word."""
    release = _find_release(docs, release_for)
    check_images(docs, release)
    if docs.results.run_id != docs.manifest.run_id:
        raise VerificationError(Reason.INCONSISTENT_RESULTS, "task_results.json belongs to another run")
    _check_manifest_tasks(docs, release, known_tasks)
    _check_result_tasks(docs, release, known_tasks)
    return release


# -- step 6: faithfulness and scores ----------------------------------------------------------


def own_verdicts(docs: Documents) -> dict[str, bool | None]:
    """The bundle's verdicts by task, after the checks that need no rubric: exactly the run's
    tasks, no gate on an open-genre task, a faithful verdict only when judged and named by its
    model (:func:`ale.core.faithfulness.check_faithfulness` checks the rest, with the rubrics)."""
    entries = docs.faithfulness.tasks
    genres = {t.task: t.genre for t in docs.results.tasks}
    if set(entries) != set(genres):
        raise VerificationError(Reason.INCONSISTENT_RESULTS, "faithfulness.json does not list exactly the run's tasks")
    for ref, entry in sorted(entries.items()):
        if genres[ref] == "open" and entry.faithful is not None:
            raise VerificationError(
                Reason.INCONSISTENT_RESULTS,
                f"{ref}: an open-genre task has no faithfulness gate, so its verdict must be null",
            )
        if entry.faithful is True and (entry.outcome != "judged" or not entry.judge_model):
            raise VerificationError(Reason.INCONSISTENT_RESULTS, f"{ref}: a faithful verdict without a judge")
    return {ref: entry.faithful for ref, entry in entries.items()}


def trajectory(docs: Documents, files: Mapping[str, bytes]) -> bytes:
    """The decompressed trajectory: the one step 2 kept, or decompressed again (when step 2 fed it
    to the chain workers instead)."""
    return docs.events if docs.events else decompress_events(files["events.jsonl.zst"])


def check_verdicts(
    docs: Documents, contexts: Mapping[str, TaskContext], events: bytes
) -> tuple[dict[str, JudgeInput], dict[str, bool | None]]:
    """The judge inputs rebuilt from the bundle, and its verdicts once they are checked against
    them (:func:`ale.core.faithfulness.check_faithfulness`)."""
    own_verdicts(docs)
    try:
        inputs = judge_inputs(docs, contexts, events)
    except JudgeInputError as exc:  # the chain check has read every line: not reached
        raise VerificationError(Reason.CHAIN_INVALID, f"trajectory: {exc}") from None
    return inputs, check_faithfulness(docs, inputs, contexts)


def credited_scores(docs: Documents, release: ReleaseManifest, credits: Mapping[str, Credit]) -> RunScore:
    """The scores the board shows: the results scored with the credited verdicts only (a
    reproduction task without one is unjudged, so unfaithful)."""
    return score_run(docs.results, release, {ref: c.faithful for ref, c in credits.items()})


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
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and bool(a == b)


def recompute_scores(
    docs: Documents, release: ReleaseManifest, verdicts: Mapping[str, bool | None] | None = None
) -> RunScore:
    """Recompute the scores from the evaluator results and the bundle's own verdicts (``verdicts``,
    from :func:`check_verdicts`; by default :func:`own_verdicts`) and compare them with the claimed
    ones: the claims must follow from the bundle, their 95% intervals included when the bundle has
    them (an older runner's has none). What the board shows is :func:`credited_scores`."""
    recomputed = score_run(docs.results, release, own_verdicts(docs) if verdicts is None else verdicts)
    document = parse_json(canonical_json(score_breakdown_document(recomputed, release)), what="the recomputed scores")
    claimed = plain(docs.claimed)
    bounds, claimed_bounds = document.pop("intervals"), claimed.pop("intervals")
    if not _close(document, claimed):
        raise VerificationError(
            Reason.SCORE_MISMATCH, "the claimed scores differ from the scores recomputed from the results"
        )
    if claimed_bounds is not None and not _close(bounds, claimed_bounds):  # None: an older runner's
        raise VerificationError(
            Reason.SCORE_MISMATCH,
            "the claimed 95% intervals differ from the ones recomputed from the episodes (docs/intervals.md)",
        )
    return recomputed


# -- the level --------------------------------------------------------------------------------


def level_for(*, challenged: bool, official_episode_counts: bool, runner: bool) -> tuple[Level, list[dict[str, str]]]:
    """The level the backend can prove of an accepted bundle, with notes on what kept it lower:
    ``self_reported`` without a (valid, one-time) challenge or with overridden episode counts,
    else ``officially_verified`` when a registered runner signed it, else ``validated``."""
    notes = []
    if not challenged:
        notes.append({"reason": Reason.NO_CHALLENGE, "message": "the run had no challenge: freshness cannot be proven"})
    if not official_episode_counts:
        notes.append({"reason": Reason.UNOFFICIAL_EPISODES, "message": "the run overrode the official episode counts"})
    if notes:
        return Level.SELF_REPORTED, notes
    return (Level.OFFICIALLY_VERIFIED if runner else Level.VALIDATED), notes


# -- offline ----------------------------------------------------------------------------------


def not_checked_offline(docs: Documents, *, keys_given: bool) -> tuple[str, ...]:
    """What :func:`check_files` cannot prove without the site's own records."""
    missing = []
    if docs.manifest.challenge is None:
        missing.append("challenge: the run has none, so a site ranks it at most self_reported")
    else:
        missing.append(
            "challenge token: that the site issued it (its HMAC key), to this user, unexpired, and never used before"
        )
    if docs.integrity.signature is not None and not keys_given:
        missing.append("runner registration: the signature verifies, but no runner public keys were given")
    if docs.manifest.runtime.images is not None:
        missing.append(
            "image provenance: a site checks the statements its operator registered for the images that ran "
            "(ale-verify register-provenance); without them an official run is validated"
        )
    return tuple(missing)


def check_files(
    files: Mapping[str, bytes],
    *,
    release_for: Callable[[str], tuple[ReleaseManifest, str] | None],
    known_tasks: Mapping[str, tuple[TaskSpec, str]],
    validate: Validator | None = None,
    runner_keys: KeyLookup | None = None,
    contexts: Mapping[str, TaskContext] | None = None,
    judge_keys: JudgeKeyLookup | None = None,
) -> Report:
    """Steps 2 to 6 over the unpacked files, as the site runs them, for offline use (``ale
    inspect``, ``ale-verify check``): all but the challenge token's own checks, which need the
    site's records (the report's ``not_checked`` says so). The nonce in the manifest must be the
    one bound in the trajectory; the signature must verify, and with ``runner_keys`` name one of
    those keys.

    ``release_for(sha256)`` returns the release manifest with that hash (or None when unknown);
    ``known_tasks`` maps ``id@version`` to the task definition and digest this verifier knows;
    ``validate`` checks a document against its published JSON Schema; ``contexts`` maps
    ``id@version`` to what the judge input needs of a reproduction task (its paper and rubric), so
    that every verdict's input digest is rebuilt and checked; ``judge_keys`` looks up registered
    judge keys, whose signed verdicts are credited (nothing else is, offline: no re-judging here).
    """
    docs = parse_documents(files, validate)
    challenge = docs.manifest.challenge
    chain = check_chain(docs, expected_nonce=challenge.nonce if challenge else None, check_nonce=challenge is not None)
    check_network(docs, chain)
    root = check_integrity(files, docs, chain)
    _, runner = check_signature(docs, root, runner_keys)
    release = check_versions(docs, release_for=release_for, known_tasks=known_tasks)
    keys_given = runner_keys is not None
    not_checked = not_checked_offline(docs, keys_given=keys_given)
    if contexts is None:
        recomputed = recompute_scores(docs, release)
        not_checked += ("judge inputs: no rubrics were given to rebuild them and check the verdicts' digests",)
        return Report(docs, chain, root, recomputed, runner, keys_given, not_checked)
    inputs, verdicts = check_verdicts(docs, contexts, docs.events)
    recomputed = recompute_scores(docs, release, verdicts)
    credits = credit(docs, inputs, keys=judge_keys)
    credited = credited_scores(docs, release, credits)
    return Report(docs, chain, root, recomputed, runner, keys_given, not_checked, inputs, credits, credited)


def unpack(ciphertext: bytes, identity: str, limits: bundle.Limits | None = None) -> dict[str, bytes]:
    """Step 1 (its errors are VerificationErrors: BundleError is one)."""
    return bundle.unpack(ciphertext, identity, limits)
