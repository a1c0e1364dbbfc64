"""Verifier databases for the static-site tests and benchmark (a plain module, no pytest fixtures).

Every accepted row's ``summary`` is made by the verifier's own ``pipeline.audit_summary`` from
documents shaped like a real bundle's (the release's tasks, ``ale.core.scoring`` scores, the claimed
``score_breakdown.json`` round-tripped through canonical JSON), its level by
``pipeline.assign_level``; rows go in through ``ale_verify.db.insert_submission`` and audits and
revocations through ``db.change_level``, exactly as the app writes them.

* :func:`fill_empty`: the schema, no submission.
* :func:`fill_one`: one validated, fully covered submission.
* :func:`fill_mix`: a curated board with every level, both genres, partial and empty coverage,
  unfaithful and not-completed tasks, a proxy with token counts, a score tie, rejected uploads,
  revocations with reasons, and hostile names (markup, CSV formulas, Unicode, very long).
* :func:`fill_many`: ``n`` pseudo-random submissions (seeded: the same ``n`` and seed make the same
  rows) for the big-board tests and ``bench/site_bench.py``.

A completed task's 95% interval comes from ``ale.core.intervals`` (the bootstrap the verifier runs)
over synthetic episodes: the task's official count of them (``fill_many``: 12, which keeps a big
board quick to fill and its intervals wide), their headline values spread by ``Outcome.spread``
around the measured value (which is their mean), each safety metric's counts drawn at its rate.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import random
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import attrs

from ale import catalog
from ale.core import intervals
from ale.core.canonical import canonical_json
from ale.core.documents import (
    ARTIFACTS_SCHEMA,
    FAITHFULNESS_SCHEMA,
    INTEGRITY_SCHEMA,
    JUDGE_INPUT_FORMAT,
    MANIFEST_SCHEMA,
    NETWORK_SCHEMA,
    ArtifactsManifest,
    Faithfulness,
    Integrity,
    Manifest,
    NetworkSummary,
    ScoreBreakdown,
)
from ale.core.faithfulness import Credit
from ale.core.parse import structure
from ale.core.results import (
    TASK_RESULTS_SCHEMA,
    Ended,
    RunScore,
    TaskResult,
    TaskResults,
    score_breakdown_document,
)
from ale.core.scoring import TaskScore, aggregate, score_task
from ale.core.trajectory import EVENT_SCHEMA
from ale.core.verify import Documents, RunnerKey
from ale_verify import db, pipeline

#: the gateway of a fixture run with token usage (network_summary.json's proxy)
PROXY = {
    "name": "ale-gateway",
    "version": "0.1.0",
    "upstreams": [{"name": "openai", "api": "openai", "host": "api.openai.com"}],
}

RELEASE, RELEASE_SHA256 = catalog.release()
TASKS = {t.spec.ref: t.spec for t in catalog.tasks().values()}
REFS = list(RELEASE.required_tasks)
REPRODUCTION = [r for r in REFS if TASKS[r].genre == "reproduction"]
OPEN = [r for r in REFS if TASKS[r].genre == "open"]

#: 2026-09-01T00:00:00Z: fixture uploads are received after it, a day or less apart.
BASE_TIME = 1788220800.0

XSS_NAME = '<script>alert("board")</script> & <img src=x onerror=alert(1)>'
CSV_FORMULA_NAME = '=HYPERLINK("http://example.invalid","click")'
UNICODE_NAME = "Ünïcødé Ρομπότ agent — ß"
LONG_NAME = "a-very-long-agent-name-that-goes-on-and-on-for-layout-testing-purposes-version-2"

AGENTS: list[tuple[str, str | None, str | None]] = [
    ("OpenHands-R", "gpt-5.1", "high"),
    ("Aider Robotics", "claude-opus-4.5", "medium"),
    ("SWE-agent", "gemini-3-pro", "low"),
    ("Codex CLI", "gpt-5.1-codex", "xhigh"),
    ("RoboSmith", "qwen3-coder-480b", "high"),
    ("Mini-SWE", "claude-sonnet-4.5", "low"),
    ("PaperBot", "deepseek-v3.2", "medium"),
    ("demo", None, None),
    ("random", None, None),
]


@attrs.frozen
class Outcome:
    """One task of a fixture run: a completed evaluation or a reason it did not complete."""

    ref: str
    quality: float = 1.0  # measured as a multiple of the paper's value (its inverse for lower-is-better)
    safety: float = 0.0  # each safety metric's rate as a fraction of its limit
    faithful: bool | None = True  # None: unjudged (no verdict the verifier credits)
    aborted: int = 0  # episodes that did not pass
    missing_safety: bool = False  # a declared safety metric absent from the results (factor 0)
    reason: str | None = None  # set: not completed, for this reason
    ended: tuple[str, str] | None = None  # a not completed task's (phase, category) (docs/formats.md)
    spread: float = 0.3  # the synthetic episodes' headline values: measured * (1 +- spread / 2), mean measured


def _iso(t: float) -> str:
    return datetime.fromtimestamp(round(t * 1e6) / 1e6, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _hex(*parts: object) -> str:
    return hashlib.sha256("\0".join(map(str, parts)).encode()).hexdigest()


def make_summary(
    *,
    key: str,
    outcomes: Sequence[Outcome],
    agent: str,
    model: str | None,
    effort: str | None,
    started: float,
    duration_s: float,
    challenge: bool = True,
    official_episode_counts: bool = True,
    runner: dict[str, Any] | None = None,
    usage: dict[str, int] | None = None,
    synthetic_episodes: int | None = None,
) -> dict[str, Any]:
    """``pipeline.audit_summary`` of a run with these outcomes, as the database stores it (JSON);
    its intervals from ``synthetic_episodes`` per task (None: the official count)."""
    run_id = f"run-{_hex('run', key)[:20]}"
    scores = []
    entries = []
    credits = {o.ref: _credit(o, key) for o in outcomes if o.reason is None and TASKS[o.ref].genre == "reproduction"}
    for o in outcomes:
        spec = TASKS[o.ref]
        target = RELEASE.target(o.ref)
        entries.append(
            TaskResult(
                task=o.ref,
                genre=spec.genre,
                mode=spec.mode,
                official_episodes=spec.official_episodes,
                status="completed" if o.reason is None else "not_completed",
                reason=o.reason
                or ("" if not o.aborted else f"{o.aborted} of {spec.official_episodes} episodes were aborted"),
                result=None,  # audit_summary reads no result; the scores below stand for it
                ended=None if o.ended is None else Ended(*o.ended),
            )
        )
        if o.reason is not None:
            continue
        if spec.headline.direction == "higher":
            measured = target.paper_value * o.quality
        else:
            measured = target.paper_value / o.quality
        rates = {name: limit * o.safety for name, limit in target.safety_limits.items()}
        if o.missing_safety:
            rates.pop(sorted(rates)[0])
        scores.append(
            score_task(
                task=o.ref,
                genre=spec.genre,
                metric=spec.headline.metric,
                direction=spec.headline.direction,
                measured=measured,
                paper_value=target.paper_value,
                safety_rates=rates,
                safety_limits=target.safety_limits,
                faithful=o.faithful if spec.genre == "reproduction" else None,
                episodes=spec.official_episodes,
                passed=spec.official_episodes - o.aborted,
                cap=RELEASE.cap,
                eps=RELEASE.eps,
            )
        )
    finals = {
        s.task: _resampled_final(s, o, run_id, synthetic_episodes or s.episodes)
        for s, o in zip(scores, [o for o in outcomes if o.reason is None], strict=True)
    }
    run_score = RunScore(
        tuple(scores),
        aggregate(scores, required=RELEASE.required_tasks, missing_tasks=RELEASE.missing_tasks),
        intervals.run_intervals(scores, finals, required=RELEASE.required_tasks, missing_tasks=RELEASE.missing_tasks),
    )
    claimed = json.loads(canonical_json(score_breakdown_document(run_score, RELEASE)))
    head = _hex("head", key)
    phases = {"agent": "none", "official": "none"} if usage is None else {"agent": "open", "official": "closed"}
    manifest = {
        "schema": MANIFEST_SCHEMA,
        "run_id": run_id,
        "harness": {"name": "ale", "version": "0.1.0"},
        "release": {
            "name": RELEASE.release,
            "manifest_sha256": RELEASE_SHA256,
            "required_task_set_hash": RELEASE.required_task_set_hash,
        },
        "tasks": [
            {
                "id": TASKS[o.ref].id,
                "version": TASKS[o.ref].version,
                "digest": _hex("digest", o.ref),
                "genre": TASKS[o.ref].genre,
                "mode": TASKS[o.ref].mode,
                "official_episodes": TASKS[o.ref].official_episodes,
                "episodes_run": TASKS[o.ref].official_episodes,
                "agent": {"exit_status": 0, "stopped_for": "", "wall_time_s": 1.0, "env_steps": 0, "oom_kills": 0},
                "network": phases,
            }
            for o in outcomes
        ],
        "agent": {
            "name": agent,
            "command": ["python", "agent.py"],
            "declared": {"model": model, "effort": effort},
            "environment": {"digest": "e" * 64, "modules": ["ale.client"], "distributions": ["numpy==2.0.0"]},
        },
        "runtime": {
            "runtime": "local",
            "sandbox": "bwrap",
            "engine": None,
            "images": None,
            "isolation": {
                "seccomp": {"in_force": False, "reason": "fixture: not attested", "details": None},
                "cgroup": {"in_force": True, "reason": None, "details": {"version": 2, "parents": {"unified": "/x"}}},
                "uid": {"in_force": True, "reason": None, "details": {"range": [1879048192, 1879113727]}},
                "filesystems": {"in_force": False, "reason": "fixture: not attested", "details": None},
            },
            "code": {
                "kind": "local-install",
                "note": "digest of the installed Python code and dependency versions, not of an OCI image",
                "code_sha256": _hex("code", key)[:64],
                "dependency_lock_sha256": _hex("lock", key)[:64],
                "python": "3.11.7",
            },
        },
        "challenge": None,
        "trajectory": {"schema": EVENT_SCHEMA, "events": 1, "chain_head": head},
        "judge": None,
        "run": {
            "completed": True,
            "official_episode_counts": official_episode_counts,
            "started": _iso(started),
            "finished": _iso(started + duration_s),
        },
    }
    network = {
        "schema": NETWORK_SCHEMA,
        "proxy": None if usage is None else PROXY,
        "policy": "fixture",
        "phases": phases,
        "requests": {"total": 0, "allowed": 0, "denied": 0},
        "usage": {"cached_input_tokens": 0, **(usage or {"input_tokens": 0, "output_tokens": 0})},
    }
    docs = Documents(
        manifest=structure(manifest, Manifest, what="fixture manifest"),
        results=TaskResults(schema=TASK_RESULTS_SCHEMA, run_id=run_id, tasks=tuple(entries)),
        claimed=structure(claimed, ScoreBreakdown, what="fixture scores"),
        faithfulness=Faithfulness(FAITHFULNESS_SCHEMA, JUDGE_INPUT_FORMAT, {}),
        network=structure(network, NetworkSummary, what="fixture network"),
        artifacts=ArtifactsManifest(ARTIFACTS_SCHEMA, ()),
        integrity=Integrity(INTEGRITY_SCHEMA, {}, _hex("root", key), head, None),
        events=b"",
    )
    summary = pipeline.audit_summary(
        docs,
        run_score,
        challenge={"id": f"chl_{_hex('chl', key)[:24]}"} if challenge else None,
        runner=None if runner is None else RunnerKey(runner["key_id"], "", runner["kind"], runner["label"]),
        ciphertext_sha256=_hex("ciphertext", key),
        root=_hex("root", key),
        events=200 + int(_hex("events", key)[:4], 16) % 5000,
        credits=credits,
    )
    return json.loads(json.dumps(summary))  # as stored: plain JSON


def _resampled_final(s: TaskScore, o: Outcome, run_id: str, n: int) -> intervals.Samples:
    """The task's final in each bootstrap resample of ``n`` synthetic episodes (the module docstring)."""
    rng = random.Random(f"{run_id} {s.task}")
    target = RELEASE.target(s.task)
    noise = [rng.random() for _ in range(n)]
    centre = sum(noise) / n  # the episodes' mean is the measured value
    headline = [s.measured * (1 + o.spread * (u - centre)) for u in noise]
    rates = {name: limit * o.safety for name, limit in target.safety_limits.items()}
    if o.missing_safety:
        rates.pop(sorted(rates)[0])
    names = sorted(rates)
    counts = [[int(rng.random() < min(1.0, rates[name])) for _ in range(n)] for name in names]
    means = intervals.resampled_means([headline, *counts], intervals.stream_key(run_id, s.task))
    samples = intervals.score_samples(
        means[:, 0],
        {name: means[:, 1 + i] for i, name in enumerate(names)},
        paper_value=s.paper_value,
        direction=s.direction,
        safety_limits=target.safety_limits,
        cap=RELEASE.cap,
        eps=RELEASE.eps,
    )
    return intervals.final_samples(s, samples)


