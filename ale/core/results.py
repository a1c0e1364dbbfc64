"""``task_results.json``: the evaluator's authoritative results as the bundle carries them.

The harness converts each official ``EvalResult`` (protobuf) into this JSON form; the
verifier parses it back with :func:`parse_task_results` and re-scores it with
:func:`score_run`, the same function the runner used for the claimed scores.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from typing import Any, Literal

import attrs

from ale.core import intervals
from ale.core.parse import loads, non_negative
from ale.core.release import ReleaseManifest, TaskTarget
from ale.core.scoring import Aggregate, TaskScore, aggregate, score_task

TASK_RESULTS_SCHEMA = "ale-task-results/v1"
SCORES_SCHEMA = "ale-score-breakdown/v1"
#: Why an episode was aborted ("" when it was not): the evaluator's reasons, as the schema lists them.
AbortReason = Literal["", "reset_mid_episode", "session_closed", "not_started", "policy_error", "evaluator_error"]

#: Where a task that ended early was (docs/formats.md, "How a task ended"): setting up (its folders,
#: gateway and evaluator), the agent phase, or the official evaluation.
EndPhase = Literal["setup", "agent", "official"]
END_PHASES: tuple[str, ...] = ("setup", "agent", "official")
EndCategory = Literal[
    "infrastructure/gateway_start",
    "infrastructure/evaluator_start",
    "infrastructure/sandbox_start",
    "infrastructure/evaluator_died",
    "infrastructure/gateway_died",
    "infrastructure/evaluator_error",
    "infrastructure/harness",
    "agent/exit",
    "agent/timeout",
    "agent/env_steps",
    "agent/disk",
    "agent/no_policy",
    "policy/load",
    "evaluation/deadline",
    "evaluation/incomplete",
    "cancelled",
]
_ANY_PHASE = frozenset(END_PHASES)
#: The closed set of why a task ended early, each with the phases it can end in (the order is the
#: schema's). ``infrastructure/*`` is the harness's machinery, not the agent (retried when it is a
#: start, docs/decisions.md); ``agent/*`` the agent phase's end when it left no policy; ``policy/load``
#: a policy that cannot be evaluated; ``evaluation/*`` the official evaluation's own end; ``cancelled``
#: a run interrupted while the task ran.
END_CATEGORIES: Mapping[str, frozenset[str]] = {
    "infrastructure/gateway_start": frozenset({"setup"}),
    "infrastructure/evaluator_start": frozenset({"setup"}),
    "infrastructure/sandbox_start": frozenset({"agent", "official"}),
    "infrastructure/evaluator_died": frozenset({"agent", "official"}),
    "infrastructure/gateway_died": frozenset({"agent"}),
    "infrastructure/evaluator_error": frozenset({"official"}),
    "infrastructure/harness": _ANY_PHASE,
    "agent/exit": frozenset({"agent"}),
    "agent/timeout": frozenset({"agent"}),
    "agent/env_steps": frozenset({"agent"}),
    "agent/disk": frozenset({"agent"}),
    "agent/no_policy": frozenset({"agent"}),
    "policy/load": frozenset({"official"}),
    "evaluation/deadline": frozenset({"official"}),
    "evaluation/incomplete": frozenset({"official"}),
    "cancelled": _ANY_PHASE,
}


def is_infrastructure(category: str) -> bool:
    """Whether a category is the harness's machinery failing (never the agent's doing)."""
    return category.startswith("infrastructure/")


def _category(inst: Ended, _attr: object, value: str) -> None:
    if value not in END_CATEGORIES:
        raise ValueError(f"category {value!r} is not one of {', '.join(END_CATEGORIES)}")
    if inst.phase not in END_CATEGORIES[value]:
        raise ValueError(f"category {value} is never recorded in phase {inst.phase!r}")


@attrs.frozen
class Ended:
    """How a task that ended early ended: the phase it was in and why (a closed set)."""

    phase: EndPhase = attrs.field(validator=attrs.validators.in_(END_PHASES))
    category: EndCategory = attrs.field(validator=_category)

    def entry(self) -> dict[str, str]:
        return {"phase": self.phase, "category": self.category}


def _finite(_inst: object, attr: attrs.Attribute[float], value: float) -> None:
    if not math.isfinite(value):
        raise ValueError(f"{attr.name} must be finite")


@attrs.frozen
class Episode:
    index: int = attrs.field(validator=non_negative)
    seed_commitment: str  # 64 hex digits
    episode_return: float = attrs.field(validator=_finite)
    length: int = attrs.field(validator=non_negative)
    success: bool
    safety_counts: dict[str, int]
    terminated: bool
    truncated: bool
    aborted: bool
    abort_reason: AbortReason
    headline_value: float = attrs.field(validator=_finite)

    @property
    def passed(self) -> bool:
        return not self.aborted and (self.terminated or self.truncated)


@attrs.frozen
class SafetyRate:
    name: str
    count: int = attrs.field(validator=non_negative)
    rate: float = attrs.field(validator=_finite)


@attrs.frozen
class EvalResult:
    session_id: str
    run_id: str
    task_id: str
    task_version: str
    task_digest: str
    mode: Literal["interactive", "batch"]
    official: bool
    complete: bool
    num_episodes: int = attrs.field(validator=non_negative)
    episodes: tuple[Episode, ...]
    headline_metric: str
    headline_direction: Literal["higher", "lower"]
    headline_value: float = attrs.field(validator=_finite)
    safety: tuple[SafetyRate, ...]
    passed_episodes: int = attrs.field(validator=non_negative)
    evaluator_version: str


@attrs.frozen
class TaskResult:
    """One task of the run: its evaluator result, or why there is none."""

    task: str  # id@version
    genre: Literal["reproduction", "open"]
    mode: Literal["interactive", "batch"]
    official_episodes: int
    status: Literal["completed", "not_completed"]
    reason: str  # why not completed, or a note on a completed one (aborted episodes); "" when none
    result: EvalResult | None
    ended: Ended | None = None  # a not completed task's phase and category (absent in older bundles)


@attrs.frozen
class TaskResults:
    schema: str = attrs.field(validator=attrs.validators.in_((TASK_RESULTS_SCHEMA,)))
    run_id: str
    tasks: tuple[TaskResult, ...]

    @functools.cached_property
    def resampled(self) -> dict[str, intervals.Resampled]:
        """Each completed task's episodes resampled (docs/intervals.md), computed once: the
        verifier scores the same results with the bundle's verdicts and then with its own."""
        return {
            t.task: resample_episodes(self.run_id, t.task, t.result)
            for t in self.tasks
            if t.status == "completed" and t.result is not None
        }


