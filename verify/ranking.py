"""The leaderboard's order: one definition for ``GET /api/v1/leaderboard`` and the static site.

``scoring.txt`` says a run is not comparable to a full run unless its coverage is complete, so a
board ranks the runs that cover every required task of its category first, by score, and the
partial ones after them, by score; ties go to the earlier upload, then the smaller id. Revoked
submissions are listed after both, unranked (docs/verifier.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

CATEGORIES = ("overall", "reproduction", "open")


def genre_of(ref: str, summary: Mapping[str, Any], specs: Mapping[str, Any]) -> str | None:
    """A task's genre: from the submission's own task records, else the installed task's spec."""
    info = (summary.get("task_info") or {}).get(ref) or {}
    if info.get("genre"):
        return str(info["genre"])
    for t in summary.get("tasks") or []:
        if isinstance(t, Mapping) and t.get("task") == ref and t.get("genre"):
            return str(t["genre"])
    spec = specs.get(ref)
    return spec.genre if spec is not None else None


def coverage(summary: Mapping[str, Any], category: str, specs: Mapping[str, Any]) -> tuple[int, int]:
    """(covered, required) tasks of the release in ``category`` ("overall": all of them)."""
    covered = list(summary.get("covered") or [])
    required = covered + list(summary.get("missing") or [])

    def wanted(ref: str) -> bool:
        return category == "overall" or genre_of(ref, summary, specs) == category

    return sum(1 for r in covered if wanted(r)), sum(1 for r in required if wanted(r))


def complete(covered_required: tuple[int, int]) -> bool:
    covered, required = covered_required
    return required > 0 and covered == required


def order_key(*, score: float, is_complete: bool, received_at: float, ident: str) -> tuple[Any, ...]:
    """Sort key of a ranked row: complete runs first, then score descending, upload time, id."""
    return (not is_complete, -score, received_at, ident)
