"""The bundle's JSON documents as frozen attrs classes (parse, don't validate).

Each of ``manifest.json``, ``score_breakdown.json``, ``faithfulness.json``,
``network_summary.json``, ``artifacts_manifest.json`` and ``integrity.json`` is parsed with
:func:`ale.core.parse.parse_json` and structured through the one cattrs converter (unknown members
refused, strict types) into the classes below, which mirror the published JSON Schemas in
``ale/schemas/`` member for member (a test compares them). ``task_results.json`` is
:class:`ale.core.results.TaskResults`. Past this boundary the verifier handles typed values only.

Self-elevation is looked for before anything else (:func:`find_elevation`): a member named like a
verification level anywhere in a document is refused as ``self_elevation``, so the code names the
attempt rather than the schema violation it also is.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any, Literal

import attrs

from ale.core.parse import Scalar, non_negative
from ale.core.results import Ended
from ale.core.trajectory import WALL_TIME

MANIFEST_SCHEMA = "ale-bundle-manifest/v1"
FAITHFULNESS_SCHEMA = "ale-faithfulness/v2"
JUDGE_INPUT_FORMAT = "ale-judge-input/v1"
NETWORK_SCHEMA = "ale-network-summary/v1"
ARTIFACTS_SCHEMA = "ale-artifacts-manifest/v1"
INTEGRITY_SCHEMA = "ale-bundle-integrity/v1"

_HEX64 = re.compile(r"[0-9a-f]{64}")


def _digest(_inst: object, attr: attrs.Attribute[str], value: str) -> None:
    if not _HEX64.fullmatch(value):
        raise ValueError(f"{attr.name} must be 64 lowercase hex digits")


def _optional_digest(_inst: object, attr: attrs.Attribute[str | None], value: str | None) -> None:
    if value is not None and not _HEX64.fullmatch(value):
        raise ValueError(f"{attr.name} must be null or 64 lowercase hex digits")


def _is(name: str) -> Callable[[object, attrs.Attribute[str], str], None]:
    def check(_inst: object, attr: attrs.Attribute[str], value: str) -> None:
        if value != name:
            raise ValueError(f"{attr.name} must be {name!r}")

    return check


def _true(_inst: object, attr: attrs.Attribute[bool], value: bool) -> None:
    if value is not True:
        raise ValueError(f"{attr.name} must be true")


Genre = Literal["reproduction", "open"]
Mode = Literal["interactive", "batch"]
Digest = str

# -- manifest.json ----------------------------------------------------------------------------


@attrs.frozen
class Harness:
    name: str
    version: str


@attrs.frozen
class ReleaseRef:
    name: str
    manifest_sha256: Digest = attrs.field(validator=_digest)
    required_task_set_hash: Digest = attrs.field(validator=_digest)


@attrs.frozen
class AgentPhase:
    exit_status: int | None
    stopped_for: Literal["", "wall_time", "env_steps", "disk", "cancelled", "evaluator_died"]
    wall_time_s: float
    env_steps: int = attrs.field(validator=non_negative)
    oom_kills: int = attrs.field(validator=non_negative)


@attrs.frozen
class PhaseNetwork:
    """Each phase's network policy: ``none`` (no network at all), or the LLM gateway ``open`` while
    the agent works and ``closed`` while its policy is scored (the scored policy never has a way out)."""

    agent: Literal["open", "none"]
    official: Literal["closed", "none"]


@attrs.frozen
class ManifestTask:
    id: str
    version: str
    digest: Digest = attrs.field(validator=_digest)
    genre: Genre
    mode: Mode
    official_episodes: int = attrs.field(validator=non_negative)
    episodes_run: int = attrs.field(validator=non_negative)
    agent: AgentPhase
    network: PhaseNetwork
    ended: Ended | None = None  # how a task that ended early ended (as its task_results.json entry says)

    @property
    def ref(self) -> str:
        return f"{self.id}@{self.version}"


def _declared(_inst: object, attr: attrs.Attribute[dict[str, Scalar]], value: dict[str, Scalar]) -> None:
    for key in DECLARED_STRINGS:
        if value.get(key) is not None and not isinstance(value[key], str):
            raise ValueError(f"declared {key} must be a string or null")


#: Members of ``agent.declared`` that are strings (or null) when present; the others are any JSON scalar.
DECLARED_STRINGS = ("model", "effort")


_IMAGE_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def _image_digest(_inst: object, attr: attrs.Attribute[str], value: str) -> None:
    if not _IMAGE_DIGEST.fullmatch(value):
        raise ValueError(f"{attr.name} must be sha256: and 64 lowercase hex digits")


@attrs.frozen
class AgentEnvironment:
    """The environment the local runtime assembled and mounted at /ale/python."""

    digest: Digest = attrs.field(validator=_digest)
    modules: tuple[str, ...]
    distributions: tuple[str, ...]


@attrs.frozen
class AgentImage:
    name: str
    digest: str = attrs.field(validator=_image_digest)  # sha256:...


@attrs.frozen
class Interpreter:
    executable: str
    version: str
    package: str  # the Debian package that installed it, and its version


@attrs.frozen
class ImageAgentEnvironment:
    """An OCI runtime's: the agent image's own Python (its digest, interpreter, distributions)."""

    image: AgentImage
    python: Interpreter
    modules: tuple[str, ...]
    distributions: tuple[str, ...]


@attrs.frozen
class Agent:
    name: str
    command: tuple[str, ...]
    declared: dict[str, Scalar] = attrs.field(validator=_declared)  # the submitter's word, never scored
    environment: AgentEnvironment | ImageAgentEnvironment


@attrs.frozen
class CodeAttestation:
    kind: Literal["local-install"]
    note: str
    code_sha256: Digest = attrs.field(validator=_digest)
    dependency_lock_sha256: Digest = attrs.field(validator=_digest)
    python: str


@attrs.frozen
class ImagesCodeAttestation:
    """An OCI runtime's: the manifest digests of the images that ran (hex, without ``sha256:``)."""

    kind: Literal["oci-images"]
    note: str
    evaluator_image_sha256: Digest = attrs.field(validator=_digest)
    agent_image_sha256: Digest = attrs.field(validator=_digest)
    images_lock_sha256: Digest = attrs.field(validator=_digest)


