"""95% confidence intervals of the scores: a percentile bootstrap over the evaluator's episodes.

The algorithm, to the bit, is ``docs/intervals.md``; in short:

1. every scored task has its own stream of pseudo-random 64-bit words: PCG64 (XSL-RR 128/64)
   whose 128-bit state and increment are the two halves of ``SHA-256("ale-bootstrap/v1" 0x00
   run_id 0x00 task)`` (the increment's lowest bit set);
2. resample ``b`` (0 to 1998) of a task with ``n`` episodes takes episode
   ``(word[b*n + j] * n) >> 64`` as its ``j``-th episode; the resample's headline value and
   safety rates are the means over those episodes, and its final score is
   ``ale.core.scoring``'s formulas applied to them (the faithfulness gate is a verdict, not
   resampled);
3. an aggregate's resample ``b`` is the aggregate of the tasks' resamples ``b`` (episodes are
   resampled within each task, never across);
4. a bound is an order statistic of the 1999 resampled values: the 50th smallest and the
   1950th smallest, no interpolation.

Pure: numpy for speed, no I/O. The verifier recomputes every bound from the episodes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import numpy as np
import numpy.typing as npt

from ale.core.scoring import Direction, ScoringError, TaskScore

METHOD = "ale-bootstrap/v1"
CONFIDENCE = 0.95
RESAMPLES = 1999
#: 1-based order statistics of the sorted resamples: (RESAMPLES + 1) * 0.025 and * 0.975.
LOWER_RANK = 50
UPPER_RANK = 1950
#: Random words drawn (and episodes gathered) per block, whole resamples at a time: small enough to
#: stay in cache (a fresh megabyte per block costs more in page faults than the arithmetic), and
#: the memory of a huge task stays bounded. The result does not depend on it.
BLOCK = 1 << 14

Samples = npt.NDArray[np.float64]


@attrs.frozen
class Interval:
    lower: float
    upper: float


@attrs.frozen
class Resampled:
    """A task's per-resample means: of the headline value, and of each safety metric's counts."""

    measured: Samples = attrs.field(eq=False)
    rates: dict[str, Samples] = attrs.field(eq=False)


@attrs.frozen
class RunIntervals:
    """The bounds of a run's task finals (every scored task) and of its aggregates."""

    tasks: dict[str, Interval]
    macro_mean: Interval | None  # None where the macro mean is None
    categories: dict[str, Interval | None]  # overall / reproduction / open


def stream_key(run_id: str, task: str) -> bytes:
    """The 32 bytes a task's stream is seeded from: SHA-256 of the domain, run id and task."""
    return hashlib.sha256(b"ale-bootstrap/v1\x00" + run_id.encode() + b"\x00" + task.encode()).digest()


def generator(key: bytes) -> np.random.PCG64:
    """PCG64 with state ``key[0:16]`` and increment ``key[16:32] | 1`` (both big-endian).

    The state is set directly (numpy's seeding, SeedSequence, is not used): the stream is the
    bit generator's raw output, which numpy keeps stable across versions."""
    if len(key) != 32:
        raise ScoringError("a stream key is 32 bytes")
    bit_generator = np.random.PCG64()
    bit_generator.state = {
        "bit_generator": "PCG64",
        "state": {"state": int.from_bytes(key[:16], "big"), "inc": int.from_bytes(key[16:], "big") | 1},
        "has_uint32": 0,
        "uinteger": 0,
    }
    return bit_generator


def pick(words: npt.NDArray[np.uint64], n: int) -> npt.NDArray[np.intp]:
    """Episode indices from random words: ``(word * n) >> 64``, the high half of the 128-bit
    product (exact for ``n < 2**32``: computed from the words' 32-bit halves)."""
    if not 0 < n < 1 << 32:
        raise ScoringError(f"cannot resample {n} episodes")
    count = np.uint64(n)
    high = (words >> np.uint64(32)) * count
    low = ((words & np.uint64(0xFFFFFFFF)) * count) >> np.uint64(32)
    return ((high + low) >> np.uint64(32)).astype(np.intp)