def _credit(o: Outcome, key: str) -> Credit:
    """The verifier's judgement of a completed reproduction task of a fixture run."""
    rubric = catalog.get_task(o.ref.split("@")[0]).rubric
    assert rubric is not None
    digest = _hex("judge-input", key, o.ref)
    claimed = {"outcome": "judged", "faithful": True, "judge_model": "runner-judge", "input_sha256": digest,
               "rationale": "the runner's own judge", "findings": [], "signature": None}  # fmt: skip
    if o.faithful is None:
        why = "the bundle's own verdict is not credited; this verifier has no judge to re-judge it with: unjudged"
        return Credit(o.ref, "unjudged", False, None, "no_judge", None, why, (), digest, claimed)
    findings = tuple(
        {"item": item.id, "kind": item.kind, "satisfied": o.faithful or item.kind == "method",
         "evidence": f"#{10 + i}: <code>K = lstsq(...)</code> & \"quoted\""}
        for i, item in enumerate(rubric.items)
    )  # fmt: skip
    rationale = "implements the paper's method" if o.faithful else "the gains are hard-coded from the paper"
    return Credit(o.ref, "judged", o.faithful, "verifier", "judged", "gpt-judge", rationale, findings, digest, claimed)


def submission_id(key: str) -> str:
    return "sub_" + _hex("submission", key)[:24]