@attrs.frozen
class RanImage:
    digest: str = attrs.field(validator=_image_digest)  # the OCI manifest digest, sha256:...
    definition_sha256: Digest = attrs.field(validator=_digest)


@attrs.frozen
class RanImages:
    """The images an OCI runtime ran (docs/images.md, "Attestation"), checked against their lock."""

    lock_sha256: Digest = attrs.field(validator=_digest)
    images: dict[str, RanImage]


@attrs.frozen
class Engine:
    """An OCI runtime's engine: its CLI's name and version, the engine behind it, its OCI runtime."""

    name: Literal["podman", "docker"]
    version: str
    server: str
    oci_runtime: str


@attrs.frozen
class SeccompDetails:
    profile: str
    source: str
    arch: str
    libseccomp: str
    program_sha256: Digest = attrs.field(validator=_digest)


@attrs.frozen
class CgroupDetails:
    version: Literal[1, 2]
    parents: dict[str, str]


@attrs.frozen
class UidDetails:
    range: tuple[int, int]


@attrs.frozen
class FilesystemDetails:
    kind: Literal["tmpfs"]
    bytes_per_inode: int = attrs.field(validator=non_negative)


def _facility_consistent(inst: Any, _a: Any, details: Any) -> None:
    if inst.in_force != (details is not None) or inst.in_force != (inst.reason is None):
        raise ValueError("a facility in force has details and no reason; a missing one a reason and no details")


@attrs.frozen
class SeccompFacility:
    in_force: bool
    reason: str | None
    details: SeccompDetails | None = attrs.field(validator=_facility_consistent)


@attrs.frozen
class CgroupFacility:
    in_force: bool
    reason: str | None
    details: CgroupDetails | None = attrs.field(validator=_facility_consistent)


@attrs.frozen
class UidFacility:
    in_force: bool
    reason: str | None
    details: UidDetails | None = attrs.field(validator=_facility_consistent)


@attrs.frozen
class FilesystemFacility:
    in_force: bool
    reason: str | None
    details: FilesystemDetails | None = attrs.field(validator=_facility_consistent)


@attrs.frozen
class Isolation:
    """What of the sandbox's isolation this machine provided (``docs/agent-contract.md``)."""

    seccomp: SeccompFacility
    cgroup: CgroupFacility
    uid: UidFacility
    filesystems: FilesystemFacility


@attrs.frozen
class Runtime:
    runtime: Literal["local", "podman", "docker"]
    sandbox: Literal["bwrap", "podman", "docker"]
    engine: Engine | None  # the OCI runtimes' (null for the local runtime)
    images: RanImages | None  # what the OCI runtimes ran, by digest (null for the local runtime)
    isolation: Isolation
    code: CodeAttestation | ImagesCodeAttestation


@attrs.frozen
class Challenge:
    nonce: str
    token: str | None


@attrs.frozen
class TrajectorySummary:
    schema: Literal["ale-trajectory-event/v1"]
    events: int = attrs.field(validator=non_negative)
    chain_head: Digest = attrs.field(validator=_digest)


