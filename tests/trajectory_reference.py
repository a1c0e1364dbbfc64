"""A slow, plain reference verifier for ale-trajectory-event/v1, written from docs/formats.md.

It does what the page says, one line after the other, with nothing clever: parse the line with
``parse_json`` and compare it with its RFC 8785 form, check the members, recompute the hash of the
event without its hash, count seq and producer_sequence, follow prev_hash, compare monotonic times;
then feed *every* event to the grammar, and compare the nonce. The fast path
(:func:`ale.core.trajectory.check_chunk`, however the stream is cut, then ``link_chunks``) must
give the same verdict: the same reason at the same line, or the same summary.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from ale.core import grammar, network
from ale.core.canonical import CanonicalError, canonical_json
from ale.core.parse import JsonLimitError, ParseError, parse_json
from ale.core.trajectory import (
    EVENT_SCHEMA,
    FIELDS,
    GENESIS,
    MAX_LINE_BYTES,
    MAX_LINE_DEPTH,
    PRODUCERS,
    ChainError,
    ChainSummary,
)

KIND = re.compile(r"[a-z][a-z0-9_]{0,63}")
HEX64 = re.compile(r"[0-9a-f]{64}")
WALL_TIME = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{6}Z")


def parse(raw: bytes, number: int) -> dict[str, Any]:
    if len(raw) > MAX_LINE_BYTES:
        raise ChainError("line_too_long", number, "line too long")
    try:
        event = parse_json(raw, what="line", max_bytes=MAX_LINE_BYTES, max_depth=MAX_LINE_DEPTH, unique_keys=False)
    except JsonLimitError:
        raise ChainError("too_deep", number, "too deep") from None
    except ParseError:
        raise ChainError("not_json", number, "refused by parse_json") from None
    if not isinstance(event, dict):
        raise ChainError("not_json", number, "not an object")
    try:
        canonical = canonical_json(event)
    except CanonicalError:
        raise ChainError("not_canonical", number, "no canonical form") from None
    if canonical != raw:
        raise ChainError("not_canonical", number, "not canonical")
    return event


def members(event: dict[str, Any], number: int) -> None:
    def fail(reason: str) -> None:
        raise ChainError(reason, number, reason)

    if set(event) != FIELDS:
        fail("bad_fields")
    if event["schema"] != EVENT_SCHEMA:
        fail("bad_schema")
    if type(event["seq"]) is not int or type(event["producer_sequence"]) is not int:
        fail("bad_sequence")
    if not isinstance(event["producer"], str) or event["producer"] not in PRODUCERS:
        fail("bad_producer")
    if not isinstance(event["kind"], str) or not KIND.fullmatch(event["kind"]):
        fail("bad_kind")
    if not isinstance(event["wall_time"], str) or not WALL_TIME.fullmatch(event["wall_time"]):
        fail("bad_time")
    if type(event["monotonic"]) not in (int, float):
        fail("bad_time")
    if not isinstance(event["data"], dict):
        fail("bad_data")
    if not isinstance(event["prev_hash"], str) or not HEX64.fullmatch(event["prev_hash"]):
        fail("bad_hash")
    if not isinstance(event["hash"], str) or len(event["hash"]) != 64:
        fail("bad_hash")


def reference_verify(
    stream: bytes,
    *,
    expected_nonce: str | None = None,
    check_nonce: bool = False,
    check_grammar: bool = True,
    incomplete: bool = False,
) -> ChainSummary:
    if stream and not stream.endswith(b"\n"):
        raise ChainError("truncated", stream.count(b"\n") + 1, "truncated")
    lines = stream.split(b"\n")[:-1] if stream else []
    head = GENESIS
    per_producer: dict[str, int] = {}
    last_monotonic: dict[str, float] = {}
    kinds: dict[str, int] = {}
    eval_results: dict[str, dict[str, Any]] = {}
    events = []
    for number, raw in enumerate(lines, start=1):
        event = parse(raw, number)
        members(event, number)
        producer = event["producer"]
        if event["seq"] != number - 1:
            raise ChainError("bad_sequence", number, "seq")
        if event["producer_sequence"] != per_producer.get(producer, 0):
            raise ChainError("bad_sequence", number, "producer_sequence")
        if event["prev_hash"] != head:
            raise ChainError("broken_link", number, "prev_hash")
        body = {k: v for k, v in event.items() if k != "hash"}
        if not HEX64.fullmatch(event["hash"]) or hashlib.sha256(canonical_json(body)).hexdigest() != event["hash"]:
            raise ChainError("bad_hash", number, "hash")
        if producer in last_monotonic and event["monotonic"] < last_monotonic[producer]:
            raise ChainError("bad_time", number, "monotonic")
        if number == 1:
            nonce = event["data"].get("nonce")
            if (producer, event["kind"]) != ("trusted_harness", "run_started"):
                raise ChainError("bad_first_event", number, "first event")
            if nonce is not None and not isinstance(nonce, str):
                raise ChainError("bad_first_event", number, "nonce")
        head = event["hash"]
        per_producer[producer] = per_producer.get(producer, 0) + 1
        last_monotonic[producer] = event["monotonic"]
        kinds[event["kind"]] = kinds.get(event["kind"], 0) + 1
        if (producer, event["kind"]) == ("trusted_evaluator", "eval_result"):
            session = event["data"].get("session_id")
            if isinstance(session, str):
                eval_results[session] = event["data"]
        events.append(event)
    if not events:
        raise ChainError("empty", 0, "empty")
    if check_grammar:
        state = grammar.GrammarState()
        for number, event in enumerate(events, start=1):
            fault = state.feed(number, *grammar.classify(event["producer"], event["kind"], event["data"]))
            if fault is not None:
                raise ChainError(fault.reason, fault.line, fault.message)
        fault = state.finish(len(events), incomplete=incomplete)
        if fault is not None:
            raise ChainError(fault.reason, fault.line, fault.message)
    first = events[0]
    nonce = first["data"].get("nonce")
    if check_nonce and nonce != expected_nonce:
        raise ChainError("nonce_mismatch", 1, "nonce")
    run_id = first["data"].get("run_id")
    totals = network.tally((e["producer"], e["kind"], e["data"]) for e in events)
    gateways = tuple(
        e["data"].get("upstreams")
        for e in events
        if e["kind"] == "gateway_started"
        and e["producer"] == "trusted_network_proxy"
        and e["data"].get("gateway") != "judge"  # the judge's own gateway is not the agent's network
    )
    task_ends = {
        e["data"]["task"]: e["data"].get("ended")
        for e in events
        if (e["producer"], e["kind"]) == ("trusted_harness", "task_finished") and type(e["data"].get("task")) is str
    }
    return ChainSummary(
        head, len(events), nonce, per_producer, kinds, first["wall_time"], events[-1]["wall_time"],
        run_id if isinstance(run_id, str) else None, eval_results, totals, gateways, task_ends,
    )  # fmt: skip
