"""The 95% bootstrap intervals (``ale.core.intervals``, docs/intervals.md).

Vector (k) is read from docs/intervals.md and recomputed twice: by the project's code (through
``score_run``, as the runner and the verifier run it) and by :func:`reference_intervals`, a
plain-Python implementation of the page that uses neither numpy nor ``ale.core``. Then properties
(determinism, the interval holds a monotone score, more episodes give a narrower interval) and
hostile inputs (NaN, no episodes, one episode, huge values and counts, too many episodes)."""

from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ale.core import intervals
from ale.core.canonical import canonical_json
from ale.core.release import RELEASE_SCHEMA, ReleaseManifest, TaskTarget
from ale.core.results import (
    MAX_EPISODES,
    TASK_RESULTS_SCHEMA,
    Episode,
    EvalResult,
    ResultInconsistency,
    SafetyRate,
    TaskResult,
    TaskResults,
    check_task_results,
    parse_task_results,
    score_breakdown_document,
    score_run,
)
from ale.core.scoring import ScoringError
from ale.core.verify import plain

ROOT = Path(__file__).resolve().parents[1]
PAGE = (ROOT / "docs" / "intervals.md").read_text(encoding="utf-8")
PROPERTY = settings(max_examples=40, deadline=None)


def _vector(name: str) -> Any:
    found = re.findall(rf"<!-- vector:{name} -->\n```json\n(.*?)\n```", PAGE, flags=re.DOTALL)
    assert len(found) == 1, name
    return json.loads(found[0])


# -- an independent implementation of docs/intervals.md -----------------------------------------

M = 0x2360ED051FC65DA44385DF649FCCF645
MASK64, MASK128 = (1 << 64) - 1, (1 << 128) - 1


def reference_key(run_id: str, task: str) -> bytes:
    return hashlib.sha256(b"ale-bootstrap/v1\x00" + run_id.encode() + b"\x00" + task.encode()).digest()


def reference_words(key: bytes) -> Any:
    state, inc = int.from_bytes(key[:16], "big"), int.from_bytes(key[16:], "big") | 1
    while True:
        state = (state * M + inc) & MASK128
        x = ((state >> 64) ^ state) & MASK64
        r = state >> 122
        yield ((x >> r) | (x << (64 - r))) & MASK64


def reference_finals(run_id: str, t: dict[str, Any], cap: float, eps: float, resamples: int = 1999) -> list[float]:
    names = sorted(t["counts"])
    columns = [t["headline"]] + [t["counts"][m] for m in names]
    n = len(t["headline"])
    words = reference_words(reference_key(run_id, t["task"]))
    finals = []
    for _ in range(resamples):
        picks = [(next(words) * n) >> 64 for _ in range(n)]
        m, *rates = (sum(column[i] / n for i in picks) for column in columns)
        if t["direction"] == "higher":
            gap = max(0.0, min(cap, m / t["paper_value"]))
        else:
            gap = max(0.0, min(cap, t["paper_value"] / max(m, eps)))
        product = 1.0
        for name in sorted(t["safety_limits"]):
            product *= 1.0 - min(1.0, rates[names.index(name)] / t["safety_limits"][name]) if name in names else 0.0
        finals.append(gap * product * (1.0 if t["genre"] == "open" or t["faithful"] is True else 0.0))
    return finals


def _ref_bounds(values: list[float] | None) -> dict[str, float] | None:
    if values is None:
        return None
    ordered = sorted(values)
    return {"lower": ordered[49], "upper": ordered[1949]}


def _ref_mean(columns: list[list[float]]) -> list[float] | None:
    return [sum(xs) / len(columns) for xs in zip(*columns, strict=True)] if columns else None


def reference_intervals(v: dict[str, Any]) -> dict[str, Any]:
    finals = {t["task"]: reference_finals(v["run_id"], t, v["cap"], v["eps"]) for t in v["tasks"]}
    genre = {t["task"]: t["genre"] for t in v["tasks"]}
    covered = [r for r in v["required_tasks"] if r in finals]
    zeros = [[0.0] * 1999 for r in v["required_tasks"] if r not in finals] if v["missing_tasks"] == "zero" else []
    return {
        "method": "ale-bootstrap/v1",
        "confidence": 0.95,
        "resamples": 1999,
        "tasks": {r: _ref_bounds(f) for r, f in sorted(finals.items())},
        "macro_mean": _ref_bounds(_ref_mean([finals[r] for r in covered] + zeros)),
        "categories": {
            "overall": _ref_bounds(_ref_mean([finals[r] for r in covered])),
            "reproduction": _ref_bounds(_ref_mean([finals[r] for r in covered if genre[r] == "reproduction"])),
            "open": _ref_bounds(_ref_mean([finals[r] for r in covered if genre[r] == "open"])),
        },
    }


