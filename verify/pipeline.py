"""The upload pipeline, in ``architecture.txt``'s order. Each step is a small function; each
failure a :class:`~ale.core.reasons.VerificationError` whose :class:`~ale.core.reasons.Reason`
the database stores and the API returns. Anything else raised here is our bug (HTTP 500), never
the uploader's. Steps 3 to 12 are ``ale.core``'s, the very functions ``ale inspect`` runs.
:func:`verify_upload` runs steps 1 to 13 (the server runs it on an upload worker,
ale_verify.workers; :func:`process_upload` in this process), asking :class:`Site` for what needs
the site's records; :func:`record` is step 14.

1. receive ciphertext (streamed to a temp file by the app, the size cap enforced while reading)
2. SHA-256 of the ciphertext
3. decrypt with the site's private key (the age header's grammar and X25519 stanzas checked first)
4. exactly one zstd frame, decompressed within the decompressed-size limit
5. safe tar inspection (traversal, absolute paths, links, devices, FIFOs, special mode bits
   refused; nothing is written to disk: members are read into memory), then the canonical
   layout (exactly ``build_tar``'s bytes, nothing after the end-of-archive blocks)
6. allow-listed files only, all of them
7. JSON documents: parsed by the one bounded parser, no member claiming a verification level
   anywhere, canonical, schema-valid, structured into their models
8. challenge token (server-signed, unexpired, one-time) and the nonce bound in the trajectory
9. hash chain of the trajectory, and network_summary.json recomputed from its network events
10. integrity root (file digests, Merkle root, chain head) and a registered runner's signature
11. benchmark and task versions, coverage
12. the faithfulness verdicts: each judge input rebuilt from the bundle and held to its verdict;
    recompute the scores from the evaluator results and compare with the claimed ones; then the
    verdicts the verifier credits (a trusted judge key's signature; else, with a judge of its
    own, judging pending, its judge asked after the upload by ale_verify.judge_worker; else
    unjudged, final 0) and the scores the board shows (ale_verify.judging.plan)
13. audit summary
14. persist metadata (submission row + audit log entry, the judge jobs it leaves, and the use of
    the challenge step 8 claimed: one transaction)
15. delete the plaintext and ciphertext temp files (every path, failures included)
"""

from __future__ import annotations

import functools
import hashlib
import logging
import secrets
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

import attrs

from ale import catalog
from ale.core import bundle
from ale.core.documents import ELEVATION_MEMBERS
from ale.core.faithfulness import Credit
from ale.core.reasons import Level, Reason
from ale.core.results import RunScore
from ale.core.trajectory import ChunkReport
from ale.core.verify import (
    Documents,
    RunnerKey,
    VerificationError,
    check_chain,
    check_integrity,
    check_network,
    check_signature,
    check_verdicts,
    check_versions,
    file_digests,
    level_for,
    parse_documents,
    plain,
    recompute_scores,
    trajectory,
)
from ale.runner.inspect import installed_releases, read_identity
from ale.schemas import validate_document
from ale_verify import db, judging, provenance, tokens
from ale_verify.config import Settings

log = logging.getLogger(__name__)
T = TypeVar("T")

#: Query parameters and body fields no request may carry: levels are assigned by the backend only
#: (documents are searched for the level-like members of ale.core.documents.ELEVATION_MEMBERS).
ELEVATION_FIELDS = ELEVATION_MEMBERS | {"status"}


@attrs.frozen
class Outcome:
    submission_id: str
    status: str  # accepted | rejected
    level: Level | None
    reason: Reason | None  # the first failure's code
    reasons: list[dict[str, str]]
    summary: dict[str, Any]
    queued: db.Queued | None = None  # an accepted upload's judge jobs and scoring input (step 14 stores them)


def limits(settings: Settings) -> bundle.Limits:
    return bundle.Limits(
        max_ciphertext=settings.max_upload_bytes,
        max_decompressed=settings.max_decompressed_bytes,
        max_files=settings.max_files,
        max_file_bytes=settings.max_file_bytes,
        max_stanzas=settings.max_stanzas,
    )


def site_identity(settings: Settings) -> str:
    """The site's age identity; a missing or broken key file is the operator's error, not the uploader's."""
    return read_identity(settings.key_file)