@contextlib.contextmanager
def fast_writes() -> Iterator[None]:
    """Fill a fixture database without an fsync per commit (``PRAGMA synchronous = OFF`` on every
    connection ``ale_verify.db`` opens meanwhile). Test data only: a crash could lose it."""
    real = db.SqliteEngine.session

    @contextlib.contextmanager
    def session(self: db.SqliteEngine, *, create: bool = False) -> Iterator[Any]:
        with real(self, create=create) as conn:
            conn.execute("PRAGMA synchronous = OFF")
            yield conn

    db.SqliteEngine.session = session  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        db.SqliteEngine.session = real  # type: ignore[method-assign]


USERS = ("github:alice", "github:mallory")


def prepare(path: Path) -> None:
    """The schema and the fixture's users (uploads reference them)."""
    db.migrate(path)
    for user in USERS:
        db.upsert_user(path, user, user, "github")


def insert_accepted(path: Path, summary: dict[str, Any], *, key: str, received_at: float, user: str = USERS[0]) -> str:
    """Persist an accepted upload exactly as ``pipeline._persist`` does; return its id (the user must
    exist: :func:`prepare`)."""
    sid = submission_id(key)
    level, notes = pipeline.assign_level(summary)
    db.insert_submission(
        path,
        {
            "id": sid,
            "user_id": user,
            "received_at": received_at,
            "ciphertext_sha256": summary["ciphertext_sha256"],
            "status": "accepted",
            "level": level,
            "reason": None,
            "reasons": notes,
            "run_id": summary["run_id"],
            "summary": summary,
        },
        {
            "at": received_at,
            "actor": "verifier",
            "action": "accepted",
            "from_level": None,
            "to_level": level,
            "reason": "all checks passed",
        },
    )
    return sid


