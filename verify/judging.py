"""The verifier's faithfulness credits (docs/verifier.md, "Faithfulness"): which judge keys it
trusts, what an upload's reproduction tasks are credited with, and how a stored submission is
re-scored when a judgement changes.

* **Judge keys**: the ones registered through the operator API (the database's ``judge_keys``)
  and the configuration's (``ALE_VERIFY_JUDGE_KEYS``), less every key the database records as
  revoked (:func:`judge_keys`).
* **At upload** (:func:`plan`, step 12): a verdict signed by a trusted judge key is credited at
  once; with ``ALE_VERIFY_JUDGE_MODEL`` set, every other completed reproduction task is *judging
  pending* (unfaithful, final 0) and a judge job is queued with its rebuilt judge input, stored
  with the submission in one transaction; ``ale_verify.judge_worker`` asks the operator's judge
  off the upload's path and re-scores the submission (:func:`after_judge`).
* **Re-scoring** (:func:`rescored`): the task results and release stored at upload, scored with
  the credited verdicts by the very function step 12 uses; the summary's score members and the
  judgement notes replaced. A revoked judge key's credits become unjudged (:func:`after_revocation`).
* **The judgement state** of each task, as the API, the board and the exports show it
  (:func:`task_judgements`).

Everything here but :func:`judge_keys` (which reads the database) is pure.
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import attrs

from ale.core.faithfulness import Credit, JudgeKey, JudgeKeyLookup, credit, to_judge
from ale.core.judge_input import JudgeInput
from ale.core.parse import parse_json
from ale.core.reasons import Reason
from ale.core.release import ReleaseManifest
from ale.core.results import (
    RunScore,
    TaskResults,
    intervals_document,
    parse_task_results,
    score_run,
    task_score_document,
)
from ale.core.signing import key_id
from ale.core.verify import Documents, credited_scores
from ale_verify import db
from ale_verify.config import Settings

#: The notes an accepted submission carries about its judgements (replaced whenever they change).
JUDGEMENT_NOTES = (Reason.UNJUDGED.value, Reason.JUDGING_PENDING.value)
#: The judgement states (docs/leaderboard-export.md): the API's, the board's and the exports' words.
STATES = ("judged_faithful", "judged_unfaithful", "unjudged", "judging_pending")
#: A stored judge input's size bound when it is read back (the input itself is a few hundred KiB).
MAX_STORED_INPUT = 16 * 1024 * 1024
#: Set when an upload queued a judge job: this process's worker looks at once (others poll).
WAKE = threading.Event()


def configured(settings: Settings) -> bool:
    return bool(settings.judge_model)


def canonical_key(public: str) -> str:
    """A base64 Ed25519 public key in the one spelling verdicts carry (``b64encode`` of the bytes)."""
    return base64.b64encode(base64.b64decode(public, validate=True)).decode()


def config_keys(settings: Settings) -> dict[str, JudgeKey]:
    """The configuration's judge keys (``ALE_VERIFY_JUDGE_KEYS``) by key id."""
    keys = {}
    for label, public in settings.judge_keys:
        raw = base64.b64decode(public, validate=True)
        keys[key_id(raw)] = JudgeKey(key_id(raw), base64.b64encode(raw).decode(), label)
    return keys


def judge_keys(settings: Settings) -> JudgeKeyLookup:
    """The judge keys whose signed verdicts are credited, by key id: the active ones registered in
    the database and the configuration's, but never a key the database records as revoked."""
    configured_keys = config_keys(settings)
    database = settings.database if db.exists(settings.database) else None

    def lookup(kid: str) -> JudgeKey | None:
        row = db.judge_key(database, kid) if database is not None else None
        if row is not None:
            return JudgeKey(row["key_id"], row["public_key"], row["label"]) if row["revoked_at"] is None else None
        return configured_keys.get(kid)

    return lookup


# -- at upload ----------------------------------------------------------------------------------


@attrs.frozen
class Plan:
    """Step 12's credits and the board's scores, and what the upload leaves for later."""

    credits: dict[str, Credit]
    scores: RunScore
    queued: db.Queued


def plan(
    docs: Documents, files: Mapping[str, bytes], release: ReleaseManifest, settings: Settings,
    inputs: Mapping[str, JudgeInput],
) -> Plan:  # fmt: skip
    """The credits at upload (a trusted judge key's signed verdict; pending, with a judge job, for
    the tasks the verifier's judge must judge; else unjudged), the scores they give, the jobs."""
    keys = judge_keys(settings)
    pending = to_judge(docs, keys) if configured(settings) else []
    credits = credit(docs, inputs, keys=keys, rejudge_configured=configured(settings), pending=pending)
    now = time.time()
    jobs = tuple(_job(inputs[ref], now) for ref in pending)
    scoring = (  # only a run with a credit (a completed reproduction task) may be re-scored later
        {"release_sha256": docs.manifest.release.manifest_sha256, "results": files["task_results.json"].decode()}
        if credits
        else None
    )
    key_credits = tuple((ref, c.judge_key_id) for ref, c in sorted(credits.items()) if c.judge_key_id is not None)
    queued = db.Queued(jobs=jobs, scoring=scoring, key_credits=key_credits, on_revoked=after_revocation)
    return Plan(credits, credited_scores(docs, release, credits), queued)