def registered_runner(settings: Settings) -> Callable[[str], RunnerKey | None]:
    """Looks up a registered, active runner key in the site's database."""
    return LocalSite(settings).runner_key


class Site(Protocol):
    """What the pipeline asks of the site's own records: the database (steps 8 and 10; the
    operator's judge is asked after the upload, by the judge worker). :class:`LocalSite` answers in
    this process; an upload worker's site asks the server, which answers with a LocalSite
    (ale_verify.workers)."""

    def challenge(self, challenge_id: str) -> dict[str, Any] | None:
        """The challenge's row, or None when the site never issued it."""

    def consume(self, challenge_id: str, submission_id: str) -> bool:
        """Claim the challenge for this submission; False when it was already used. The use is
        stored with the verdict, in its transaction (:func:`record`): a submission whose verdict is
        never stored (its worker died) leaves the challenge unused."""

    def runner_key(self, key_id: str) -> RunnerKey | None:
        """A registered, active runner key."""


@attrs.frozen(repr=False)
class LocalSite:
    """The site's records, asked in this process. ``claims``: the challenge each submission
    claimed (:meth:`consume`), until :meth:`claimed` hands it to :func:`record`."""

    settings: Settings
    claims: dict[str, str] = attrs.field(factory=dict, eq=False)

    def challenge(self, challenge_id: str) -> dict[str, Any] | None:
        return db.get_challenge(self.settings.database, challenge_id)

    def consume(self, challenge_id: str, submission_id: str) -> bool:
        if not db.challenge_unused(self.settings.database, challenge_id):
            return False
        self.claims[submission_id] = challenge_id
        return True

    def claimed(self, submission_id: str) -> str | None:
        """The challenge the submission claimed, forgotten here (:func:`record` stores its use)."""
        return self.claims.pop(submission_id, None)

    def runner_key(self, key_id: str) -> RunnerKey | None:
        row = db.runner_key(self.settings.database, key_id)
        if row is None or row["retired_at"] is not None:
            return None
        return RunnerKey(row["key_id"], row["public_key"], row["kind"], row["label"])


class ChainJob(Protocol):
    """The trajectory's chain checked elsewhere while it is decompressed (ale_verify.chain_workers)."""

    def start(self, compressed: bytes) -> None:
        """Decompress ``events.jsonl.zst`` (ale.core.verify.decompress_events), from now on."""

    def decompressed(self) -> bytes:
        """What decompress_events gives when it feeds a job (empty), or raises, once it is done."""

    def reports(self) -> list[ChunkReport] | bytes:
        """The chunks' reports in stream order, or the whole stream to check in one pass."""

    def stream(self) -> bytes:
        """The whole decompressed trajectory, as fed."""

    def cancel(self) -> None:
        """End the job and free what it holds (idempotent)."""


def warm() -> None:
    """Load what every upload needs (the task catalog and rubrics, the releases, the schemas) once,
    so that a worker's first upload does not pay for it."""
    from ale.schemas import DOCUMENTS, validator

    catalog.tasks()
    catalog.judge_contexts()
    installed_releases()
    for name in DOCUMENTS.values():
        validator(name)


# -- steps --------------------------------------------------------------------------------------


def step_decrypt(ciphertext: bytes, settings: Settings) -> bytes:
    return bundle.decrypt(ciphertext, site_identity(settings), limits(settings))


def step_decompress(plain_bytes: bytes, settings: Settings) -> bytes:
    return bundle.decompress(plain_bytes, limits(settings))


def step_inspect_tar(tar: bytes, settings: Settings) -> dict[str, bytes]:
    return bundle.inspect_tar(tar, limits(settings))


def step_allowlist(files: dict[str, bytes]) -> None:
    bundle.check_allowlist(files)


def step_schemas(files: dict[str, bytes], events: Callable[[], bytes] | None = None) -> Documents:
    """Every document parsed (parse_json), refused if it claims a level anywhere, canonical,
    schema-valid and structured into its model, then the trajectory decompressed (``events``:
    by a chain job, which started it already; ale.core.verify.parse_documents)."""
    return parse_documents(files, validate_document, events)


