"""The network totals of a run, as its trajectory records them (docs/formats.md, network_summary.json).

Every request through the LLM gateway is one ``trusted_network_proxy`` ``llm_request`` event
(allowed or denied, with its usage), unless the trajectory's budget for them ran out: then the
harness's ``events_dropped`` event of the ``gateway.requests`` channel carries the dropped
requests' totals. The harness writes ``network_summary.json`` from these events and the verifier
recomputes it from them, both with :func:`tally`. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

USAGE_FIELDS: Final = ("input_tokens", "output_tokens", "cached_input_tokens")
REQUEST_FIELDS: Final = ("total", "allowed", "denied")
#: the totals' members: requests (total, allowed, denied), usage, and the events that could not be read
FIELDS: Final = (*REQUEST_FIELDS, *USAGE_FIELDS, "unreadable")
DROPPED_CHANNEL: Final = "gateway.requests"
#: the (producer, kind) pairs the totals are made of
TALLIED: Final = frozenset({"llm_request", "events_dropped", "gateway_started"})
#: the ``gateway`` member of the faithfulness judge's gateway's relayed events (docs/judge.md):
#: they are the harness's own requests, not the agent's network, and count in none of its totals
JUDGE_GATEWAY: Final = "judge"


def agents(producer: str, data: Mapping[str, Any]) -> bool:
    """Whether a ``trusted_network_proxy`` event is the agent's gateway's (not the judge's)."""
    return producer == "trusted_network_proxy" and data.get("gateway") != JUDGE_GATEWAY


def _count(value: Any) -> int | None:
    return value if type(value) is int and value >= 0 else None


def request_totals(data: Mapping[str, Any]) -> dict[str, int] | None:
    """What one ``llm_request`` adds to the totals, or None when its decision or usage is unreadable."""
    decision, usage = data.get("decision"), data.get("usage")
    if decision not in ("allowed", "denied") or not isinstance(usage, dict):
        return None
    totals = {"total": 1, "allowed": int(decision == "allowed"), "denied": int(decision == "denied")}
    for name in USAGE_FIELDS:
        value = _count(usage.get(name, 0))
        if value is None:
            return None
        totals[name] = value
    return totals


def dropped_totals(data: Mapping[str, Any]) -> dict[str, int] | None:
    """What an ``events_dropped`` of the ``gateway.requests`` channel adds (its ``totals``), or None
    when they are unreadable; ``{}`` for any other channel."""
    if data.get("channel") != DROPPED_CHANNEL:
        return {}
    totals = data.get("totals")
    if not isinstance(totals, dict) or set(totals) - {*REQUEST_FIELDS, *USAGE_FIELDS}:
        return None
    counted = {name: _count(totals.get(name, 0)) for name in (*REQUEST_FIELDS, *USAGE_FIELDS)}
    if any(v is None for v in counted.values()):
        return None
    return {k: v for k, v in counted.items() if v is not None}


def add(into: dict[str, int], totals: Mapping[str, int] | None) -> None:
    """Add ``totals`` to ``into`` (None: one unreadable event)."""
    if totals is None:
        into["unreadable"] = into.get("unreadable", 0) + 1
        return
    for name, value in totals.items():
        into[name] = into.get(name, 0) + value


def event_totals(producer: str, kind: str, data: Mapping[str, Any]) -> dict[str, int] | None:
    """What an event adds to the totals ({} when nothing, None when it should and cannot be read)."""
    if kind == "llm_request" and agents(producer, data):
        return request_totals(data)
    if producer == "trusted_harness" and kind == "events_dropped":
        return dropped_totals(data)
    return {}


def tally(events: Iterable[tuple[str, str, Mapping[str, Any]]]) -> dict[str, int]:
    """The totals of (producer, kind, data) events, every member of :data:`FIELDS` present."""
    totals = dict.fromkeys(FIELDS, 0)
    for producer, kind, data in events:
        if kind in TALLIED:
            add(totals, event_totals(producer, kind, data))
    return totals