def insert_rejected(path: Path, *, key: str, received_at: float, reason: str, message: str) -> str:
    sid = submission_id(key)
    digest = _hex("ciphertext", key)
    db.insert_submission(
        path,
        {
            "id": sid,
            "user_id": USERS[1],
            "received_at": received_at,
            "ciphertext_sha256": digest,
            "status": "rejected",
            "level": None,
            "reason": reason,
            "reasons": [{"reason": reason, "message": message}],
            "run_id": None,
            "summary": {"ciphertext_sha256": digest},
        },
        {"at": received_at, "actor": "verifier", "action": "rejected", "from_level": None, "to_level": None,
         "reason": reason},
    )  # fmt: skip
    return sid


def audit(path: Path, sid: str, reason: str = "operator reviewed the trajectory and artifacts") -> None:
    db.change_level(
        path, sid, actor="github:operator", action="audited", to_level="audited", reason=reason,
        allowed_from=("self_reported", "validated"),
    )  # fmt: skip


def revoke(path: Path, sid: str, reason: str) -> None:
    db.change_level(
        path, sid, actor="github:operator", action="revoked", to_level="revoked", reason=reason,
        allowed_from=("self_reported", "validated", "audited", "officially_verified"),
    )  # fmt: skip


RUNNER = {"key_id": _hex("runner")[:64], "kind": "official_rerun", "label": "ALE CI official rerun"}