def step_challenge(
    docs: Documents, site: Site, signing_key: bytes, *, user_id: str, submission_id: str, now: float
) -> dict[str, Any] | None:
    """Verify the token and consume its challenge; None when the run had no challenge."""
    challenge = docs.manifest.challenge
    if challenge is None:
        return None
    try:
        payload = tokens.verify(signing_key, challenge.token, now=now)
    except tokens.TokenError as exc:
        raise VerificationError(Reason(exc.reason), str(exc)) from None
    row = site.challenge(payload["cid"])
    if row is None or row["nonce"] != payload["nonce"]:
        raise VerificationError(Reason.TOKEN_INVALID, "the challenge token names no challenge this site issued")
    if row["user_id"] != user_id:
        raise VerificationError(Reason.TOKEN_INVALID, "the challenge was issued to another user")
    if challenge.nonce != payload["nonce"]:
        raise VerificationError(Reason.NONCE_MISMATCH, "the manifest's nonce is not the challenge's")
    # The nonce must be the one bound into the trajectory's first event (checked with the chain).
    if not site.consume(payload["cid"], submission_id):
        raise VerificationError(Reason.TOKEN_REPLAYED, "the challenge token was already used")
    return row


def step_signature(docs: Documents, root: str, site: Site) -> RunnerKey | None:
    """A runner signature over the root, if any: it must verify and name a registered, active key."""
    return check_signature(docs, root, site.runner_key)[1]


def step_faithfulness(
    docs: Documents, files: dict[str, bytes], events: Callable[[], bytes], release: Any, settings: Settings
) -> judging.Plan:
    """Step 12: the verdicts held to the judge inputs rebuilt from the bundle, the claimed scores
    recomputed from the bundle's own verdicts, then the credited verdicts, the board's scores and
    the judge jobs the upload leaves (:func:`ale_verify.judging.plan`). ``events`` gives the
    decompressed trajectory (read only when a task is a reproduction task)."""
    contexts = catalog.judge_contexts()
    reproduction = any(t.genre == "reproduction" for t in docs.results.tasks)
    inputs, verdicts = check_verdicts(docs, contexts, events() if reproduction else b"")
    recompute_scores(docs, release, verdicts)
    return judging.plan(docs, files, release, settings, inputs)


def audit_summary(
    docs: Documents,
    recomputed: RunScore,
    *,
    challenge: dict[str, Any] | None,
    runner: RunnerKey | None,
    ciphertext_sha256: str,
    root: str,
    events: int,
    credits: dict[str, Credit] | None = None,
    release_images: dict[str, str] | None = None,
) -> dict[str, Any]:
    """What the verifier stores and the board shows: ``recomputed`` are the credited scores."""
    m = docs.manifest
    judgements = {ref: c.summary() for ref, c in (credits or {}).items()}
    return {
        "run_id": m.run_id,
        "agent": {"name": m.agent.name, "declared": dict(m.agent.declared), "command": list(m.agent.command)},
        "release": m.release.name,
        "release_sha256": m.release.manifest_sha256,
        # tasks, macro_mean, categories, pass_rate, covered, missing, coverage_complete: re-scoring
        # after a judgement changes writes them again with the same function
        **judging.score_members(recomputed, docs.results, judgements),
        "task_info": {
            t.task: {"mode": t.mode, "genre": t.genre, "official_episodes": t.official_episodes}
            for t in docs.results.tasks
        },
        "official_episode_counts": m.run.official_episode_counts,
        "started": m.run.started,
        "finished": m.run.finished,
        "active_s": m.run.active_s,  # the run's runtime (absent, None, for bundles before it)
        "usage": plain(docs.network.usage),
        "network_proxy": plain(docs.network.proxy),
        "runtime": plain(m.runtime),
        "release_images": release_images,  # what the release pins (runtime.images was checked against it)
        "challenge_id": challenge["id"] if challenge else None,
        "runner": None if runner is None else {"key_id": runner.key_id, "kind": runner.kind, "label": runner.label},
        "ciphertext_sha256": ciphertext_sha256,
        "merkle_root": root,
        "trajectory_events": events,
    }


def assign_level(summary: dict[str, Any]) -> tuple[Level, list[dict[str, str]]]:
    """The level the backend can prove, with notes on what kept it lower (ale.core.verify.level_for)."""
    return level_for(
        challenged=summary["challenge_id"] is not None,
        official_episode_counts=bool(summary["official_episode_counts"]),
        runner=summary["runner"] is not None,
    )


