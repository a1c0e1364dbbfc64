"""The trajectory recorder: every producer's events, in one hash chain, within the site's limits.

``emit`` is synchronous and cheap (it builds the event and its line with the pure
:class:`~ale.core.trajectory.ChainBuilder`, so the chain order is the order of ``emit`` calls);
a writer task drains the lines to disk through a worker thread. Before an event is written:

* its data is cut to its producer's caps (:data:`CAPS`): a string past the cap keeps its first
  bytes and says how many were cut, data whose line is still too long becomes
  ``{"truncated": true, "original_bytes": N, "json": "<the start of its JSON>"}``;
* the grammar (:mod:`ale.core.grammar`) must allow it here: what it refuses is recorded as a
  ``rejected_agent_event`` (the agent's) or a ``refused_event`` (anyone else's) instead, so the
  harness never writes a trajectory a verifier refuses, whatever the agent does;
* the events the agent can cause (its output and event channel, and the evaluator's lines about
  its calls) are charged to a *channel* with a byte budget per task (:data:`BUDGETS`); past it they
  are counted, not written, and one ``events_dropped`` event says how many when the phase ends.

The budgets add up so that a run's trajectory, compressed (agent text may not compress at all),
fits the site's upload limit with the other bundle files (docs/formats.md, "Caps and budgets").

A task records into a recorder of its own (its *spool*, :mod:`ale.runner.spool`: a chain of its own
that begins with a ``run_started`` naming only that task), with the run's budgets split between the
run's tasks as ever; :meth:`Recorder.place` then appends a verified spool's events to the run's
chain in task order, so the run's trajectory has the shape of a sequential run's however its tasks
ran (docs/decisions.md, "Tasks side by side").
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import IO, Any

import attrs
import orjson
import trio

from ale.core import bundle, grammar
from ale.core.canonical import canonical_json
from ale.core.trajectory import MAX_LINE_DEPTH, ChainBuilder
from ale.runner._groups import collapse

KIB, MIB = 1024, 1024 * 1024


@attrs.frozen
class Caps:
    """How large one event of a producer may be: each string in its data (UTF-8 bytes), and its line."""

    string_bytes: int
    line_bytes: int


#: Per producer (the harness's own strings hold evaluator stderr and refusal messages).
CAPS: Mapping[str, Caps] = {
    "trusted_harness": Caps(string_bytes=16 * KIB, line_bytes=256 * KIB),
    "trusted_evaluator": Caps(string_bytes=1 * KIB, line_bytes=16 * KIB),
    "untrusted_agent": Caps(string_bytes=64 * KIB, line_bytes=256 * KIB),
    "trusted_network_proxy": Caps(string_bytes=64 * KIB, line_bytes=256 * KIB),
}

_HARNESS_CAPS = CAPS["trusted_harness"]

#: The site refuses a bundle larger than this (ale.core.bundle.Limits.max_ciphertext).
SITE_LIMIT = bundle.Limits().max_ciphertext
#: Bytes of trajectory lines each channel may write in a run (split evenly between its tasks):
#: 27/40 of the site's limit in all (13.5 MiB of 20 MiB), so that the channels' lines, even
#: incompressible, leave room for the harness's own events, the official evaluation's (an
#: ``episode_end`` per episode, never dropped) and the seven other files. A channel is
#: ``<phase>.<stream>``: one stream's flood does not silence the others.
BUDGETS: Mapping[str, int] = {
    "agent.stdout": SITE_LIMIT // 10,  # the agent phase
    "agent.stderr": SITE_LIMIT // 20,
    "agent.event": SITE_LIMIT // 10,  # its event channel (and the harness's refusals of its lines)
    "policy.stdout": SITE_LIMIT // 40,  # an interactive policy, during the official evaluation
    "policy.stderr": SITE_LIMIT // 40,
    "policy.event": SITE_LIMIT // 40,
    "evaluator": SITE_LIMIT // 5,  # the evaluator's lines about the agent's own calls
    "gateway": SITE_LIMIT // 8,  # the gateway's llm_request events with their messages (the agent phase)
    "gateway.requests": SITE_LIMIT // 40,  # past that: llm_request events without their content
}


def _utf8_len(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def clip_text(text: str, limit: int) -> str:
    """``text`` if it is at most ``limit`` UTF-8 bytes, else its first ``limit`` bytes (whole
    characters) followed by ``... [N bytes cut]``."""
    if len(text) <= limit // 4 or _utf8_len(text) <= limit:
        return text
    raw = text.encode("utf-8", "surrogatepass")
    kept = raw[:limit].decode("utf-8", "ignore")
    return f"{kept}... [{len(raw) - _utf8_len(kept)} bytes cut]"


def _clip(value: Any, limit: int, depth: int) -> Any:
    """``value`` with every string cut to ``limit`` and containers nested past the line's depth limit
    replaced by a note (``depth``: the level a container here would have; data itself is level 2)."""
    kind = type(value)
    if kind is str:
        return clip_text(value, limit)
    if kind is not dict and kind is not list:
        return value
    if depth > MAX_LINE_DEPTH:
        return f"... [nested deeper than {MAX_LINE_DEPTH} levels: cut]"
    if kind is list:
        return [_clip(item, limit, depth + 1) for item in value]
    return {key: _clip(item, limit, depth + 1) for key, item in value.items()}


def clip_data(data: Mapping[str, Any], caps: Caps) -> Mapping[str, Any]:
    """The data with its strings cut to the producer's cap (the line's size is checked once built);
    ``data`` itself when nothing in it can need a cut (the common case, checked cheaply)."""
    quick = caps.string_bytes // 4  # a string this short is within the cap, whatever its characters
    for value in data.values():
        kind = type(value)
        if (kind is str and len(value) <= quick) or kind in _SCALARS:
            continue
        return {key: _clip(item, caps.string_bytes, 3) for key, item in data.items()}
    return data


_SCALARS = frozenset({int, float, bool, type(None)})


def truncated_data(data: Mapping[str, Any], caps: Caps) -> dict[str, Any]:
    """The stand-in for data whose line would pass the cap: its size and the start of its JSON."""
    text = canonical_json(dict(data)).decode("utf-8")
    return {
        "truncated": True,
        "original_bytes": _utf8_len(text),
        "json": clip_text(text, caps.line_bytes // 4),
    }


@attrs.define
class Allowance:
    """One channel's budget in one phase of one task, and what it dropped."""

    channel: str
    task: str
    budget: int
    used: int = 0
    dropped: int = 0
    dropped_bytes: int = 0
    totals: dict[str, int] = attrs.Factory(dict)  # what the dropped events counted (Recorder.tally)