def fill_empty(path: Path) -> dict[str, Any]:
    prepare(path)
    return {}


def fill_one(path: Path) -> dict[str, Any]:
    prepare(path)
    summary = make_summary(
        key="one",
        outcomes=[Outcome(r, quality=0.9 + 0.05 * i) for i, r in enumerate(REFS)],
        agent="OpenHands-R",
        model="gpt-5.1",
        effort="high",
        started=BASE_TIME,
        duration_s=5400,
    )
    sid = insert_accepted(path, summary, key="one", received_at=BASE_TIME + 6000)
    return {"only": sid}


def fill_mix(path: Path) -> dict[str, Any]:
    """The curated board; returns the ids of its notable rows by name (and lists by kind)."""
    prepare(path)
    ids: dict[str, Any] = {"rejected": [], "revoked": [], "accepted": []}
    t = BASE_TIME

    def add(name: str, outcomes: Sequence[Outcome], agent: str, model: str | None, effort: str | None,
            **kw: Any) -> str:  # fmt: skip
        nonlocal t
        t += 3600 * 7
        duration = kw.pop("duration_s", 1200 + int(_hex(name)[:4], 16) % 20000)
        summary = make_summary(key=f"mix-{name}", outcomes=outcomes, agent=agent, model=model, effort=effort,
                               started=t - 30000, duration_s=duration, **kw)  # fmt: skip
        sid = insert_accepted(path, summary, key=f"mix-{name}", received_at=t)
        ids[name] = sid
        ids["accepted"].append(sid)
        return sid

    def full(q: float, **kw: Any) -> list[Outcome]:
        return [Outcome(r, quality=q + 0.03 * i, **kw) for i, r in enumerate(REFS)]

    add("validated", full(0.95, aborted=1), "OpenHands-R", "gpt-5.1", "high")
    add("official", full(1.05), "Codex CLI", "gpt-5.1-codex", "xhigh", runner=RUNNER)
    add("self_no_challenge", full(0.7, aborted=4), "SWE-agent", "gemini-3-pro", "low", challenge=False)
    add("self_unofficial", full(0.8, aborted=2), "Mini-SWE", "claude-sonnet-4.5", "low", official_episode_counts=False)
    audit(path, add("audited", full(0.9), "Aider Robotics", "claude-opus-4.5", "medium"))
    sid = add("revoked_top", full(1.3), "RoboSmith", "qwen3-coder-480b", "high")
    revoke(path, sid, "the policy artifact was copied from a published solution")
    ids["revoked"].append(sid)
    sid = add("audited_then_revoked", full(1.1), "PaperBot", "deepseek-v3.2", "medium")
    audit(path, sid, "re-run on the team's hardware matched")
    revoke(path, sid, "the agent read the hidden evaluation seeds through a leaked file")
    ids["revoked"].append(sid)
    add("proxy_tokens", full(0.85, aborted=3), "Aider Robotics", "claude-opus-4.5", "high",
        usage={"input_tokens": 18_234_567, "output_tokens": 1_204_311})  # fmt: skip
    add("reproduction_only", [Outcome(r, quality=1.2) for r in REPRODUCTION], "PaperBot", "deepseek-v3.2", "high")
    add("open_only", [Outcome(r, quality=1.4) for r in OPEN], "RoboSmith", "qwen3-coder-480b", "medium")
    add("single_task", [Outcome(OPEN[0], quality=1.0)], "demo", None, None, duration_s=240.0)
    add("unfaithful", [Outcome(r, quality=1.1, faithful=r not in REPRODUCTION) for r in REFS], "Codex CLI",
        "gpt-5.1-codex", "low")  # fmt: skip
    add("unjudged", [Outcome(r, quality=1.0, faithful=None if r in REPRODUCTION else True) for r in REFS],
        "Aider Robotics", "claude-opus-4.5", "low")  # fmt: skip
    add("not_completed", [Outcome(REFS[0], quality=0.9), Outcome(REFS[1], reason="the agent left no policy "
        "artifact at /workspace/policy.json", ended=("agent", "agent/no_policy")),
        *[Outcome(r, quality=0.6, aborted=3) for r in REFS[2:]]],
        "Mini-SWE", "claude-sonnet-4.5", "medium")  # fmt: skip
    add("nothing_covered", [Outcome(r, reason="the official evaluation did not complete") for r in REFS],
        "random", None, None, duration_s=60.0)  # fmt: skip
    add("penalised", full(1.0, safety=0.5, missing_safety=False), "SWE-agent", "gemini-3-pro", "medium")
    add("tie_a", full(0.92), "OpenHands-R", "gpt-5.1", "medium")
    add("tie_b", full(0.92), "OpenHands-R", "gpt-5.1", "medium")  # same scores, received later
    add("capped", full(2.0), "Codex CLI", "gpt-5.1-codex", "xhigh", runner=RUNNER, duration_s=30000.0)
    add("xss", full(0.75, aborted=6), XSS_NAME, "<b>model</b>", '"effort" & <i>', challenge=False)
    add("csv_formula", full(0.65), CSV_FORMULA_NAME, "=1+1", "@SUM(A1)")
    add("unicode", full(0.88, aborted=1), UNICODE_NAME, "modèle-ß", "hoch")
    add("long_name", full(0.5, aborted=9), LONG_NAME, "a-model-with-a-long-name-as-well-0123456789", "high")
    for i, (reason, message) in enumerate(
        [
            ("decrypt_failed", "the bundle is not encrypted to this site's key"),
            ("score_mismatch", "the claimed scores differ from the scores recomputed from the results"),
            ("chain_invalid", "broken_link at line 42"),
        ]
    ):
        t += 600
        ids["rejected"].append(insert_rejected(path, key=f"mix-rejected-{i}", received_at=t, reason=reason,
                                               message=message))  # fmt: skip
    return ids


