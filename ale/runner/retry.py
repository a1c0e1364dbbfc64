"""Bounded retries of what the harness starts for a task: its gateway, its evaluator, its sandboxes.

A start that fails (``GatewayError``/``NetworkError``, ``EvaluatorStartError``, ``SandboxError``:
nothing of the agent ran) is tried again after a backoff, at most :attr:`RetryPolicy.attempts`
times in all; each failed attempt but the last is recorded as an ``infrastructure_retry`` event
(docs/formats.md). What the agent does is never retried: a run of the agent is its attempt.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from typing import TypeVar

import trio

from ale.runner.options import RetryPolicy
from ale.runner.recorder import Recorder, clip_text

_T = TypeVar("_T")

#: what an ``infrastructure_retry`` names: the start that failed
STARTS = ("gateway_start", "evaluator_start", "sandbox_start")


class StartFailed(Exception):
    """Every attempt failed; ``last`` is the last attempt's error."""

    def __init__(self, what: str, attempts: int, last: BaseException) -> None:
        super().__init__(f"{attempts} attempts to start failed; the last: {last}")
        self.what, self.attempts, self.last = what, attempts, last


async def retried(
    what: str,
    attempt: Callable[[int], Awaitable[_T]],
    *,
    errors: tuple[type[BaseException], ...],
    policy: RetryPolicy,
    rec: Recorder,
    task_ref: str,
    note: Callable[[str], None] | None = None,
) -> _T:
    """``await attempt(n)`` for n = 1, 2, ... until it returns; one of ``errors`` is a failed start
    (recorded, waited for, tried again), anything else goes through. StartFailed after the last."""
    assert what in STARTS
    for n in range(1, policy.attempts + 1):
        try:
            return await attempt(n)
        except errors as exc:
            if n == policy.attempts:
                raise StartFailed(what, n, exc) from None
            wait = policy.backoff_s(n)
            message = clip_text(str(exc) or type(exc).__name__, 4096)
            rec.emit(
                "trusted_harness",
                "infrastructure_retry",
                {"task": task_ref, "what": what, "attempt": n, "attempts": policy.attempts, "error": message,
                 "backoff_s": wait},
            )  # fmt: skip
            if note is not None:
                shown, task_id = what.replace("_", " "), task_ref.split("@")[0]
                note(f"{task_id}: {shown} failed (attempt {n} of {policy.attempts}), again in {wait:g} s")
            await trio.sleep(wait)
    raise AssertionError("unreachable")  # pragma: no cover


async def enter_retried(
    stack: AsyncExitStack,
    what: str,
    make: Callable[[int], AbstractAsyncContextManager[_T]],
    **kw: object,
) -> _T:
    """:func:`retried` for a context manager whose entering is the start: entered into ``stack``."""

    async def attempt(n: int) -> _T:
        return await stack.enter_async_context(make(n))

    return await retried(what, attempt, **kw)  # type: ignore[arg-type]