def _job(ji: JudgeInput, now: float) -> dict[str, Any]:
    """A ``judge_jobs`` row for one task (without its submission's id), due at once."""
    return {"task": ji.task, "state": "pending", "input_sha256": ji.sha256, "judge_input": stored_input(ji),
            "attempts": 0, "not_before": now, "queued_at": now}  # fmt: skip


def stored_input(ji: JudgeInput) -> str:
    """A judge input as its job stores it (JSON: its text and how it was made)."""
    fields = {"task": ji.task, "text": ji.text.decode("utf-8"), "sha256": ji.sha256, "window_events": ji.window_events,
              "entries": ji.entries, "omitted": ji.omitted, "level": ji.level}  # fmt: skip
    return json.dumps(fields, ensure_ascii=False)


_STORED_INTS = ("window_events", "entries", "omitted", "level")


def load_input(stored: str, expected_sha256: str) -> JudgeInput:
    """A stored judge input, held to the digest its job names; ValueError (only) otherwise."""
    value = parse_json(stored.encode("utf-8", "surrogatepass"), what="a stored judge input",
                       max_bytes=MAX_STORED_INPUT)  # fmt: skip
    if not isinstance(value, dict) or set(value) != {"task", "text", "sha256", *_STORED_INTS}:
        raise ValueError("a stored judge input is an object of exactly its fields")
    if not all(type(value[k]) is str for k in ("task", "text", "sha256")):
        raise ValueError("a stored judge input's task, text and sha256 are strings")
    if not all(type(value[k]) is int and value[k] >= 0 for k in _STORED_INTS):
        raise ValueError("a stored judge input's counts are whole numbers")
    text = value["text"].encode("utf-8", "surrogatepass")
    if hashlib.sha256(text).hexdigest() != expected_sha256 or value["sha256"] != expected_sha256:
        raise ValueError("the stored judge input is not the one its job names")
    return JudgeInput(value["task"], text, expected_sha256, *(int(value[k]) for k in _STORED_INTS))


# -- the summary's score members and notes ------------------------------------------------------


def score_members(run: RunScore, results: TaskResults, judgements: Mapping[str, dict[str, Any]]) -> dict[str, Any]:
    """The audit summary's members that follow from the scores: each task (its score document,
    status and judgement), the aggregate (docs/verifier.md, "Faithfulness", step 5)."""
    agg = run.aggregate
    return {
        "tasks": [
            {**task_score_document(s), "status": "completed", "judgement": judgements.get(s.task)} for s in run.tasks
        ]
        + [
            {
                "task": t.task,
                "genre": t.genre,
                "status": t.status,
                "reason": t.reason,
                "ended": None if t.ended is None else t.ended.entry(),
            }
            for t in results.tasks
            if t.status != "completed"
        ],
        "macro_mean": agg.macro_mean,
        "categories": agg.categories,
        "intervals": intervals_document(run),  # the credited scores' 95% intervals (docs/intervals.md)
        "pass_rate": agg.pass_rate,
        "covered": list(agg.covered),
        "missing": list(agg.missing),
        "coverage_complete": agg.coverage_complete,
    }


def judgement_notes(judgements: Mapping[str, dict[str, Any]]) -> list[dict[str, str]]:
    """A note per task without a credited verdict: ``unjudged`` or ``judging_pending``, with why."""
    codes = {"unjudged": Reason.UNJUDGED.value, "pending": Reason.JUDGING_PENDING.value}
    return [
        {"reason": codes[j["status"]], "message": f"{ref}: {j['rationale']}"}
        for ref, j in sorted(judgements.items())
        if j.get("status") in codes
    ]