def fill_many(path: Path, n: int, *, seed: int = 0, reject_every: int = 50, revoke_every: int = 97) -> dict[str, Any]:
    """``n`` pseudo-random accepted submissions, and besides them a rejected upload every
    ``reject_every``; a revocation every ``revoke_every``, an audit every 13th (written without
    fsync: :func:`fast_writes`)."""
    with fast_writes():
        return _fill_many(path, n, seed=seed, reject_every=reject_every, revoke_every=revoke_every)


def _fill_many(path: Path, n: int, *, seed: int, reject_every: int, revoke_every: int) -> dict[str, Any]:
    prepare(path)
    rng = random.Random(seed)
    ids: dict[str, Any] = {"accepted": [], "rejected": [], "revoked": []}
    t = BASE_TIME
    for i in range(n):
        t += rng.uniform(30, 600)
        key = f"many-{seed}-{i}"
        if reject_every and i % reject_every == reject_every - 1:
            t += 1.0
            sid = insert_rejected(
                path, key=f"{key}-rejected", received_at=t, reason="score_mismatch", message="the claimed scores differ"
            )
            ids["rejected"].append(sid)
        shape = rng.random()
        refs = REFS if shape < 0.7 else REPRODUCTION if shape < 0.8 else OPEN if shape < 0.9 else rng.sample(REFS, 2)
        base = rng.uniform(0.2, 1.3)
        outcomes = [
            Outcome(r, reason="the official evaluation did not complete")
            if rng.random() < 0.05
            else Outcome(
                r,
                quality=max(0.01, base + rng.uniform(-0.2, 0.2)),
                safety=rng.choice([0.0, 0.0, 0.0, 0.1, 0.3]),
                faithful=rng.random() > 0.1,
                aborted=rng.choice([0, 0, 0, 0, 1, 2]),
            )
            for r in refs
        ]
        agent, model, effort = rng.choice(AGENTS)
        summary = make_summary(
            key=key,
            outcomes=outcomes,
            agent=f"{agent} v{rng.randint(1, 9)}",
            model=model,
            effort=effort,
            started=t - rng.uniform(600, 30000),
            duration_s=rng.uniform(300, 25000),
            challenge=rng.random() > 0.1,
            official_episode_counts=rng.random() > 0.05,
            runner=RUNNER if rng.random() < 0.15 else None,
            usage={"input_tokens": rng.randint(10**5, 10**8), "output_tokens": rng.randint(10**4, 10**7)}
            if rng.random() < 0.3
            else None,
            synthetic_episodes=12,
        )
        sid = insert_accepted(path, summary, key=key, received_at=t)
        ids["accepted"].append(sid)
        if revoke_every and i % revoke_every == revoke_every - 1:
            revoke(path, sid, f"revoked in the fixture (row {i})")
            ids["revoked"].append(sid)
        elif i % 13 == 0 and summary["challenge_id"] is not None and summary["runner"] is None:
            audit(path, sid)
    return ids