class ResultInconsistency(ValueError):
    """A result that contradicts itself (the verifier's ``inconsistent_results``)."""


def check_result(task: TaskResult) -> None:
    """Recompute what an EvalResult derives from its episodes; raise on any difference."""
    r = task.result
    if task.ended is not None and task.status == "completed":
        raise ResultInconsistency(f"{task.task}: a completed task did not end early ({task.ended.category})")
    if task.status == "not_completed":
        if r is not None and r.complete:
            raise ResultInconsistency(f"{task.task}: a complete result is marked not completed")
        return
    if r is None:
        raise ResultInconsistency(f"{task.task}: completed without a result")
    if f"{r.task_id}@{r.task_version}" != task.task:
        raise ResultInconsistency(f"{task.task}: the result is for {r.task_id}@{r.task_version}")
    if not (r.complete and r.official):
        raise ResultInconsistency(f"{task.task}: a completed task needs a complete, official result")
    _check_episodes(task.task, r)


#: Episodes an evaluator runs in one session or batch at most (docs/protocol.md, "Limits"): a result
#: with more cannot come from one, and the bootstrap's work grows with the count (docs/intervals.md).
MAX_EPISODES = 10_000


def _check_episodes(ref: str, r: EvalResult) -> None:
    """The figures an EvalResult derives from its episodes are what its episodes say."""
    if r.num_episodes > MAX_EPISODES:
        raise ResultInconsistency(f"{ref}: {r.num_episodes} episodes, more than an evaluator runs ({MAX_EPISODES})")
    if len(r.episodes) != r.num_episodes or [e.index for e in r.episodes] != list(range(r.num_episodes)):
        raise ResultInconsistency(f"{ref}: episodes are not exactly 0..{r.num_episodes - 1}")
    if r.num_episodes == 0:
        raise ResultInconsistency(f"{ref}: no episodes")
    headline = sum(e.headline_value for e in r.episodes) / r.num_episodes
    if not math.isclose(headline, r.headline_value, rel_tol=1e-9, abs_tol=1e-12):
        raise ResultInconsistency(f"{ref}: headline {r.headline_value} is not the episodes' mean {headline}")
    if sum(e.passed for e in r.episodes) != r.passed_episodes:
        raise ResultInconsistency(f"{ref}: passed_episodes does not match the episodes")
    if len({e.seed_commitment for e in r.episodes}) != r.num_episodes:
        raise ResultInconsistency(f"{ref}: seed commitments repeat")
    for s in r.safety:
        count = sum(e.safety_counts.get(s.name, 0) for e in r.episodes)
        if count != s.count or not math.isclose(s.rate, count / r.num_episodes, rel_tol=1e-9, abs_tol=1e-12):
            raise ResultInconsistency(f"{ref}: safety metric {s.name} does not match the episodes")


MAX_TASK_RESULTS_BYTES = 32 * 1024 * 1024


def parse_task_results(raw: bytes) -> TaskResults:
    """Parse and check ``task_results.json`` (ParseError, ResultInconsistency)."""
    return check_task_results(loads(raw, TaskResults, what="task_results.json", max_bytes=MAX_TASK_RESULTS_BYTES))