# -- the vector's run as the project's own documents ---------------------------------------------


def _episode(task: str, i: int, headline: float, counts: dict[str, int]) -> Episode:
    commitment = hashlib.sha256(f"{task} {i}".encode()).hexdigest()
    return Episode(i, commitment, 0.0, 1, True, counts, True, False, False, "", float(headline))


def _result(run_id: str, t: dict[str, Any]) -> TaskResult:
    n = len(t["headline"])
    task_id, version = t["task"].split("@")
    episodes = tuple(
        _episode(t["task"], i, h, {m: c[i] for m, c in t["counts"].items()}) for i, h in enumerate(t["headline"])
    )
    safety = tuple(SafetyRate(m, sum(c), sum(c) / n) for m, c in sorted(t["counts"].items()))
    mean = sum(float(h) for h in t["headline"]) / n
    result = EvalResult(
        "session", run_id, task_id, version, "0" * 64, "batch", True, True, n, episodes, "metric",
        t["direction"], mean, safety, n, "test",
    )  # fmt: skip
    return TaskResult(t["task"], t["genre"], "batch", n, "completed", "", result)


def build(v: dict[str, Any]) -> tuple[TaskResults, ReleaseManifest, dict[str, bool | None]]:
    results = TaskResults(TASK_RESULTS_SCHEMA, v["run_id"], tuple(_result(v["run_id"], t) for t in v["tasks"]))
    targets = {t["task"]: TaskTarget(float(t["paper_value"]), dict(t["safety_limits"])) for t in v["tasks"]}
    targets.update({r: TaskTarget(1.0, {}) for r in v["required_tasks"] if r not in targets})
    release = ReleaseManifest(
        RELEASE_SCHEMA, "example", v["cap"], v["eps"], "macro_mean", v["missing_tasks"], tuple(v["required_tasks"]),
        targets,
    )  # fmt: skip
    return check_task_results(results), release, {t["task"]: t["faithful"] for t in v["tasks"]}


def code_intervals(v: dict[str, Any]) -> dict[str, Any]:
    """The ``intervals`` member of the run's score_breakdown.json, as canonical JSON parsed back."""
    run_score = score_run(*build(v))
    return dict(json.loads(canonical_json(score_breakdown_document(run_score, build(v)[1]))))["intervals"]


# -- vector (k) ------------------------------------------------------------------------------


def test_vector_k_stream_keys_words_and_first_resample() -> None:
    v, first = _vector("k-input"), _vector("k-first")
    assert set(first) == {t["task"] for t in v["tasks"]}
    for t in v["tasks"]:
        expect = first[t["task"]]
        key = intervals.stream_key(v["run_id"], t["task"])
        assert key.hex() == expect["key"] == reference_key(v["run_id"], t["task"]).hex()
        words = reference_words(key)
        assert [f"{next(words):016x}" for _ in range(4)] == expect["words"]
        assert [f"{int(w):016x}" for w in intervals.generator(key).random_raw(4)] == expect["words"]
        n = len(t["headline"])
        raw = intervals.generator(key).random_raw(n)
        assert intervals.pick(raw, n).tolist() == expect["resample_0"]
        assert [(int(w) * n) >> 64 for w in raw] == expect["resample_0"]
        assert reference_finals(v["run_id"], t, v["cap"], v["eps"], resamples=1) == [expect["final_0"]]


def test_vector_k_intervals_by_the_code_and_by_the_reference() -> None:
    v, expected = _vector("k-input"), _vector("k-intervals")
    assert code_intervals(v) == expected  # exact: the vector's sums are exact in any order
    assert json.loads(canonical_json(reference_intervals(v))) == expected


def test_vector_k_tells_neighbouring_order_statistics_apart() -> None:
    """An implementation one off in the ranks (or the stream, or the indices) cannot match it."""
    v = _vector("k-input")
    finals = [reference_finals(v["run_id"], t, v["cap"], v["eps"]) for t in v["tasks"]]
    macro = [(a + b) / 2 for a, b in zip(*finals, strict=True)]
    for values in (*finals, macro):
        ordered = sorted(values)
        for rank in (50, 1950):  # 1-based: ordered[rank - 1] is the bound
            assert ordered[rank - 2] < ordered[rank - 1] < ordered[rank]


def test_vector_k_scores_lie_in_their_intervals() -> None:
    v = _vector("k-input")
    run_score = score_run(*build(v))
    assert run_score.intervals is not None
    for s in run_score.tasks:
        b = run_score.intervals.tasks[s.task]
        assert b.lower <= s.final <= b.upper
    assert run_score.aggregate.macro_mean is not None
    assert run_score.intervals.macro_mean is not None
    assert (
        run_score.intervals.macro_mean.lower <= run_score.aggregate.macro_mean <= run_score.intervals.macro_mean.upper
    )