def resampled_means(columns: npt.ArrayLike, key: bytes, resamples: int = RESAMPLES) -> Samples:
    """``(resamples, k)``: each of the ``k`` per-episode columns averaged over each resample.

    ``columns`` is ``(k, n)``: one row per quantity, one value per episode. A mean is summed as
    ``sum(x / n)``, which cannot overflow where the values are finite."""
    data = np.asarray(columns, dtype=np.float64)
    if data.ndim != 2:
        raise ScoringError("episode columns must be a (quantities, episodes) array")
    k, n = data.shape
    if n == 0:
        raise ScoringError("no episodes to resample")
    if not np.isfinite(data).all():
        raise ScoringError("an episode value is not finite")
    if resamples < 1:
        raise ScoringError("at least one resample")
    scaled = data / n
    words = generator(key)
    out = np.empty((resamples, k), dtype=np.float64)
    rows = max(1, BLOCK // n)
    for start in range(0, resamples, rows):
        count = min(rows, resamples - start)
        picks = pick(words.random_raw(count * n), n).reshape(count, n)
        for c in range(k):
            out[start : start + count, c] = scaled[c][picks].sum(axis=1)
    return out


def score_samples(
    measured: Samples,
    rates: Mapping[str, Samples],
    *,
    paper_value: float,
    direction: Direction,
    safety_limits: Mapping[str, float],
    cap: float,
    eps: float,
) -> Samples:
    """``ale.core.scoring.score_task``'s gap times penalties, for every resample at once (a
    declared metric without rates is worst case, factor 0)."""
    with np.errstate(over="ignore", divide="ignore"):
        if direction == "higher":
            gap = np.clip(measured / paper_value, 0.0, cap)
        elif direction == "lower":
            gap = np.clip(paper_value / np.maximum(measured, eps), 0.0, cap)
        else:
            raise ScoringError(f"unknown direction {direction!r}")
        product = np.ones_like(gap)
        for name in sorted(safety_limits):
            rate = rates.get(name)
            factor = np.zeros_like(gap) if rate is None else 1.0 - np.minimum(1.0, rate / safety_limits[name])
            product = product * factor
    return np.asarray(gap * product, dtype=np.float64)


def final_samples(score: TaskScore, samples: Samples) -> Samples:
    """The faithfulness gate of ``score`` applied to its resampled scores (the verdict is fixed)."""
    if score.faithful is None:
        return samples
    return samples * (1.0 if score.faithful else 0.0)


def interval(samples: Samples) -> Interval:
    """The percentile interval: the LOWER_RANK-th and UPPER_RANK-th smallest of RESAMPLES values."""
    if samples.shape != (RESAMPLES,):
        raise ScoringError(f"an interval needs exactly {RESAMPLES} resampled values")
    if not np.isfinite(samples).all():
        raise ScoringError("a resampled score is not finite")
    ordered = np.sort(samples)
    return Interval(float(ordered[LOWER_RANK - 1]), float(ordered[UPPER_RANK - 1]))


def _mean(arrays: Sequence[Samples]) -> Samples | None:
    if not arrays:
        return None
    total = arrays[0]
    for a in arrays[1:]:
        total = total + a
    return np.asarray(total / len(arrays), dtype=np.float64)


def _bounds(samples: Samples | None) -> Interval | None:
    return None if samples is None else interval(samples)


def run_intervals(
    scores: Sequence[TaskScore],
    finals: Mapping[str, Samples],
    *,
    required: Sequence[str],
    missing_tasks: str = "exclude",
) -> RunIntervals:
    """Every task's interval and the aggregates' (``ale.core.scoring.aggregate`` per resample).

    ``finals`` maps each scored task to its resampled final scores (:func:`final_samples`)."""
    by_task = {s.task: s for s in scores}
    if set(finals) != set(by_task):
        raise ScoringError("resamples are needed for exactly the scored tasks")
    present = [by_task[t] for t in dict.fromkeys(required) if t in by_task]
    missing = [t for t in dict.fromkeys(required) if t not in by_task]
    covered = [finals[s.task] for s in present]
    if missing_tasks == "zero":
        macro = _mean(covered + [np.zeros(RESAMPLES) for _ in missing])
    elif missing_tasks == "exclude":
        macro = _mean(covered)
    else:
        raise ScoringError(f"unknown missing-task policy {missing_tasks!r}")
    categories = {
        "overall": _mean(covered),
        "reproduction": _mean([finals[s.task] for s in present if s.genre == "reproduction"]),
        "open": _mean([finals[s.task] for s in present if s.genre == "open"]),
    }
    return RunIntervals(
        tasks={task: interval(samples) for task, samples in finals.items()},
        macro_mean=_bounds(macro),
        categories={name: _bounds(samples) for name, samples in categories.items()},
    )


def interval_document(bounds: Interval | None) -> dict[str, float] | None:
    return None if bounds is None else {"lower": bounds.lower, "upper": bounds.upper}


def intervals_document(run: RunIntervals) -> dict[str, Any]:
    """``score_breakdown.json``'s ``intervals`` member (and the verifier's summary's)."""
    return {
        "method": METHOD,
        "confidence": CONFIDENCE,
        "resamples": RESAMPLES,
        "tasks": {task: interval_document(b) for task, b in sorted(run.tasks.items())},
        "macro_mean": interval_document(run.macro_mean),
        "categories": {name: interval_document(b) for name, b in run.categories.items()},
    }
