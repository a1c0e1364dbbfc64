"""The leaderboard's order and ranks: one definition for ``GET /api/v1/leaderboard`` and the static site.

``scoring.txt`` says a run is not comparable to a full run unless its coverage is complete, so a
board ranks the runs that cover every required task of its category first and the partial ones
after them. Within each group a rank says what the 95% intervals can tell apart
(``docs/intervals.md``, "Ranks"):

    rank = 1 + (for a partial run: the ranked complete runs)
             + (the runs of its group whose lower bound is above this run's upper bound),

one plus the runs that are better beyond doubt. Runs whose intervals overlap never count against
each other, so runs that no third run separates share a rank ("1, 1, 3": two runs that cannot
be told apart, then one that both are better than). Rows come in rank order, then score
descending, then the earlier upload, then the smaller id. A row without a stored interval (an
older verifier's) counts as its score alone. Revoked submissions are listed after both groups,
unranked (docs/verifier.md).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple, TypeGuard

CATEGORIES = ("overall", "reproduction", "open")


def genre_of(ref: str, summary: Mapping[str, Any], specs: Mapping[str, Any]) -> str | None:
    """A task's genre: from the submission's own task records, else the installed task's spec
    (:func:`task_genres` of the one ref)."""
    return task_genres(summary, (ref,), specs)[ref]


def task_genres(summary: Mapping[str, Any], refs: Iterable[Any], specs: Mapping[str, Any]) -> dict[Any, str | None]:
    """Each of ``refs``' genre, the summary's task records read once: its ``task_info`` entry's,
    else the first task record of it with a genre, else the installed task's spec (None: unknown)."""
    info = summary.get("task_info") or {}
    tasks = summary.get("tasks") or []
    recorded: dict[str, Any] = {}  # a str ref's first task record with a genre
    for t in tasks:
        if (type(t) is dict or isinstance(t, Mapping)) and type(ref := t.get("task")) is str and t.get("genre"):
            recorded.setdefault(ref, t["genre"])
    genres: dict[Any, str | None] = {}
    for ref in refs:
        if (known := info.get(ref) or {}).get("genre"):
            genres[ref] = str(known["genre"])
            continue
        if type(ref) is str:
            found = recorded.get(ref)
        else:  # not a ref of a task (a hostile summary): the first record whose task equals it
            found = next((t["genre"] for t in tasks if isinstance(t, Mapping) and t.get("task") == ref
                          and t.get("genre")), None)  # fmt: skip
        if found is not None:
            genres[ref] = str(found)
        else:
            spec = specs.get(ref)
            genres[ref] = spec.genre if spec is not None else None
    return genres


def coverage(
    summary: Mapping[str, Any], category: str, specs: Mapping[str, Any], genres: Mapping[Any, str | None] | None = None
) -> tuple[int, int]:
    """(covered, required) tasks of the release in ``category`` ("overall": all of them);
    ``genres``: :func:`task_genres` of them, when the caller has it."""
    covered = list(summary.get("covered") or [])
    required = covered + list(summary.get("missing") or [])
    if category == "overall":
        return len(covered), len(required)
    genre = task_genres(summary, required, specs) if genres is None else genres
    return sum(1 for r in covered if genre[r] == category), sum(1 for r in required if genre[r] == category)


def complete(covered_required: tuple[int, int]) -> bool:
    covered, required = covered_required
    return required > 0 and covered == required


def summary_interval(summary: Mapping[str, Any], *, category: str | None = None, task: str | None = None) -> Any:
    """The stored 95% interval (``{"lower", "upper"}``) of a category's score or of a task's final
    in a submission's summary, or None (an older row, or nothing there)."""
    by_category, by_task = stored_intervals(summary)
    return by_category.get(category) if task is None else by_task.get(task)


def stored_intervals(summary: Mapping[str, Any]) -> tuple[Mapping[Any, Any], Mapping[Any, Any]]:
    """A summary's stored intervals by category and by task (each empty where there is none), as
    :func:`summary_interval` reads them: for a caller that reads several, read once."""
    intervals = summary.get("intervals")
    if not _mapping(intervals):
        return {}, {}
    by_category, by_task = intervals.get("categories"), intervals.get("tasks")
    return (by_category if _mapping(by_category) else {}), (by_task if _mapping(by_task) else {})


def stored_bounds(interval: Any) -> tuple[float, float] | None:
    """``(lower, upper)`` of a stored interval when it is one (two finite numbers, lower at most
    upper), else None: the board never fails on a row it cannot rank by an interval."""
    if not _mapping(interval):
        return None
    lower: Any = interval.get("lower")
    upper: Any = interval.get("upper")
    if not (_number(lower) and _number(upper)):
        return None
    low, high = float(lower), float(upper)
    return (low, high) if math.isfinite(low) and math.isfinite(high) and low <= high else None


def _mapping(value: Any) -> TypeGuard[Mapping[Any, Any]]:
    """isinstance(value, Mapping), a dict (a decoded summary's) first: the abstract check costs more."""
    return type(value) is dict or isinstance(value, Mapping)


def _number(value: Any) -> bool:
    """A float, or an integer a float holds exactly (JSON writes a bound of 1.0 as 1)."""
    return type(value) is float or (type(value) is int and abs(value) <= 2**53)


def bounds(score: float, interval: Any) -> tuple[float, float]:
    """The interval a row is ranked by: the stored one (:func:`stored_bounds`), else the score itself."""
    return stored_bounds(interval) or (score, score)


class Standing(NamedTuple):
    """What places a ranked row: its score and interval, its coverage, its upload and its id."""

    score: float
    lower: float
    upper: float
    complete: bool
    received_at: float
    ident: str


def place(standings: Sequence[Standing]) -> list[tuple[int, int]]:
    """``(index into standings, rank)`` for every row, in board order (the module docstring)."""
    ranks = [0] * len(standings)
    ahead = 0
    above = bisect.bisect_right
    for group in (True, False):
        members = [i for i, s in enumerate(standings) if s.complete == group]
        lowers = sorted([standings[i].lower for i in members])
        first = ahead + 1 + len(lowers)  # a rank is this less the lower bounds at most its upper bound
        for i in members:
            ranks[i] = first - above(lowers, standings[i].upper)
        ahead += len(members)
    keys = [(not s.complete, ranks[i], -s.score, s.received_at, s.ident) for i, s in enumerate(standings)]
    return [(i, ranks[i]) for i in sorted(range(len(standings)), key=keys.__getitem__)]
