"""The agent's environment-step budget, counted where the steps are taken.

Every environment step the agent takes counts: each copy a Step advances on one of its own
(non-official) environments, and each step of its batch evaluations (counted as each episode
ends). The official evaluation never counts. Past the budget the evaluator refuses the agent's
Steps and batch submissions and stops its running batches; the harness, which reads the running
total from the event log, stops the agent (docs/agent-contract.md).
"""

from __future__ import annotations

import threading


class StepBudget:
    """A thread-safe count of the agent's environment steps against ``limit`` (None: no limit)."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self._used = 0
        self._lock = threading.Lock()

    @property
    def used(self) -> int:
        return self._used

    @property
    def exceeded(self) -> bool:
        return self.limit is not None and self._used > self.limit

    def charge(self, steps: int) -> bool:
        """Count ``steps``; False once the total is past the limit."""
        with self._lock:
            self._used += steps
            return not self.exceeded

    def refusal(self) -> str:
        return f"the agent's env-step budget of {self.limit} steps is used up ({self._used} steps taken)"