# -- generated runs against the reference ------------------------------------------------------

values = st.floats(min_value=-1e3, max_value=1e3, allow_nan=False, allow_infinity=False)


@st.composite
def runs(draw: st.DrawFn) -> dict[str, Any]:
    tasks = []
    for i in range(draw(st.integers(1, 3))):
        n = draw(st.integers(1, 12))
        limits = draw(st.dictionaries(st.sampled_from(["falls", "hits"]), st.floats(0.01, 3), max_size=2))
        counted = draw(st.lists(st.sampled_from([*sorted(limits), "other"]), unique=True))
        genre = draw(st.sampled_from(["reproduction", "open"]))
        tasks.append(
            {
                "task": f"task-{i}@1.0.0",
                "genre": genre,
                "faithful": draw(st.booleans()) if genre == "reproduction" else None,
                "direction": draw(st.sampled_from(["higher", "lower"])),
                "paper_value": draw(st.floats(0.01, 100)),
                "safety_limits": limits,
                "headline": draw(st.lists(values, min_size=n, max_size=n)),
                "counts": {m: draw(st.lists(st.integers(0, 3), min_size=n, max_size=n)) for m in counted},
            }
        )
    required = [t["task"] for t in tasks if draw(st.booleans())] + draw(
        st.lists(st.just("absent-task@1.0.0"), max_size=1)
    )
    return {
        "run_id": draw(st.text(min_size=1, max_size=12)),
        "cap": 1.5,
        "eps": 1e-9,
        "missing_tasks": draw(st.sampled_from(["exclude", "zero"])),
        "required_tasks": required,
        "tasks": tasks,
    }


def _close(a: Any, b: Any) -> bool:
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, float | int) and not isinstance(a, bool):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return bool(a == b)


@PROPERTY
@given(runs())
def test_generated_runs_match_the_reference_to_the_verifiers_tolerance(v: dict[str, Any]) -> None:
    assert _close(code_intervals(v), json.loads(canonical_json(reference_intervals(v))))


# -- properties ------------------------------------------------------------------------------


@PROPERTY
@given(runs())
def test_the_same_run_gives_the_same_bytes_whatever_the_block_size(v: dict[str, Any]) -> None:
    first = canonical_json(code_intervals(v))
    assert canonical_json(code_intervals(v)) == first
    saved = intervals.BLOCK
    try:
        intervals.BLOCK = 7  # blocks of one resample, or a few
        assert canonical_json(code_intervals(v)) == first
    finally:
        intervals.BLOCK = saved


def _monotone_task(headline: list[float], direction: str, paper: float) -> dict[str, Any]:
    return {
        "run_id": "run-monotone",
        "cap": 1.5,
        "eps": 1e-9,
        "missing_tasks": "exclude",
        "required_tasks": ["mono-task@1.0.0"],
        "tasks": [
            {"task": "mono-task@1.0.0", "genre": "open", "faithful": None, "direction": direction, "paper_value": paper,
             "safety_limits": {}, "headline": headline, "counts": {}},
        ],
    }  # fmt: skip


@PROPERTY
@given(
    st.lists(values, min_size=1, max_size=60),
    st.sampled_from(["higher", "lower"]),
    st.floats(0.01, 1000),
)
def test_a_monotone_score_lies_in_its_interval(headline: list[float], direction: str, paper: float) -> None:
    run_score = score_run(*build(_monotone_task(headline, direction, paper)))
    assert run_score.intervals is not None
    (s,) = run_score.tasks
    b = run_score.intervals.tasks[s.task]
    assert b.lower <= b.upper
    tolerance = 1e-9 * max(1.0, abs(s.final))  # the score uses the reported mean, the resamples the episodes
    assert b.lower - tolerance <= s.final <= b.upper + tolerance
    agg = run_score.intervals.categories["overall"]
    assert agg is not None
    assert (agg.lower, agg.upper) == (b.lower, b.upper)  # one task: the aggregate is its final


@PROPERTY
@given(st.lists(st.floats(-100, 100), min_size=2, max_size=40).filter(lambda xs: max(xs) - min(xs) > 1e-6))
def test_more_episodes_of_the_same_kind_give_a_narrower_interval(headline: list[float]) -> None:
    key = intervals.stream_key("run-width", "w@1.0.0")

    def width(xs: list[float]) -> float:
        b = intervals.interval(intervals.resampled_means([xs], key)[:, 0])
        return b.upper - b.lower

    once, four_times = width(headline), width(headline * 4)
    assert once > 0
    assert four_times < once  # about half: the standard error shrinks as 1 / sqrt(n)
    assert width(headline * 16) < four_times