# -- reading an export ------------------------------------------------------------------------


@attrs.define
class PageRefs:
    """What one HTML page points at and which fragment ids it defines."""

    refs: list[tuple[str, str, str]] = attrs.Factory(list)  # (tag, attribute, value)
    ids: set[str] = attrs.Factory(set)
    scripts: int = 0
    handlers: list[str] = attrs.Factory(list)  # on* attributes


def page_refs(text: str) -> PageRefs:
    from html.parser import HTMLParser

    out = PageRefs()

    class Parser(HTMLParser):
        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            if tag == "script":
                out.scripts += 1
            for name, value in attrs:
                if name in ("href", "src", "xlink:href", "action", "poster", "srcset") and value is not None:
                    out.refs.append((tag, name, value))
                elif name == "id" and value:
                    out.ids.add(value)
                elif name.startswith("on"):
                    out.handlers.append(f"{tag}.{name}")

        handle_startendtag = handle_starttag

    Parser(convert_charrefs=True).feed(text)
    return out


def html_files(site: Path) -> list[Path]:
    return sorted(site.rglob("*.html"))


def is_external(value: str) -> bool:
    return value.startswith(("http://", "https://"))


def resolve_ref(site: Path, page: Path, value: str) -> tuple[Path, str]:
    """The file and fragment a relative reference on ``page`` names (raises on anything absolute)."""
    from urllib.parse import unquote, urlsplit

    parts = urlsplit(value)
    if parts.scheme or parts.netloc or parts.path.startswith("/"):
        raise ValueError(f"{page.relative_to(site)}: not a relative reference: {value!r}")
    target = page if not parts.path else (page.parent / unquote(parts.path)).resolve()
    return target, parts.fragment