def check_task_results(results: TaskResults) -> TaskResults:
    """Each task once, and each result consistent with its episodes (ResultInconsistency)."""
    seen = set()
    for t in results.tasks:
        if t.task in seen:
            raise ResultInconsistency(f"{t.task} appears twice")
        seen.add(t.task)
        check_result(t)
    return results


@attrs.frozen
class RunScore:
    tasks: tuple[TaskScore, ...]
    aggregate: Aggregate
    intervals: intervals.RunIntervals | None = None  # None: not computed (no episodes at hand)


def resample_episodes(run_id: str, ref: str, r: EvalResult) -> intervals.Resampled:
    """The means of a task's headline value and of each safety metric's counts in every resample."""
    names = tuple(sorted({s.name for s in r.safety}))
    columns = [[e.headline_value for e in r.episodes]]
    columns += [[e.safety_counts.get(name, 0) for e in r.episodes] for name in names]
    means = intervals.resampled_means(columns, intervals.stream_key(run_id, ref))
    means.flags.writeable = False
    return intervals.Resampled(means[:, 0], {name: means[:, 1 + i] for i, name in enumerate(names)})


def resampled_score(
    resampled: intervals.Resampled, r: EvalResult, target: TaskTarget, release: ReleaseManifest
) -> intervals.Samples:
    """A task's score before the gate in every resample (``score_task``'s formulas)."""
    return intervals.score_samples(
        resampled.measured,
        resampled.rates,
        paper_value=target.paper_value,
        direction=r.headline_direction,
        safety_limits=target.safety_limits,
        cap=release.cap,
        eps=release.eps,
    )


def score_run(results: TaskResults, release: ReleaseManifest, verdicts: Mapping[str, bool | None]) -> RunScore:
    """Score every completed task against the release and aggregate (scoring.txt), with the 95%
    intervals of the task finals and the aggregates (docs/intervals.md)."""
    scores = []
    finals: dict[str, intervals.Samples] = {}
    for t in results.tasks:
        if t.status != "completed" or t.result is None:
            continue
        r = t.result
        target = release.target(t.task)
        scores.append(
            score_task(
                task=t.task,
                genre=t.genre,
                metric=r.headline_metric,
                direction=r.headline_direction,
                measured=r.headline_value,
                paper_value=target.paper_value,
                safety_rates={s.name: s.rate for s in r.safety},
                safety_limits=target.safety_limits,
                faithful=verdicts.get(t.task),
                episodes=r.num_episodes,
                passed=r.passed_episodes,
                cap=release.cap,
                eps=release.eps,
            )
        )
        samples = resampled_score(results.resampled[t.task], r, target, release)
        finals[t.task] = intervals.final_samples(scores[-1], samples)
    agg = aggregate(scores, required=release.required_tasks, missing_tasks=release.missing_tasks)
    bounds = intervals.run_intervals(
        scores, finals, required=release.required_tasks, missing_tasks=release.missing_tasks
    )
    return RunScore(tuple(scores), agg, bounds)


def task_score_document(s: TaskScore) -> dict[str, Any]:
    return {
        "task": s.task,
        "genre": s.genre,
        "metric": s.metric,
        "direction": s.direction,
        "measured": s.measured,
        "paper_value": s.paper_value,
        "gap": s.gap,
        "penalties": s.penalties,
        "score": s.score,
        "faithful": s.faithful,
        "final": s.final,
        "episodes": s.episodes,
        "passed": s.passed,
        "pass_rate": s.pass_rate,
    }


def score_breakdown_document(run_score: RunScore, release: ReleaseManifest) -> dict[str, Any]:
    """``score_breakdown.json``: what the runner claims and what the verifier recomputes and compares."""
    agg = run_score.aggregate
    return {
        "schema": SCORES_SCHEMA,
        "release": release.release,
        "cap": release.cap,
        "eps": release.eps,
        "tasks": [task_score_document(s) for s in run_score.tasks],
        "aggregate": {
            "method": release.aggregate,
            "missing_tasks": release.missing_tasks,
            "macro_mean": agg.macro_mean,
            "categories": agg.categories,
            "pass_rate": agg.pass_rate,
            "covered": list(agg.covered),
            "missing": list(agg.missing),
            "extra": list(agg.extra),
            "coverage_complete": agg.coverage_complete,
            "required_task_set_hash": release.required_task_set_hash,
        },
    } | ({} if run_score.intervals is None else {"intervals": intervals_document(run_score)})


def intervals_document(run_score: RunScore) -> dict[str, Any] | None:
    """The 95% intervals of ``run_score`` as ``score_breakdown.json`` holds them (None: not computed)."""
    return None if run_score.intervals is None else intervals.intervals_document(run_score.intervals)