# -- the pipeline -------------------------------------------------------------------------------


def _sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _alongside(compute: Callable[[], T]) -> Callable[[], T]:
    """Start ``compute`` (SHA-256 work) on a thread; the returned function waits for its result.

    hashlib releases the GIL while it hashes, so the hashing costs no wall time next to the steps
    that follow (decryption, which holds the GIL; JSON parsing) when a core is free. The thread
    is let in before the caller goes on. An exception is raised again by the waiting function.
    """
    started = threading.Event()
    result: list[T] = []
    error: list[BaseException] = []

    def run() -> None:
        started.set()
        try:
            result.append(compute())
        except BaseException as exc:  # handed to the waiter
            error.append(exc)

    thread = threading.Thread(target=run, name="ale-verify-hash", daemon=True)
    thread.start()
    started.wait()

    def wait() -> T:
        thread.join()
        if error:
            raise error[0]
        return result[0]

    return wait


def verify_upload(
    ciphertext_path: Path,
    settings: Settings,
    signing_key: bytes,
    *,
    user_id: str,
    submission_id: str,
    now: float,
    site: Site,
    chain: ChainJob | None = None,
) -> Outcome:
    """Steps 1 to 13 on an uploaded file: the verdict, nothing stored (:func:`record` stores it).

    The server runs it on an upload worker (ale_verify.workers), :func:`process_upload` in this
    process; the verdict is the same. With ``chain``, the trajectory's lines are checked elsewhere
    while step 7 is still decompressing it (ale_verify.chain_workers); step 9 then only links
    their reports. ``chain`` is cancelled on return.
    """
    try:
        ciphertext = ciphertext_path.read_bytes()  # 1. received
        digest_of = _alongside(functools.partial(_sha256_hex, ciphertext))  # 2. (alongside 3 and on)
        try:
            plain = step_decrypt(ciphertext, settings)  # 3.
            del ciphertext
            tar = step_decompress(plain, settings)  # 4.
            del plain
            files = step_inspect_tar(tar, settings)  # 5.
            del tar
            step_allowlist(files)  # 6.
            if chain is not None:  # first: what the chain's checks wait for
                chain.start(files["events.jsonl.zst"])  # 7.'s decompression, alongside its documents
            digests_of = _alongside(lambda: file_digests(files))  # for 10, alongside 7-9
            docs = step_schemas(files, chain.decompressed if chain is not None else None)  # 7.
            challenge = step_challenge(
                docs, site, signing_key, user_id=user_id, submission_id=submission_id, now=now
            )  # 8.
            chain_summary = check_chain(
                docs,
                expected_nonce=challenge["nonce"] if challenge else None,
                check_nonce=challenge is not None,
                reports=chain.reports if chain is not None else None,
            )  # 9.
            check_network(docs, chain_summary)
            root = check_integrity(files, docs, chain_summary, digests_of())  # 10.
            runner = step_signature(docs, root, site)
            releases = installed_releases()
            release = check_versions(  # 11.
                docs,
                release_for=lambda sha: (releases[sha], sha) if sha in releases else None,
                known_tasks={t.spec.ref: (t.spec, t.digest) for t in catalog.tasks().values()},
            )
            events = chain.stream if chain is not None else lambda: trajectory(docs, files)
            judged = step_faithfulness(docs, files, events, release, settings)  # 12.
            recomputed, credits = judged.scores, judged.credits
        except VerificationError as exc:  # BundleError is one
            return rejected(submission_id, exc.reason, str(exc), digest_of())
        digest = digest_of()
        summary = audit_summary(
            docs,
            recomputed,
            challenge=challenge,
            runner=runner,
            ciphertext_sha256=digest,
            root=root,
            events=chain_summary.events,
            credits=credits,
            release_images=release.images,
        )  # 13.
        level, notes = assign_level(summary)
        notes += judging.judgement_notes({ref: c.summary() for ref, c in credits.items()})
        level, notes, summary = provenance.settle_images(level, notes, summary, docs, release, settings)  # images
        return Outcome(submission_id, "accepted", level, None, notes, summary, judged.queued)
    finally:
        if chain is not None:
            chain.cancel()  # a step before 9 failed: the queued chunks are not needed


