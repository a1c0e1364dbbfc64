"""The evaluator's own event log: JSON lines the harness turns into ``trusted_evaluator`` events.

Every RPC is recorded (endpoint, method, status code, ids, duration) except Reset and Step,
which are too many to record one by one: those are counted per environment and flushed as
``rpc_summary`` lines at least once a second and whenever another event is written. Step
summaries carry the number of environment steps (copies stepped) and, on the agent endpoint,
the running total the harness checks the step budget against. Episode ends of official
evaluations (interactive sessions and batches, aborted episodes included) are recorded with
their seed *commitment*. No line ever holds a hidden seed or the evaluator secret.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from typing import IO, Any

SUMMARISED = frozenset({"Reset", "Step"})


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
        record = {"seq": self._seq, "wall_time": time.time(), "monotonic": time.monotonic(), **record}
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
        **ids: str,
    ) -> None:
        """Record one call; ``env_steps`` is the number of copies a successful Step advanced."""
        if self._stream is None:
            return
        with self._lock:
            if summarise:
                key = (endpoint, method, ids.get("env_id", ""), code)
                self._counts[key] += 1
                self._steps[key] += env_steps
                if endpoint == "agent":
                    self._agent_env_steps += env_steps
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
            self._write({"kind": kind, **fields})
            self._flush_counts()

    def close(self) -> None:
        if self._stream is None:
            return
        with self._lock:
            self._flush_counts()
