"""The verifier's judge jobs, off the upload's path (docs/verifier.md, "Faithfulness").

An upload queues one job per task its own judge must judge (``judge_jobs``, in the upload's
transaction: durable). Every ``ale-verify serve`` process with ``ALE_VERIFY_JUDGE_MODEL`` set runs
one :class:`JudgeWorker` thread, which:

1. claims the next due job in the database (:func:`ale_verify.db.claim_judge_job`: one claimer
   at a time, on either engine), with a lease of ``ALE_VERIFY_JUDGE_LEASE_S`` that it renews every
   third of it while the judge is being asked. A process that stops mid-job stops renewing; once
   the lease has run out, any process (the restarted one included) claims the job again. So no two
   processes ask about one task at once, and a restart resumes every job;
2. asks the operator's judge with the harness's client (:func:`ale.judge.client.ask`: the same
   request and fail-closed parsing; one retry inside for a transport error, 5xx or 429);
3. a judge that gave no answer (``error``: unreachable, HTTP errors, a misconfiguration) is tried
   again after ``ALE_VERIFY_JUDGE_RETRY_S`` (doubling, at most an hour), up to
   ``ALE_VERIFY_JUDGE_ATTEMPTS`` attempts in all; any other answer is final;
4. ends the job and re-scores the submission in one transaction (:func:`ale_verify.judging.after_judge`):
   judged (faithful or not), or unjudged with the reason; each with an audit entry.

Blocking: the worker is a daemon thread (the judge's HTTP request cannot be interrupted; a process
that exits leaves the job to the lease).
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import secrets
import socket
import threading
import time
from typing import Any

from ale import catalog
from ale.core.faithfulness import verifier_credit
from ale.core.verdict import JudgeResult, failed
from ale_verify import db, judging
from ale_verify.config import Settings

log = logging.getLogger(__name__)
#: the longest wait between two attempts of a job
MAX_RETRY_S = 3600.0


def _api_key(settings: Settings) -> str | None:
    if settings.judge_api_key_file is None:
        return None
    text = settings.judge_api_key_file.read_text(encoding="utf-8").strip()
    return text or None


def _misconfigured(settings: Settings, digest: str, reason: str) -> JudgeResult:
    return failed("error", f"the verifier's judge is misconfigured: {reason}", model=settings.judge_model,
                  input_sha256=digest)  # fmt: skip


def _ask(settings: Settings, job: dict[str, Any]) -> JudgeResult:
    """The operator's judge's answer about the job's stored input; every failure is a result."""
    from ale.judge.client import Endpoint, EndpointError, Transport, ask

    digest = str(job["input_sha256"])
    context = catalog.judge_contexts().get(str(job["task"]))
    if context is None:
        return _misconfigured(settings, digest, f"it knows no rubric for {job['task']}")
    try:
        judge_input = judging.load_input(str(job["judge_input"] or ""), digest)
    except ValueError as exc:
        return failed("error", f"the job's judge input cannot be used: {exc}", model=settings.judge_model,
                      input_sha256=digest)  # fmt: skip
    try:
        Endpoint.parse(settings.judge_base_url)
        key = _api_key(settings)
    except (EndpointError, OSError) as exc:  # the operator's configuration: no verdict, said why
        return _misconfigured(settings, digest, (exc.strerror if isinstance(exc, OSError) else None) or str(exc))
    transport = Transport(settings.judge_base_url, key, timeout=settings.judge_timeout_s)
    return ask(transport, settings.judge_model, judge_input, context.rubric).result


def _ask_leased(settings: Settings, job: dict[str, Any], worker: str) -> JudgeResult | None:
    """:func:`_ask` on a thread while the lease is renewed; None when the job was lost meanwhile."""
    every = max(0.05, settings.judge_lease_s / 3)
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="ale-verify-judge-ask") as pool:
        future = pool.submit(_ask, settings, job)
        kept = True
        while True:
            try:
                result = future.result(timeout=every)
                break
            except concurrent.futures.TimeoutError:
                kept = kept and _renew(settings, job, worker)
    return result if kept else None


