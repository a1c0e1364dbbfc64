"""The run's LLM budgets: requests, input tokens and output tokens (docs/gateway.md, "Budgets"). Pure.

Only generation requests (Chat Completions, Responses, Messages) count and are metered. A request
is admitted while every budget has room: fewer requests than the limit so far, input tokens used
below the limit, and output tokens used plus the live estimate of the streams in flight below the
limit. An admitted request's output limit is clamped to what remains of the output budget
(:func:`ale.gateway.wire.output_clamp`); a stream whose live estimate takes the total over the
limit is cut. The input budget cannot be enforced within a request (a prompt's size is known only
from the upstream's answer): the request that crosses it completes and the next is refused.
"""

from __future__ import annotations

from typing import Final

import attrs

from ale.gateway.config import Budgets
from ale.gateway.wire import Usage

NAMES: Final = ("requests", "input_tokens", "output_tokens")


@attrs.define
class Ledger:
    limits: Budgets
    requests: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0
    live: dict[str, int] = attrs.Factory(dict)  # request_id -> estimated output of a stream in flight
    exhausted: set[str] = attrs.Factory(set)  # budgets already reported exhausted
    live_total: int = 0  # the sum of ``live`` (kept, not summed per chunk)

    def used(self, name: str) -> int:
        return int(getattr(self, name))

    def limit(self, name: str) -> int | None:
        value: int | None = getattr(self.limits, name)
        return value

    def _live_output(self) -> int:
        return self.output_tokens + self.live_total

    def refusal(self) -> str | None:
        """The budget that refuses a new generation request now, or None."""
        for name in NAMES:
            limit = self.limit(name)
            used = self._live_output() if name == "output_tokens" else self.used(name)
            if limit is not None and used >= limit:
                return name
        return None

    def admit(self, request_id: str) -> int | None:
        """Count an admitted request; the output tokens that remain for it (None: no output limit)."""
        self.requests += 1
        self.live[request_id] = 0
        limit = self.limits.output_tokens
        return None if limit is None else max(0, limit - self._live_output())

    def estimate(self, request_id: str, output: int) -> bool:
        """Update a stream's live estimate; True if the output budget is now overrun (cut it)."""
        if request_id in self.live:
            self.live_total += output - self.live[request_id]
            self.live[request_id] = output
        limit = self.limits.output_tokens
        return limit is not None and self._live_output() > limit

    def settle(self, request_id: str, usage: Usage | None, estimate: int = 0) -> None:
        """A metered request ended: its usage (or, when the upstream said none, its estimate) counts."""
        self.live_total -= self.live.pop(request_id, 0)
        if usage is not None:
            self.input_tokens += usage.input_tokens
            self.output_tokens += usage.output_tokens
            self.cached_input_tokens += usage.cached_input_tokens
        else:
            self.output_tokens += estimate

    def newly_exhausted(self) -> list[tuple[str, int, int]]:
        """(budget, used, limit) of each budget exhausted since the last call (reported once)."""
        out = []
        for name in NAMES:
            limit = self.limit(name)
            if limit is not None and name not in self.exhausted and self.used(name) >= limit:
                self.exhausted.add(name)
                out.append((name, self.used(name), limit))
        return out

    def report(self, name: str) -> tuple[str, int, int] | None:
        """(budget, used, limit) for a budget that refused a request, if not reported yet."""
        limit = self.limit(name)
        if limit is None or name in self.exhausted:
            return None
        self.exhausted.add(name)
        return name, self.used(name), limit

    def summary(self) -> dict[str, dict[str, int | None]]:
        return {name: {"limit": self.limit(name), "used": self.used(name)} for name in NAMES}