# -- serving an export under a sub-path --------------------------------------------------------


class SubPathServer:
    """An ``http.server`` on 127.0.0.1 serving ``site`` under ``prefix`` (e.g. ``/board/``) only:
    anything outside the prefix is a 404, recorded in :attr:`outside`."""

    def __init__(self, site: Path, prefix: str = "/board/") -> None:
        import http.server
        import threading

        self.site, self.prefix = site, prefix
        self.outside: list[str] = []
        self.requests: list[str] = []
        server = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *a: Any, **kw: Any) -> None:
                super().__init__(*a, directory=str(site), **kw)

            def send_head(self) -> Any:
                server.requests.append(self.path)
                if not self.path.startswith(server.prefix):
                    server.outside.append(self.path)
                    self.send_error(404, "outside the site's sub-path")
                    return None
                self.path = "/" + self.path[len(server.prefix) :]
                return super().send_head()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_port}{self.prefix}"

    def __enter__(self) -> SubPathServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=10)


def tools_required() -> bool:
    """CI sets ALE_SITE_TOOLS_REQUIRED=1: a missing validator or browser then fails the tests
    instead of skipping them."""
    import os

    return os.environ.get("ALE_SITE_TOOLS_REQUIRED") == "1"


# -- the ranking rule, written out ------------------------------------------------------------


def reference_ranks(rows: Sequence[tuple[str, float, float, float, bool, float]]) -> list[tuple[str, int]]:
    """``(id, rank)`` in board order for ``(id, score, lower, upper, complete, received_at)`` rows,
    straight from docs/intervals.md ("Ranks"), pair by pair: the reference ``ranking.place`` is held to."""
    complete_count = sum(1 for r in rows if r[4])
    ranks = {}
    for rid, _score, _lower, upper, complete, _at in rows:
        better = sum(1 for other in rows if other[4] == complete and other[2] > upper)
        ranks[rid] = 1 + (0 if complete else complete_count) + better
    order = sorted(rows, key=lambda r: (not r[4], ranks[r[0]], -r[1], r[5], r[0]))
    return [(r[0], ranks[r[0]]) for r in order]


def board_rows(
    rows: Sequence[dict[str, Any]], score: Any, interval: Any, complete: Any = lambda _r: True
) -> list[tuple[str, float, float, float, bool, float]]:
    """The ranked (not revoked, scored) database rows as :func:`reference_ranks` takes them; an
    interval missing from a summary is the score alone."""
    out = []
    for r in rows:
        value = score(r["summary"])
        if r["level"] == "revoked" or value is None:
            continue
        bounds = interval(r["summary"]) or {"lower": value, "upper": value}
        out.append((r["id"], value, bounds["lower"], bounds["upper"], complete(r), r["received_at"]))
    return out