class LineQueue:
    """Lines on their way to the file: :meth:`put` appends (no await, no per-line wake-up once
    the writer is busy), the writer :meth:`take` s everything waiting at once."""

    def __init__(self) -> None:
        self.pending: list[bytes] = []
        self.closed = False
        self._waiting = trio.lowlevel.ParkingLot()

    def put(self, line: bytes) -> None:
        if self.closed:
            raise trio.ClosedResourceError("the recorder is closed")
        self.pending.append(line)
        if self._waiting:
            self._waiting.unpark()

    def close(self) -> None:
        self.closed = True
        self._waiting.unpark_all()

    async def take(self) -> list[bytes] | None:
        """Every line waiting (once there is one), or None once closed and empty."""
        while not self.pending:
            if self.closed:
                return None
            await self._waiting.park()
        batch, self.pending = self.pending, []
        return batch


class Recorder:
    def __init__(self, path: Path, queue: LineQueue, *, tasks: int = 1, budgets: Mapping[str, int] = BUDGETS) -> None:
        self.path = path
        self.chain = ChainBuilder()
        self.grammar = grammar.GrammarState()
        self._queue = queue
        self.counts: dict[str, int] = {}
        self._budgets = {channel: total // max(1, tasks) for channel, total in budgets.items()}
        self._open: dict[str, Allowance] = {}
        self._last_monotonic: dict[str, float] = {}  # per producer: a relayed clock never runs backwards
        self._tap: list[bytes] | None = None

    # -- a copy of the lines, for the judge input (ale.judge.phase) ----------------------------------

    def start_tap(self) -> None:
        """Keep a copy of every line written from now on (until :meth:`take_tap`)."""
        self._tap = []

    def take_tap(self) -> list[bytes]:
        """The lines written since :meth:`start_tap`; the copying stops."""
        lines, self._tap = self._tap or [], None
        return lines

    @property
    def head(self) -> str:
        return self.chain.head

    # -- budgets -----------------------------------------------------------------------------------

    def _channels(self, phase: str) -> list[str]:
        return [name for name in self._budgets if name == phase or name.startswith(phase + ".")]

    def open_channel(self, phase: str, task: str) -> None:
        """Start charging the channels of ``phase`` (``agent``: ``agent.stdout``, ...) for ``task``,
        each to a fresh share of its budget."""
        for name in self._channels(phase):
            self._open[name] = Allowance(name, task, self._budgets[name])

    def admit(self, channel: str, size: int) -> bool:
        """Whether the channel may write another event; if not, count it (``size``: its raw bytes) as dropped."""
        allowance = self._open.get(channel)
        if allowance is None or allowance.used < allowance.budget:
            return True
        allowance.dropped += 1
        allowance.dropped_bytes += size
        return False

    def tally(self, channel: str, totals: Mapping[str, int]) -> None:
        """Count one event the channel dropped whole, adding what it counted (an llm_request's
        requests and tokens) to the totals its ``events_dropped`` event will carry."""
        allowance = self._open.get(channel)
        if allowance is None:
            raise RuntimeError(f"no open channel {channel!r} to count a dropped event in")
        for name, value in totals.items():
            allowance.totals[name] = allowance.totals.get(name, 0) + value

    def close_channel(self, phase: str) -> None:
        """End the phase: for each of its channels that dropped events, an ``events_dropped`` event says how many."""
        for name in self._channels(phase):
            allowance = self._open.pop(name, None)
            if allowance is not None and allowance.dropped:
                data: dict[str, Any] = {
                    "task": allowance.task,
                    "channel": name,
                    "budget_bytes": allowance.budget,
                    "events": allowance.dropped,
                    "bytes": allowance.dropped_bytes,
                }
                if allowance.totals:
                    data["totals"] = dict(sorted(allowance.totals.items()))
                self.emit("trusted_harness", "events_dropped", data)

    # -- events ------------------------------------------------------------------------------------

    def emit(
        self,
        producer: str,
        kind: str,
        data: Mapping[str, Any] | None = None,
        *,
        monotonic: float | None = None,
        wall_time: float | None = None,
        channel: str | None = None,
    ) -> bool:
        """Append one event (``monotonic`` defaults to the harness clock, for harness events); False
        if it was refused instead (a refusal event is written in its place). ``channel``: the
        budget it is charged to (:meth:`admit` decides beforehand whether it may be written)."""
        refused = self._try(producer, kind, data or {}, wall_time, monotonic, channel)
        if refused is None:
            return True
        reason, message = refused
        note: dict[str, Any] = {"task": self.grammar.task, "reason": clip_text(f"{reason}: {message}", 1024)}
        if producer == "untrusted_agent" and self.grammar.phase in (grammar.AGENT, grammar.POLICY):
            refusal = "rejected_agent_event"
        else:
            refusal = "refused_event"
            note |= {"producer": producer, "kind": clip_text(kind, 64) if isinstance(kind, str) else repr(kind)[:64]}
        if self._try("trusted_harness", refusal, note, None, None, channel) is not None:
            # the grammar refuses even the refusal: the harness emitted outside an open run (a bug)
            raise RuntimeError(f"cannot record the refusal of {producer} {kind!r}: {message}")
        return False

    def _try(
        self,
        producer: str,
        kind: str,
        data: Mapping[str, Any],
        wall_time: float | None,
        monotonic: float | None,
        channel: str | None,
    ) -> tuple[str, str] | None:
        """Write the event if it can be written and the grammar allows it; else (reason, message)."""
        caps = CAPS.get(producer, _HARNESS_CAPS)
        clipped = clip_data(data, caps)
        wall = time.time() if wall_time is None else wall_time
        mono = time.monotonic() if monotonic is None else monotonic
        if mono < self._last_monotonic.get(producer, mono):  # (NaN is refused by the builder)
            mono = self._last_monotonic[producer]
        try:
            event, line = self.chain.build(producer, kind, clipped, wall_time=wall, monotonic=mono)
            if len(line) > caps.line_bytes:
                event, line = self.chain.build(producer, kind, truncated_data(clipped, caps), wall_time=wall,
                                               monotonic=mono)  # fmt: skip
        except ValueError as exc:
            return "unwritable", str(exc)
        fault = self.grammar.event(self.chain.seq + 1, producer, kind, event["data"])
        if fault is not None:
            return fault.reason, fault.message
        self.chain.commit(event)
        self._last_monotonic[producer] = mono
        self.counts[producer] = self.counts.get(producer, 0) + 1
        if self._tap is not None:
            self._tap.append(line)
        allowance = self._open.get(channel) if channel is not None else None
        if allowance is not None:
            allowance.used += len(line)
        self._queue.put(line)
        return None

    # -- another chain's events ---------------------------------------------------------------------

    def place(self, lines: Iterable[bytes]) -> int:
        """Append the events of another, verified chain (a task's spool without its first line; each
        line without its newline) in their order: the same producers, kinds, data and wall times.
        Each producer's ``monotonic`` times in them are shifted by one amount, just enough that they
        never run backwards in this chain (so the intervals between them stay as recorded; a spool
        that ran after what this chain holds is not shifted at all). The grammar checks every event
        as :meth:`emit` would; returns how many were placed."""
        shift: dict[str, float] = {}
        placed = 0
        for line in lines:
            event = orjson.loads(line)
            producer, kind, data, mono = event["producer"], event["kind"], event["data"], event["monotonic"]
            last = self._last_monotonic.get(producer)
            if producer not in shift:
                shift[producer] = 0.0 if last is None or mono >= last else last - mono
            if shift[producer]:
                mono += shift[producer]
            if last is not None and mono < last:  # (the shift's rounding)
                mono = last
            adopted, out = self.chain.adopt(line, event, monotonic=mono)
            fault = self.grammar.event(self.chain.seq + 1, producer, kind, data)
            if fault is not None:
                raise ValueError(f"a placed event is out of place: {fault.reason}: {fault.message}")
            self.chain.commit(adopted)
            self._last_monotonic[producer] = mono
            self.counts[producer] = self.counts.get(producer, 0) + 1
            if self._tap is not None:
                self._tap.append(out)
            self._queue.put(out)
            placed += 1
        return placed


async def _writer(queue: LineQueue, fh: IO[bytes], durable: bool) -> None:
    # Shielded: on cancellation (Ctrl-C, a deadline) the writer still writes every emitted line;
    # it ends when the recorder closes its queue.
    with trio.CancelScope(shield=True):
        while (batch := await queue.take()) is not None:
            await trio.to_thread.run_sync(fh.write, b"".join(batch))
        await trio.to_thread.run_sync(fh.flush)
        if durable:
            await trio.to_thread.run_sync(os.fsync, fh.fileno())


@asynccontextmanager
async def open_recorder(
    path: Path, *, tasks: int = 1, budgets: Mapping[str, int] = BUDGETS, durable: bool = False
) -> AsyncIterator[Recorder]:
    """A recorder writing to ``path`` for a run of ``tasks`` tasks; on exit every emitted line is on
    disk (``durable``: and synced to it, fsync)."""
    fh = await trio.to_thread.run_sync(lambda: open(path, "xb"))  # noqa: SIM115 - closed below
    queue = LineQueue()
    try:
        with collapse():
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_writer, queue, fh, durable)
                try:
                    yield Recorder(path, queue, tasks=tasks, budgets=budgets)
                finally:
                    queue.close()
    finally:
        await trio.to_thread.run_sync(fh.close)