def _optional_seconds(_inst: object, attr: attrs.Attribute[float | None], value: float | None) -> None:
    if value is not None and not (0 <= value < float("inf")):
        raise ValueError(f"{attr.name} must be a number of seconds, not negative")


#: How far ``run.active_s`` may exceed ``run.finished - run.started``: the timestamps' and the
#: rounded seconds' last digits (microseconds), never a span of the run.
ACTIVE_SLACK_S = 1e-3


def wall_seconds(text: str) -> float:
    """Seconds since the epoch of a wall time as the formats write it (RFC 3339 UTC, six
    fractional digits, a Z): ValueError for any other text."""
    if not WALL_TIME.fullmatch(text):
        raise ValueError(f"{text!r} is not an RFC 3339 UTC time with six fractional digits and a Z")
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).timestamp()


@attrs.frozen
class RunInfo:
    completed: bool = attrs.field(validator=_true)
    official_episode_counts: bool
    started: str
    finished: str
    # the run's runtime: the sum of its active spans (a resumed run's time while stopped is not in
    # it); absent in bundles of harnesses before it
    active_s: float | None = attrs.field(default=None, validator=_optional_seconds)

    def __attrs_post_init__(self) -> None:
        """The runtime lies within the run's wall-clock span (docs/formats.md, ``run.active_s``)."""
        if self.active_s is None:
            return
        wall = wall_seconds(self.finished) - wall_seconds(self.started)
        if self.active_s > wall + ACTIVE_SLACK_S:
            raise ValueError(
                f"active_s ({self.active_s} s) is more than the run's wall-clock span, "
                f"finished - started ({wall:.6f} s)"
            )


@attrs.frozen
class JudgeInfo:
    """The faithfulness judge the run used (``ale run --judge-model``), docs/judge.md."""

    model: str
    endpoint: str  # scheme://host[:port] of the Chat Completions endpoint
    prompt: Literal["ale-judge-prompt/v1"]
    key_id: Digest | None = attrs.field(validator=_optional_digest)  # the judge key that signed its verdicts


@attrs.frozen
class Manifest:
    schema: str = attrs.field(validator=_is(MANIFEST_SCHEMA))
    run_id: str
    harness: Harness
    release: ReleaseRef
    tasks: tuple[ManifestTask, ...]
    agent: Agent
    runtime: Runtime
    challenge: Challenge | None
    trajectory: TrajectorySummary
    run: RunInfo
    judge: JudgeInfo | None


# -- score_breakdown.json ---------------------------------------------------------------------


@attrs.frozen
class TaskScoreClaim:
    task: str
    genre: Genre
    metric: str
    direction: Literal["higher", "lower"]
    measured: float
    paper_value: float
    gap: float
    penalties: dict[str, float]
    score: float
    faithful: bool | None
    final: float
    episodes: int = attrs.field(validator=non_negative)
    passed: int = attrs.field(validator=non_negative)
    pass_rate: float


@attrs.frozen
class Categories:
    overall: float | None
    reproduction: float | None
    open: float | None


@attrs.frozen
class AggregateClaim:
    method: Literal["macro_mean"]
    missing_tasks: Literal["exclude", "zero"]
    macro_mean: float | None
    categories: Categories
    pass_rate: float | None
    covered: tuple[str, ...]
    missing: tuple[str, ...]
    extra: tuple[str, ...]
    coverage_complete: bool
    required_task_set_hash: Digest = attrs.field(validator=_digest)


@attrs.frozen
class IntervalClaim:
    lower: float
    upper: float


@attrs.frozen
class IntervalCategories:
    overall: IntervalClaim | None
    reproduction: IntervalClaim | None
    open: IntervalClaim | None


def _equals(value: object) -> Callable[[object, attrs.Attribute[Any], Any], None]:
    def check(_inst: object, attr: attrs.Attribute[Any], given: Any) -> None:
        if type(given) is not type(value) or given != value:
            raise ValueError(f"{attr.name} must be {value!r}")

    return check


@attrs.frozen
class IntervalsClaim:
    """The 95% intervals of the scores (docs/intervals.md); v1 fixes the method and its parameters."""

    method: str = attrs.field(validator=_is("ale-bootstrap/v1"))
    confidence: float = attrs.field(validator=_equals(0.95))
    resamples: int = attrs.field(validator=_equals(1999))
    tasks: dict[str, IntervalClaim]
    macro_mean: IntervalClaim | None
    categories: IntervalCategories


@attrs.frozen
class ScoreBreakdown:
    schema: str = attrs.field(validator=_is("ale-score-breakdown/v1"))
    release: str
    cap: float
    eps: float
    tasks: tuple[TaskScoreClaim, ...]
    aggregate: AggregateClaim
    intervals: IntervalsClaim | None = None  # absent from an older runner's document