def rejected(submission_id: str, reason: Reason, message: str, ciphertext_sha256: str) -> Outcome:
    """The verdict on a refused upload: the first failure's code and message."""
    return Outcome(
        submission_id,
        "rejected",
        None,
        reason,
        [{"reason": reason, "message": message}],
        {"ciphertext_sha256": ciphertext_sha256},
    )


#: The verdict on an upload whose challenge another upload used first (as step 8 says it).
REPLAYED = "the challenge token was already used"


def record(
    outcome: Outcome,
    ciphertext_path: Path,
    settings: Settings,
    *,
    user_id: str,
    now: float,
    challenge: str | None = None,
) -> Outcome:
    """Step 14: persist the verdict (the submission row and its audit log entry, its judge jobs
    and, in the same transaction, the use of the ``challenge`` it claimed at step 8), and keep the
    ciphertext when the site keeps bundles. The caller deletes the file (step 15).

    Concurrent uploads of one challenge all pass step 8 (it reads); the first verdict stored uses
    the challenge, and an accepted one that comes later is stored, and returned, as
    ``token_replayed`` instead (a rejected one keeps its own reason). So exactly one is accepted,
    and a challenge is used only by a stored verdict."""
    replayed = None
    if challenge is not None and outcome.status == "accepted":
        replayed = rejected(
            outcome.submission_id, Reason.TOKEN_REPLAYED, REPLAYED, outcome.summary.get("ciphertext_sha256", "")
        )
    stored = _persist(outcome, settings, user_id=user_id, now=now, challenge=challenge, replayed=replayed)
    if not stored:
        assert replayed is not None
        return replayed
    if outcome.queued is not None and outcome.queued.jobs:
        judging.WAKE.set()  # this process's judge worker looks at once
    if outcome.status == "accepted" and settings.keep_bundles and settings.bundle_dir is not None:
        settings.bundle_dir.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ciphertext_path, settings.bundle_dir / f"{outcome.submission_id}.ale")
    return outcome


def new_submission_id() -> str:
    return "sub_" + secrets.token_hex(12)


def process_upload(ciphertext_path: Path, settings: Settings, signing_key: bytes, *, user_id: str) -> Outcome:
    """Every step on an uploaded file in this process (the server without workers, the tests, the
    benchmark's reference); always deletes the file (unless bundles are kept: a copy is)."""
    now = time.time()
    site = LocalSite(settings)
    try:
        outcome = verify_upload(
            ciphertext_path,
            settings,
            signing_key,
            user_id=user_id,
            submission_id=new_submission_id(),
            now=now,
            site=site,
        )
        challenge = site.claimed(outcome.submission_id)
        return record(outcome, ciphertext_path, settings, user_id=user_id, now=now, challenge=challenge)
    finally:
        ciphertext_path.unlink(missing_ok=True)  # 15. (the plaintext never touched the disk)


def _rows(outcome: Outcome, *, user_id: str, now: float) -> db.Verdict:
    """The verdict as the database stores it: the submission row, its audit entry, its judge jobs."""
    row = {
        "id": outcome.submission_id,
        "user_id": user_id,
        "received_at": now,
        "ciphertext_sha256": outcome.summary.get("ciphertext_sha256", ""),
        "status": outcome.status,
        "level": outcome.level,
        "reason": outcome.reason,
        "reasons": outcome.reasons,
        "run_id": outcome.summary.get("run_id"),
        "summary": outcome.summary,
    }
    audit = {
        "at": now,
        "actor": "verifier",
        "action": "accepted" if outcome.status == "accepted" else "rejected",
        "from_level": None,
        "to_level": outcome.level,
        "reason": outcome.reason or "all checks passed",
    }
    return row, audit, outcome.queued


def _persist(
    outcome: Outcome,
    settings: Settings,
    *,
    user_id: str,
    now: float,
    challenge: str | None,
    replayed: Outcome | None,
) -> bool:
    row, audit, queued = _rows(outcome, user_id=user_id, now=now)
    instead = None if replayed is None else _rows(replayed, user_id=user_id, now=now)
    return db.insert_submission(settings.database, row, audit, queued, challenge=challenge, replayed=instead)
