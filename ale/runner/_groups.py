"""Trio nurseries wrap what escapes them in exception groups; the harness handles plain exceptions.

:func:`collapse` re-raises a group that holds exactly one exception (after flattening nested
groups) as that exception, so ``except RunError`` and ``except KeyboardInterrupt`` work at the
boundaries where the harness decides what a failure means. A group of several is kept.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    out: list[BaseException] = []
    for exc in group.exceptions:
        out.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return out


@contextmanager
def collapse() -> Iterator[None]:
    try:
        yield
    except BaseExceptionGroup as group:
        leaves = _leaves(group)
        if len(leaves) == 1:
            raise leaves[0] from None
        raise