# -- faithfulness.json, network_summary.json, artifacts_manifest.json -------------------------


@attrs.frozen
class Signature:
    """An Ed25519 signature block (integrity.json's runner signature, a judge's verdict)."""

    algorithm: Literal["ed25519"]
    key_id: Digest = attrs.field(validator=_digest)
    public_key: str
    value: str


@attrs.frozen
class Finding:
    item: str
    kind: Literal["method", "shortcut", "hacking"]
    satisfied: bool
    evidence: str


Outcome = Literal["judged", "no_judge", "error", "refusal", "unparsable", "wrong_input", "not_completed", "open_genre"]


@attrs.frozen
class Verdict:
    """One task's faithfulness entry (ale.core.verdict.JudgeResult writes it)."""

    outcome: Outcome
    faithful: bool | None
    judge_model: str | None
    input_sha256: Digest | None = attrs.field(validator=_optional_digest)
    rationale: str
    findings: tuple[Finding, ...]
    signature: Signature | None


@attrs.frozen
class Faithfulness:
    schema: str = attrs.field(validator=_is(FAITHFULNESS_SCHEMA))
    judge_input: Literal["ale-judge-input/v1"]
    tasks: dict[str, Verdict]


@attrs.frozen
class Requests:
    total: int = attrs.field(validator=non_negative)
    allowed: int = attrs.field(validator=non_negative)
    denied: int = attrs.field(validator=non_negative)


@attrs.frozen
class Usage:
    input_tokens: int = attrs.field(validator=non_negative)
    output_tokens: int = attrs.field(validator=non_negative)
    cached_input_tokens: int = attrs.field(validator=non_negative)


@attrs.frozen
class ProxyUpstream:
    name: str
    api: Literal["openai", "anthropic"]
    host: str


@attrs.frozen
class Proxy:
    """The LLM gateway the agent's sandbox could reach, and the upstreams it forwarded to."""

    name: str
    version: str
    upstreams: tuple[ProxyUpstream, ...]


@attrs.frozen
class NetworkSummary:
    schema: str = attrs.field(validator=_is(NETWORK_SCHEMA))
    proxy: Proxy | None
    policy: str
    phases: PhaseNetwork
    requests: Requests
    usage: Usage


@attrs.frozen
class Artifact:
    task: str
    path: str
    bytes: int = attrs.field(validator=non_negative)
    sha256: Digest = attrs.field(validator=_digest)


@attrs.frozen
class ArtifactsManifest:
    schema: str = attrs.field(validator=_is(ARTIFACTS_SCHEMA))
    artifacts: tuple[Artifact, ...]


# -- integrity.json ---------------------------------------------------------------------------


@attrs.frozen
class Integrity:
    schema: str = attrs.field(validator=_is(INTEGRITY_SCHEMA))
    files: dict[str, Digest]
    merkle_root: Digest = attrs.field(validator=_digest)
    chain_head: Digest = attrs.field(validator=_digest)
    signature: Signature | None


#: Each JSON file of a bundle and the class it is parsed into (task_results.json: ale.core.results).
DOCUMENT_CLASSES: dict[str, type] = {
    "manifest.json": Manifest,
    "score_breakdown.json": ScoreBreakdown,
    "faithfulness.json": Faithfulness,
    "network_summary.json": NetworkSummary,
    "artifacts_manifest.json": ArtifactsManifest,
    "integrity.json": Integrity,
}

# -- self-elevation ---------------------------------------------------------------------------

#: Member names that would claim a verification level: the verifier assigns levels, no upload does.
#: (``status`` is a level-like query parameter for the API, but a legitimate member of
#: task_results.json, so documents are not searched for it.)
ELEVATION_MEMBERS = frozenset({"level", "verification_level", "verified", "audited", "officially_verified"})


def _normalised(key: str) -> str:
    return key.strip().lower().replace("-", "_").replace(" ", "_")


def _members(value: Any, path: str) -> Iterator[tuple[str, str]]:
    """Every (path, member name) of a parsed JSON value, without recursion (depth is bounded by the parser)."""
    stack = [(value, path)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, dict):
            for key, child in item.items():
                yield where, key
                stack.append((child, f"{where}.{key}"))
        elif isinstance(item, list):
            stack.extend((child, f"{where}[{i}]") for i, child in enumerate(item))


def find_elevation(document: Any) -> str | None:
    """The path of the first member that claims a level (``level``, ``verified``, ...), or None.

    Names are compared case-insensitively, with ``-`` and spaces read as ``_``."""
    found = sorted(f"{where}.{key}" for where, key in _members(document, "") if _normalised(key) in ELEVATION_MEMBERS)
    return found[0].lstrip(".") if found else None
