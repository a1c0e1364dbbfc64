"""The evaluator's own event log: JSON lines the harness turns into ``trusted_evaluator`` events.

Every RPC is recorded (endpoint, method, status code, ids, duration) except Reset and Step,
which are too many to record one by one: those are counted per environment and flushed as
``rpc_summary`` lines at least once a second and whenever another event is written. Step
summaries carry the number of environment steps (copies stepped) and, on the agent endpoint,
the running total of the agent's steps (its Steps and its batch episodes) that the harness
checks the step budget against; ``batch_progress`` lines carry it too. Episode ends of official
evaluations (interactive sessions and batches, aborted episodes included) are recorded with
their seed *commitment*. No line ever holds a hidden seed or the evaluator secret.

Every line is bounded: a string value longer than :data:`MAX_STRING_CHARS` (an id a caller
sent, say) is cut with a marker saying how many characters were cut, so whatever a caller
sends, no line exceeds a few KiB.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from typing import IO, Any

from ale.protocol import cut

SUMMARISED = frozenset({"Reset", "Step"})
#: The longest string an event line holds; longer ones are cut (``... [N characters cut]``).
MAX_STRING_CHARS = 256


def _bounded(value: Any) -> Any:
    if isinstance(value, str):
        return cut(value, MAX_STRING_CHARS)
    if isinstance(value, dict):
        return {cut(str(k), MAX_STRING_CHARS): _bounded(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_bounded(v) for v in value]
    return value


class EventLog:
    def __init__(self, stream: IO[str] | None, *, flush_interval: float = 1.0) -> None:
        self._stream = stream
        self._lock = threading.Lock()
        self._seq = 0
        self._counts: Counter[tuple[str, str, str, str]] = Counter()
        self._steps: Counter[tuple[str, str, str, str]] = Counter()
        self._agent_env_steps = 0
        self._last_flush = time.monotonic()
        self._interval = flush_interval

    @property
    def enabled(self) -> bool:
        """False when there is no stream: callers can skip building what would not be written."""
        return self._stream is not None

    def _write(self, record: dict[str, Any]) -> None:
        assert self._stream is not None
        self._seq += 1
        record = {"seq": self._seq, "wall_time": time.time(), "monotonic": time.monotonic(), **_bounded(record)}
        self._stream.write(json.dumps(record, sort_keys=True, separators=(",", ":")) + "\n")

    def _flush_counts(self) -> None:
        for key, n in sorted(self._counts.items()):
            endpoint, method, env_id, code = key
            record: dict[str, Any] = {
                "kind": "rpc_summary",
                "endpoint": endpoint,
                "method": method,
                "env_id": env_id,
                "code": code,
                "calls": n,
            }
            if method == "Step":
                record["env_steps"] = self._steps[key]
                if endpoint == "agent":
                    record["agent_env_steps_total"] = self._agent_env_steps
            self._write(record)
        self._counts.clear()
        self._steps.clear()
        self._last_flush = time.monotonic()
        assert self._stream is not None
        self._stream.flush()

    def rpc(
        self,
        endpoint: str,
        method: str,
        code: str,
        *,
        summarise: bool,
        duration_s: float,
        env_steps: int = 0,
        agent_env_steps_total: int | None = None,
        **ids: str,
    ) -> None:
        """Record one call; ``env_steps`` is the number of copies a successful Step advanced and
        ``agent_env_steps_total`` the agent's step count after it (agent endpoint only)."""
        if self._stream is None:
            return
        with self._lock:
            if agent_env_steps_total is not None:
                self._agent_env_steps = max(self._agent_env_steps, agent_env_steps_total)
            if summarise:
                key = (endpoint, method, cut(ids.get("env_id", ""), MAX_STRING_CHARS), code)
                self._counts[key] += 1
                self._steps[key] += env_steps
                if time.monotonic() - self._last_flush >= self._interval:
                    self._flush_counts()
                return
            self._write(
                {
                    "kind": "rpc",
                    "endpoint": endpoint,
                    "method": method,
                    "code": code,
                    "duration_ms": round(duration_s * 1000, 3),
                    **{k: v for k, v in ids.items() if v},
                }
            )
            self._flush_counts()

    def record(self, kind: str, **fields: Any) -> None:
        if self._stream is None:
            return
        with self._lock:
            if "agent_env_steps_total" in fields:
                self._agent_env_steps = max(self._agent_env_steps, int(fields["agent_env_steps_total"]))
            self._write({"kind": kind, **fields})
            self._flush_counts()

    def close(self) -> None:
        if self._stream is None:
            return
        with self._lock:
            self._flush_counts()