def test_intervals_are_order_statistics_of_the_resamples() -> None:
    samples = np.arange(1999, dtype=np.float64)[::-1].copy()
    assert intervals.interval(samples) == intervals.Interval(49.0, 1949.0)
    with pytest.raises(ScoringError):
        intervals.interval(samples[:-1])


# -- hostile inputs --------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_non_finite_episode_value_is_refused(bad: float) -> None:
    with pytest.raises(ScoringError, match="not finite"):
        intervals.resampled_means([[1.0, bad, 2.0]], intervals.stream_key("r", "t"))
    with pytest.raises(ValueError, match="finite"):
        _episode("t@1.0.0", 0, bad, {})


def test_no_episodes_are_refused_in_the_core_and_in_the_results() -> None:
    with pytest.raises(ScoringError, match="no episodes"):
        intervals.resampled_means([[]], intervals.stream_key("r", "t"))
    with pytest.raises(ScoringError):
        intervals.resampled_means([1.0, 2.0], intervals.stream_key("r", "t"))  # not (quantities, episodes)
    v = _monotone_task([1.0], "higher", 1.0)
    results, _release, _ = build(v)
    empty = results.tasks[0]
    assert empty.result is not None
    hollow = TaskResult(
        empty.task, empty.genre, empty.mode, 0, "completed", "",
        EvalResult("s", "r", "mono-task", "1.0.0", "0" * 64, "batch", True, True, 0, (), "metric", "higher", 0.0,
                   (), 0, "test"),
    )  # fmt: skip
    with pytest.raises(ResultInconsistency, match=r"no episodes|0\.\.-1"):
        check_task_results(TaskResults(TASK_RESULTS_SCHEMA, "r", (hollow,)))


def test_one_episode_has_an_interval_of_zero_width_at_its_score() -> None:
    run_score = score_run(*build(_monotone_task([0.7], "higher", 1.0)))
    assert run_score.intervals is not None
    b = run_score.intervals.tasks["mono-task@1.0.0"]
    assert b.lower == b.upper == run_score.tasks[0].final == 0.7


def test_huge_values_neither_overflow_nor_leave_the_cap() -> None:
    headline = [1.7e308, -1.7e308, 1.7e308, 1.6e308] * 3
    means = intervals.resampled_means([headline], intervals.stream_key("r", "huge"))
    assert np.isfinite(means).all()
    samples = intervals.score_samples(
        means[:, 0], {}, paper_value=1e-300, direction="higher", safety_limits={}, cap=1.5, eps=1e-9
    )
    assert set(np.unique(samples)) <= {0.0, 1.5}
    lower = intervals.score_samples(
        means[:, 0], {}, paper_value=1e300, direction="lower", safety_limits={}, cap=1.5, eps=1e-9
    )
    assert np.isfinite(lower).all()
    assert lower.max() <= 1.5


def test_huge_safety_counts_give_a_zero_factor_not_an_error() -> None:
    v = _monotone_task([1.0, 0.9, 1.1], "higher", 1.0)
    v["tasks"][0]["safety_limits"] = {"falls": 0.5}
    v["tasks"][0]["counts"] = {"falls": [2**53 - 1, 0, 2**53 - 1]}
    run_score = score_run(*build(v))
    assert run_score.intervals is not None
    b = run_score.intervals.tasks["mono-task@1.0.0"]
    assert b.lower == 0.0
    assert 0.0 <= b.upper <= 1.5
    assert run_score.tasks[0].final == 0.0


def test_ten_thousand_episodes_are_resampled_and_one_more_is_refused() -> None:
    headline = [((i * 7919) % 1000) / 1000 for i in range(MAX_EPISODES)]
    run_score = score_run(*build(_monotone_task(headline, "higher", 1.0)))
    assert run_score.intervals is not None
    b = run_score.intervals.tasks["mono-task@1.0.0"]
    assert b.lower < run_score.tasks[0].final < b.upper
    assert b.upper - b.lower < 0.02  # 10,000 episodes: a narrow interval
    v = _monotone_task([*headline, 0.5], "higher", 1.0)
    raw = canonical_json(plain(TaskResults(TASK_RESULTS_SCHEMA, v["run_id"], (_result(v["run_id"], v["tasks"][0]),))))
    with pytest.raises(ResultInconsistency, match="more than an evaluator runs"):
        parse_task_results(raw)


def test_too_many_words_for_the_index_rule_and_bad_keys_are_refused() -> None:
    words = np.zeros(4, dtype=np.uint64)
    for n in (0, 1 << 32):
        with pytest.raises(ScoringError, match="cannot resample"):
            intervals.pick(words, n)
    with pytest.raises(ScoringError, match="32 bytes"):
        intervals.generator(b"short")
    with pytest.raises(ScoringError, match="exactly the scored tasks"):
        intervals.run_intervals([], {"x@1.0.0": np.zeros(1999)}, required=[])
