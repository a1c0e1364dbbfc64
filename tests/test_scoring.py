"""Scoring exactly as scoring.txt, its worked example included."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ale.core.scoring import ScoringError, TaskScore, aggregate, gap_score, penalty_factor, score_task

CAP, EPS = 1.5, 1e-9


def _task(task: str, genre: str = "open", final_measured: float = 1.0, **kw: object) -> TaskScore:
    args: dict[str, object] = {
        "task": task,
        "genre": genre,
        "metric": "m",
        "direction": "higher",
        "measured": final_measured,
        "paper_value": 1.0,
        "safety_rates": {},
        "safety_limits": {},
        "faithful": True,
        "episodes": 10,
        "passed": 10,
        "cap": CAP,
        "eps": EPS,
    }
    args.update(kw)
    return score_task(**args)  # type: ignore[arg-type]


def test_worked_example_from_scoring_txt() -> None:
    a = score_task(
        task="A@1.0.0",
        genre="reproduction",
        metric="success_rate",
        direction="higher",
        measured=0.63,
        paper_value=0.70,
        safety_rates={"collisions": 0.02},
        safety_limits={"collisions": 0.05},
        faithful=True,
        episodes=100,
        passed=97,
        cap=CAP,
        eps=EPS,
    )
    assert a.gap == pytest.approx(0.90)
    assert a.penalties == {"collisions": pytest.approx(0.60)}
    assert a.score == pytest.approx(0.54)
    assert a.final == pytest.approx(0.54)
    b = _task("B@1.0.0", final_measured=1.12)
    assert b.final == pytest.approx(1.12)
    agg = aggregate([a, b], required=["A@1.0.0", "B@1.0.0", "C@1.0.0"])
    assert agg.macro_mean == pytest.approx(0.83)
    assert agg.covered == ("A@1.0.0", "B@1.0.0")
    assert agg.missing == ("C@1.0.0",)
    assert not agg.coverage_complete


@pytest.mark.parametrize(
    ("measured", "paper", "direction", "expected"),
    [
        (0.35, 0.70, "higher", 0.5),
        (2.0, 0.70, "higher", 1.5),  # capped
        (-1.0, 0.70, "higher", 0.0),  # clamped at 0
        (0.02, 0.01, "lower", 0.5),
        (0.001, 0.01, "lower", 1.5),
        (0.0, 0.01, "lower", 1.5),  # EPS guards the division
        (-5.0, 0.01, "lower", 1.5),
    ],
)
def test_gap_score_both_directions(measured: float, paper: float, direction: str, expected: float) -> None:
    assert gap_score(measured, paper, direction, cap=CAP, eps=EPS) == pytest.approx(expected)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [(math.nan, 1.0), (math.inf, 1.0), (1.0, 0.0), (1.0, -1.0), (1.0, math.nan)])
def test_gap_score_refuses_unscorable_inputs(bad: tuple[float, float]) -> None:
    with pytest.raises(ScoringError):
        gap_score(bad[0], bad[1], "higher", cap=CAP, eps=EPS)


def test_penalties_multiply_and_missing_metric_is_worst_case() -> None:
    s = _task("T@1", safety_rates={"falls": 0.01}, safety_limits={"falls": 0.04, "contacts": 1.0})
    assert s.penalties == {"contacts": 0.0, "falls": pytest.approx(0.75)}
    assert s.final == 0.0
    s = _task("T@1", safety_rates={"falls": 0.01, "contacts": 0.5}, safety_limits={"falls": 0.04, "contacts": 1.0})
    assert s.final == pytest.approx(0.75 * 0.5)


def test_penalty_factor_bounds() -> None:
    assert penalty_factor(0.0, 0.05) == 1.0
    assert penalty_factor(0.05, 0.05) == 0.0
    assert penalty_factor(10.0, 0.05) == 0.0
    assert penalty_factor(None, 0.05) == 0.0
    with pytest.raises(ScoringError):
        penalty_factor(-0.1, 0.05)
    with pytest.raises(ScoringError):
        penalty_factor(0.1, 0.0)


@pytest.mark.parametrize(("faithful", "final"), [(True, 1.2), (False, 0.0), (None, 0.0)])
def test_faithfulness_gate_is_fail_closed_for_reproduction(faithful: bool | None, final: float) -> None:
    s = _task("R@1", genre="reproduction", final_measured=1.2, faithful=faithful)
    assert s.final == pytest.approx(final)


def test_open_genre_skips_the_gate() -> None:
    s = _task("O@1", genre="open", final_measured=1.2, faithful=None)
    assert s.final == pytest.approx(1.2)
    assert s.faithful is None


def test_categories_and_pass_rate() -> None:
    r = _task("R@1", genre="reproduction", final_measured=0.5, passed=5)
    o1 = _task("O1@1", final_measured=1.0, passed=10)
    o2 = _task("O2@1", final_measured=1.5, passed=0)
    agg = aggregate([r, o1, o2], required=["R@1", "O1@1", "O2@1"])
    assert agg.categories["reproduction"] == pytest.approx(0.5)
    assert agg.categories["open"] == pytest.approx(1.25)
    assert agg.categories["overall"] == pytest.approx(1.0)
    assert agg.pass_rate == pytest.approx(15 / 30)
    assert agg.coverage_complete


def test_missing_tasks_zero_policy_and_extras() -> None:
    a = _task("A@1", final_measured=1.0)
    x = _task("X@1", final_measured=1.5)
    agg = aggregate([a, x], required=["A@1", "B@1"], missing_tasks="zero")
    assert agg.macro_mean == pytest.approx(0.5)
    assert agg.extra == ("X@1",)
    assert aggregate([], required=["A@1"]).macro_mean is None
    with pytest.raises(ScoringError):
        aggregate([a, a], required=["A@1"])


@given(
    measured=st.floats(-1e6, 1e6),
    paper=st.floats(1e-6, 1e6),
    direction=st.sampled_from(["higher", "lower"]),
)
def test_gap_score_is_always_within_0_and_cap(measured: float, paper: float, direction: str) -> None:
    assert 0.0 <= gap_score(measured, paper, direction, cap=CAP, eps=EPS) <= CAP  # type: ignore[arg-type]