def judgements_of(summary: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The stored judgement of every completed reproduction task of a summary."""
    return {
        str(t["task"]): t["judgement"]
        for t in summary.get("tasks") or []
        if isinstance(t, dict) and isinstance(t.get("judgement"), dict)
    }


class RescoreError(ValueError):
    """A submission that cannot be re-scored (no scoring input, or its release is not installed)."""


def rescored(
    summary: dict[str, Any],
    reasons: list[dict[str, Any]],
    scoring: Mapping[str, Any] | None,
    judgements: Mapping[str, dict[str, Any]],
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The summary and notes with ``judgements`` (every completed reproduction task's): the stored
    results scored against the stored release with their verdicts, the judgement notes replaced."""
    from ale.runner.inspect import installed_releases

    if scoring is None:
        raise RescoreError(f"submission of run {summary.get('run_id')} has no stored scoring input")
    release = installed_releases().get(str(scoring["release_sha256"]))
    if release is None:
        raise RescoreError(f"the release {scoring['release_sha256']} is not installed here")
    results = parse_task_results(str(scoring["results"]).encode())
    run = score_run(results, release, {ref: bool(j.get("faithful")) for ref, j in judgements.items()})
    notes = [r for r in reasons if r.get("reason") not in JUDGEMENT_NOTES] + judgement_notes(judgements)
    return {**summary, **score_members(run, results, judgements)}, notes


def after_judge(
    summary: dict[str, Any], reasons: list[dict[str, Any]], scoring: dict[str, Any] | None, changes: dict[str, Any]
) -> tuple[dict[str, Any], list[dict[str, Any]], str]:
    """:data:`ale_verify.db.Rescore` for a finished judge job: ``changes`` maps the task to its new
    credit (``Credit.summary()``)."""
    judgements = judgements_of(summary) | changes
    summary, notes = rescored(summary, reasons, scoring, judgements)
    said = "; ".join(f"{ref}: {_state_words(j)} by the verifier's judge" for ref, j in sorted(changes.items()))
    return summary, notes, said


def after_revocation(
    summary: dict[str, Any], reasons: list[dict[str, Any]], scoring: dict[str, Any] | None, changes: dict[str, Any]
) -> tuple[dict[str, Any], list[dict[str, Any]], str]:
    """:data:`ale_verify.db.Rescore` for a revoked judge key: ``changes`` maps each task credited to
    it to the key's row; those tasks become unjudged (final 0)."""
    judgements = judgements_of(summary)
    for ref, key in changes.items():
        judgements[ref] = revoked_judgement(judgements[ref], key)
    summary, notes = rescored(summary, reasons, scoring, judgements)
    refs = ", ".join(sorted(changes))
    keys = ", ".join(sorted({str(key["key_id"]) for key in changes.values()}))
    return summary, notes, f"{refs}: unjudged, its verdict's judge key was revoked ({keys})"


def revoked_judgement(judgement: dict[str, Any], key: Mapping[str, Any]) -> dict[str, Any]:
    when = datetime.fromtimestamp(float(key["revoked_at"]), UTC).strftime("%Y-%m-%d %H:%M UTC")
    why = (
        f"the verdict was credited to the judge key {key['label']} ({key['key_id'][:16]}), which was revoked "
        f"on {when} by {key['revoked_by']} ({key['revoke_reason']}): unjudged, final 0"
    )
    return {**judgement, "status": "unjudged", "faithful": False, "source": None, "outcome": "judge_key_revoked",
            "judge_model": None, "rationale": why, "findings": [], "judge_key_id": None,
            "revoked_judge_key_id": key["key_id"]}  # fmt: skip


# -- the judgement state ------------------------------------------------------------------------


def state_of(judgement: Mapping[str, Any]) -> str:
    """One of :data:`STATES` (a judgement without a known status is unjudged: fail-closed)."""
    status = judgement.get("status")
    if status == "judged":
        return "judged_faithful" if judgement.get("faithful") is True else "judged_unfaithful"
    return "judging_pending" if status == "pending" else "unjudged"


def _state_words(judgement: Mapping[str, Any]) -> str:
    return state_of(judgement).replace("_", " ")


def key_id_of(judgement: Mapping[str, Any]) -> str | None:
    """The registered judge key a judged verdict is credited to (a summary from before the key id
    was stored names it in the claimed entry's signature)."""
    if judgement.get("status") != "judged" or judgement.get("source") == "verifier":
        return None  # not judged, or judged by the verifier's own judge
    if isinstance(judgement.get("judge_key_id"), str):
        return str(judgement["judge_key_id"])
    signature = (judgement.get("claimed") or {}).get("signature")
    return str(signature["key_id"]) if isinstance(signature, dict) and "key_id" in signature else None


def task_judgement(judgement: Mapping[str, Any]) -> dict[str, Any]:
    """A task's judgement as the API and the exports give it (docs/leaderboard-export.md)."""
    state = state_of(judgement)
    judged = state in ("judged_faithful", "judged_unfaithful")
    by = None if not judged else ("verifier" if judgement.get("source") == "verifier" else "judge_key")
    kid = key_id_of(judgement) if by == "judge_key" else None
    return {
        "state": state,
        "judged_by": by,
        "judge_key_id": kid,
        "judge_model": judgement.get("judge_model") if judged else None,
        "reason": None if judged else str(judgement.get("rationale") or ""),
    }


def task_judgements(summary: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Every completed reproduction task's judgement (:func:`task_judgement`), by ``id@version``."""
    return {ref: task_judgement(j) for ref, j in sorted(judgements_of(summary).items())}