def _renew(settings: Settings, job: dict[str, Any], worker: str) -> bool:
    """Extend the lease; a database that cannot say so counts as lost (the answer is discarded,
    the job is asked again once the lease has run out: never credited without its claim)."""
    until = time.time() + settings.judge_lease_s
    try:
        return db.renew_judge_job(settings.database, job["submission_id"], job["task"], worker=worker, until=until)
    except db.Unavailable as exc:
        log.warning("judge job %s %s: cannot renew its lease: %s", job["submission_id"], job["task"], exc)
        return False


def _retry_at(settings: Settings, attempts: int) -> float:
    delay: float = settings.judge_retry_s * 2.0 ** max(0, attempts - 1)
    return time.time() + min(MAX_RETRY_S, delay)


def run_one(settings: Settings, worker: str) -> bool:
    """Claim, judge and finish one due job; False when none was due."""
    where, now = settings.database, time.time()
    if not db.judge_job_due(where, now):
        return False
    job = db.claim_judge_job(where, worker=worker, now=now, lease_s=settings.judge_lease_s)
    if job is None:
        return False
    sub, task, attempts = str(job["submission_id"]), str(job["task"]), int(job["attempts"])
    if attempts > settings.judge_attempts:  # every attempt ended with its worker (a crash, a stop)
        result: JudgeResult | None = failed(
            "error", f"no attempt of the {settings.judge_attempts} allowed finished", model=settings.judge_model,
            input_sha256=str(job["input_sha256"]),
        )  # fmt: skip
        attempts = settings.judge_attempts
    else:
        result = _ask_leased(settings, job, worker)
    if result is None:
        log.warning("judge job %s %s: another worker took it over (its lease ran out)", sub, task)
        return True
    try:
        if result.outcome == "error" and attempts < settings.judge_attempts:
            db.retry_judge_job(where, sub, task, worker=worker, not_before=_retry_at(settings, attempts),
                               outcome=result.outcome, error=result.rationale)  # fmt: skip
            return True
        claimed = _claimed(settings, sub, task)
        credit = verifier_credit(task, result, str(job["input_sha256"]), claimed, attempts=attempts)
        db.finish_judge_job(
            where, sub, task, worker=worker, state="done" if result.outcome == "judged" else "failed",
            outcome=result.outcome, error=None if result.outcome == "judged" else result.rationale,
            change=credit.summary(), apply=judging.after_judge,
        )  # fmt: skip
    except db.Conflict:
        log.warning("judge job %s %s: another worker took it over (its lease ran out)", sub, task)
    return True


def _claimed(settings: Settings, submission_id: str, task: str) -> dict[str, Any]:
    """The bundle's own entry for the task, as the upload stored it in the task's judgement."""
    row = db.get_submission(settings.database, submission_id)
    judgement = judging.judgements_of(row["summary"]).get(task, {}) if row else {}
    claimed = judgement.get("claimed")
    return dict(claimed) if isinstance(claimed, dict) else {}


def drain(settings: Settings, worker: str = "drain") -> int:
    """Run every due job now, one after another (tests; an operator's one-off); how many ran."""
    done = 0
    while run_one(settings, worker):
        done += 1
    return done


class JudgeWorker:
    """This process's judge worker thread (started and stopped with the app)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.id = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="ale-verify-judge", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop looking for jobs; a job being judged is left to its lease if it does not end in time."""
        self._stop.set()
        judging.WAKE.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                worked = run_one(self.settings, self.id)
            except db.Unavailable as exc:
                log.warning("judge worker: %s", exc)
                worked = False
            except Exception:  # our bug: logged, the job's lease hands it on, the worker goes on
                log.exception("judge worker: internal error")
                worked = False
            if not worked and not self._stop.is_set():
                judging.WAKE.wait(self.settings.judge_poll_s)
                judging.WAKE.clear()
