"""Scoring, exactly as scoring.txt: one pure module the runner and the verifier both run.

Per task (``score_task``):

1. gap score: higher-is-better ``clamp(measured / paper_value, 0, CAP)``; lower-is-better
   ``clamp(paper_value / max(measured, EPS), 0, CAP)``;
2. zero-target safety penalties: ``factor = 1 - min(1, rate / limit)`` for every metric the
   release declares a limit for; a declared metric missing from the results is worst case
   (factor 0); factors multiply;
3. faithfulness gate (reproduction genre only, fail-closed): ``final = score * (1 if faithful
   else 0)``; no verdict means unfaithful. Open-genre tasks skip it.

Across tasks (``aggregate``): the macro mean of the final scores of the *completed* required
tasks (missing ones excluded, unless the release says ``"missing_tasks": "zero"``), coverage
against the required task set, category means (overall / reproduction / open) and the pass rate
from the evaluator's per-episode records.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Literal

import attrs

Direction = Literal["higher", "lower"]
Genre = Literal["reproduction", "open"]


class ScoringError(ValueError):
    """Inputs that cannot be scored (a non-finite measurement, a non-positive target, ...)."""


def clamp(value: float, low: float, high: float) -> float:
    return max(low, min(high, value))


def gap_score(measured: float, paper_value: float, direction: Direction, *, cap: float, eps: float) -> float:
    """The per-task gap score: 1.0 matches the paper, above 1.0 beats it, capped at ``cap``."""
    if not math.isfinite(measured):
        raise ScoringError(f"measured value {measured!r} is not finite")
    if not (math.isfinite(paper_value) and paper_value > 0):
        raise ScoringError(f"paper value {paper_value!r} must be finite and positive")
    if direction == "higher":
        return clamp(measured / paper_value, 0.0, cap)
    if direction == "lower":
        return clamp(paper_value / max(measured, eps), 0.0, cap)
    raise ScoringError(f"unknown direction {direction!r}")


def penalty_factor(rate: float | None, limit: float) -> float:
    """``1 - min(1, rate / limit)``; a missing rate is worst case (0.0)."""
    if rate is None:
        return 0.0
    if not math.isfinite(rate) or rate < 0:
        raise ScoringError(f"safety rate {rate!r} must be finite and non-negative")
    if not (math.isfinite(limit) and limit > 0):
        raise ScoringError(f"safety limit {limit!r} must be finite and positive")
    return 1.0 - min(1.0, rate / limit)


@attrs.frozen
class TaskScore:
    """Everything that went into one task's final score, for the breakdown and re-checking."""

    task: str  # id@version
    genre: Genre
    metric: str
    direction: Direction
    measured: float
    paper_value: float
    gap: float
    penalties: dict[str, float]
    score: float  # gap * product(penalties)
    faithful: bool | None  # None: open genre, no gate
    final: float
    episodes: int
    passed: int

    @property
    def pass_rate(self) -> float:
        return self.passed / self.episodes if self.episodes else 0.0


def score_task(
    *,
    task: str,
    genre: Genre,
    metric: str,
    direction: Direction,
    measured: float,
    paper_value: float,
    safety_rates: Mapping[str, float],
    safety_limits: Mapping[str, float],
    faithful: bool | None,
    episodes: int,
    passed: int,
    cap: float,
    eps: float,
) -> TaskScore:
    """Score one task. ``faithful`` is the judge's verdict (None when there is none)."""
    gap = gap_score(measured, paper_value, direction, cap=cap, eps=eps)
    penalties = {name: penalty_factor(safety_rates.get(name), limit) for name, limit in sorted(safety_limits.items())}
    score = gap * math.prod(penalties.values())
    if genre == "reproduction":
        verdict = faithful is True  # fail-closed: no verdict is unfaithful
        final = score * (1.0 if verdict else 0.0)
        gate: bool | None = verdict
    elif genre == "open":
        final, gate = score, None
    else:
        raise ScoringError(f"unknown genre {genre!r}")
    if not 0 <= passed <= episodes:
        raise ScoringError(f"passed episodes {passed} out of range for {episodes} episodes")
    return TaskScore(
        task=task,
        genre=genre,
        metric=metric,
        direction=direction,
        measured=measured,
        paper_value=paper_value,
        gap=gap,
        penalties=penalties,
        score=score,
        faithful=gate,
        final=final,
        episodes=episodes,
        passed=passed,
    )


@attrs.frozen
class Aggregate:
    """The release-level numbers of a run."""

    macro_mean: float | None  # None when no required task was completed
    categories: dict[str, float | None]  # overall / reproduction / open
    pass_rate: float | None  # passed episodes over official episodes of the covered tasks
    covered: tuple[str, ...]
    missing: tuple[str, ...]
    extra: tuple[str, ...]  # scored tasks outside the required set (not in the aggregate)
    coverage_complete: bool


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def aggregate(scores: Iterable[TaskScore], *, required: Sequence[str], missing_tasks: str = "exclude") -> Aggregate:
    """Macro mean over the completed required tasks; see the module docstring."""
    by_task: dict[str, TaskScore] = {}
    for s in scores:
        if s.task in by_task:
            raise ScoringError(f"task {s.task} is scored twice")
        by_task[s.task] = s
    required_set = list(dict.fromkeys(required))
    present = [by_task[t] for t in required_set if t in by_task]
    missing = tuple(t for t in required_set if t not in by_task)
    extra = tuple(sorted(set(by_task) - set(required_set)))
    finals = [s.final for s in present]
    if missing_tasks == "zero":
        finals += [0.0] * len(missing)
    elif missing_tasks != "exclude":
        raise ScoringError(f"unknown missing-task policy {missing_tasks!r}")
    categories = {
        "overall": _mean([s.final for s in present]),
        "reproduction": _mean([s.final for s in present if s.genre == "reproduction"]),
        "open": _mean([s.final for s in present if s.genre == "open"]),
    }
    episodes = sum(s.episodes for s in present)
    return Aggregate(
        macro_mean=_mean(finals),
        categories=categories,
        pass_rate=sum(s.passed for s in present) / episodes if episodes else None,
        covered=tuple(s.task for s in present),
        missing=missing,
        extra=extra,
        coverage_complete=not missing,
    )
