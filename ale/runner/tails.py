"""The trusted processes' JSONL logs, relayed into the trajectory as they grow: one tail for both.

The evaluator (``trusted_evaluator``) and the LLM gateway (``trusted_network_proxy``) each write a
log of one JSON object a line with the same envelope, ``{"kind", "wall_time", "monotonic", "seq",
...}``. A :class:`LogTail` reads a log from where it left off, parses each complete line with
:func:`~ale.core.parse.parse_json` (a line that cannot be read becomes the source's
``unreadable_*_event``, one too long is skipped to its end and noted) and records it as the source's
event, with ``seq`` renamed to ``<source>_seq`` and the task it belongs to added. What a source
charges to a budget channel, and what it learns on the way, is its subclass's:

* :class:`EvaluatorTail`: the lines about the agent's own calls (the agent endpoint's RPCs, its
  practice batches) are charged to the ``evaluator`` channel; it keeps the agent's env-step count.
* :class:`GatewayTail`: every ``llm_request`` is recorded, for the network totals are recomputed
  from these events (``network_summary.json``): with its messages and response while the
  ``gateway`` channel has room, in its accounting form (content left out, ``content_dropped``)
  while ``gateway.requests`` has, and past both counted into that channel's ``events_dropped``
  totals (:meth:`ale.runner.recorder.Recorder.tally`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import trio

from ale.core.network import USAGE_FIELDS, request_totals
from ale.core.parse import ParseError, parse_json
from ale.runner.recorder import Recorder, clip_text

#: a log line is parsed only up to this size (a gRPC request, and so an id an evaluator line echoes,
#: is at most 4 MiB); a longer one is counted and skipped, and a poll reads at most this much
MAX_LOG_LINE = 8 * 1024 * 1024
POLL_S = 0.25
_YEAR_10000 = 253_402_300_800.0
#: the members of an llm_request that the network totals are made of (the rest is content)
ACCOUNTING = (
    "request_id", "method", "upstream", "host", "path", "status", "decision", "reason", "model", "stream",
    "bytes_in", "bytes_out", "duration_ms", "ttfb_ms", "usage",
)  # fmt: skip


def log_line(line: bytes, what: str) -> tuple[str, float, float, dict[str, Any]] | str:
    """(kind, wall time, monotonic time, the rest) of a log line, or why it cannot be read."""
    try:
        event = parse_json(line, what=what, max_bytes=MAX_LOG_LINE)
    except ParseError as exc:
        return clip_text(str(exc), 512)
    if type(event) is not dict:
        return "not a JSON object"
    kind, wall, mono = event.pop("kind", None), event.pop("wall_time", None), event.pop("monotonic", None)
    if type(kind) is not str:
        return "no kind"
    if type(wall) not in (int, float) or type(mono) not in (int, float) or not 0 <= wall < _YEAR_10000:
        return "wall_time and monotonic must be numbers (seconds)"
    if not math.isfinite(mono):
        return "monotonic must be finite"
    return kind, float(wall), float(mono), event


class LogTail:
    """Turns a trusted process's JSONL log into its producer's events, incrementally."""

    producer: ClassVar[str]
    source: ClassVar[str]  # "evaluator" | "gateway": names the seq member and the unreadable kind
    channel: ClassVar[str]  # the budget channel of what the agent's doings cause

    def __init__(self, path: Path, recorder: Recorder, task_ref: str | None) -> None:
        self.path, self.recorder, self.task_ref = path, recorder, task_ref
        self.offset = 0
        self.partial = b""
        self.skipping = 0  # bytes of an over-long line being skipped (0: none)
        self.last_monotonic = 0.0
        self._lock = trio.Lock()  # one poll at a time (the background loop, the watchdog, a drain)

    def _read(self) -> bytes:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read(MAX_LOG_LINE)
        except FileNotFoundError:
            return b""
        self.offset += len(data)
        return data

    async def poll(self, reads: int | None = 4) -> None:
        """Record the complete lines written since the last poll: at most ``reads`` times
        MAX_LOG_LINE bytes of them (so that a flood cannot hold the caller), or all (None)."""
        async with self._lock:
            while reads is None or reads > 0:
                data = await trio.to_thread.run_sync(self._read)
                if not data:
                    return
                for line in self._lines(data):
                    self._record(line)
                reads = None if reads is None else reads - 1

    async def drain(self) -> None:
        """Record every line written so far."""
        await self.poll(None)

    async def run(self) -> None:
        while True:
            await self.poll()
            await trio.sleep(POLL_S)

    def _lines(self, data: bytes) -> list[bytes]:
        """The complete lines in ``data`` (after what was kept of the last read); an over-long
        line is skipped to its end and noted."""
        if self.skipping:
            cut = data.find(b"\n")
            if cut < 0:
                self.skipping += len(data)
                return []
            self._unreadable(f"a line of {self.skipping + cut} bytes exceeds {MAX_LOG_LINE}")
            self.skipping, data = 0, data[cut + 1 :]
        *lines, rest = (self.partial + data).split(b"\n")
        self.partial = rest
        if len(rest) > MAX_LOG_LINE:
            self.skipping, self.partial = len(rest), b""
        return lines

    def _data(self, event: Mapping[str, Any]) -> dict[str, Any]:
        return event if self.task_ref is None else {"task": self.task_ref, **event}  # type: ignore[return-value]

    def _unreadable(self, reason: str, size: int = 0) -> None:
        if self.recorder.admit(self.channel, size):
            kind = f"unreadable_{self.source}_event"
            self.recorder.emit("trusted_harness", kind, self._data({"reason": reason}), channel=self.channel)

    def _record(self, line: bytes) -> None:
        parsed = log_line(line, f"{self.source} log line")
        if isinstance(parsed, str):
            self._unreadable(parsed, len(line))
            return
        kind, wall, mono, event = parsed
        mono = max(mono, self.last_monotonic)  # one producer, one clock: never backwards
        self.last_monotonic = mono
        event[f"{self.source}_seq"] = event.pop("seq", None)
        self._emit(kind, wall, mono, event, len(line))

    def _emit(self, kind: str, wall: float, mono: float, event: dict[str, Any], size: int) -> None:
        self.recorder.emit(self.producer, kind, self._data(event), wall_time=wall, monotonic=mono)


class EvaluatorTail(LogTail):
    """The evaluator's log: the lines about the agent's own calls are charged to the ``evaluator``
    channel's budget; the official evaluation's lines are always recorded."""

    producer = "trusted_evaluator"
    source = "evaluator"
    channel = "evaluator"

    def __init__(self, path: Path, recorder: Recorder, task_ref: str) -> None:
        super().__init__(path, recorder, task_ref)
        self.agent_env_steps = 0

    def _emit(self, kind: str, wall: float, mono: float, event: dict[str, Any], size: int) -> None:
        steps = event.get("agent_env_steps_total")
        if type(steps) is int:
            self.agent_env_steps = max(self.agent_env_steps, steps)
        agents = event.get("endpoint") == "agent" or (kind == "batch_submitted" and event.get("official") is not True)
        if agents and not self.recorder.admit(self.channel, size):
            return
        data = self._data(event)
        self.recorder.emit(
            self.producer, kind, data, wall_time=wall, monotonic=mono, channel=self.channel if agents else None
        )


class GatewayTail(LogTail):
    """The gateway's log: every request is accounted for (see the module's docstring); the
    gateway's own events (started, policy changes, budgets exhausted, stopped) are always recorded.
    ``task_ref`` is the task whose agent phase is on (None between tasks)."""

    producer = "trusted_network_proxy"
    source = "gateway"
    channel = "gateway"
    requests_channel = "gateway.requests"

    def __init__(self, path: Path, recorder: Recorder) -> None:
        super().__init__(path, recorder, None)
        self.usage = dict.fromkeys(USAGE_FIELDS, 0)  # what the recorded requests used (for progress)

    def _emit(self, kind: str, wall: float, mono: float, event: dict[str, Any], size: int) -> None:
        if kind != "llm_request":
            super()._emit(kind, wall, mono, event, size)
            return
        usage = event.get("usage")
        for name in USAGE_FIELDS:
            value = usage.get(name) if isinstance(usage, dict) else None
            self.usage[name] += value if type(value) is int and value > 0 else 0
        if self.recorder.admit(self.channel, size):
            channel, data = self.channel, event
        else:
            data = {name: event[name] for name in ACCOUNTING if name in event} | {"content_dropped": True}
            if not self.recorder.admit(self.requests_channel, size):
                self.recorder.tally(self.requests_channel, accounting(data))
                return
            channel = self.requests_channel
        self.recorder.emit(self.producer, kind, self._data(data), wall_time=wall, monotonic=mono, channel=channel)


def accounting(event: Mapping[str, Any]) -> dict[str, int]:
    """What one llm_request adds to the network totals (:func:`ale.core.network.request_totals`)."""
    return request_totals(event) or {"total": 1}
