"""The trajectory stream ``ale-trajectory-event/v1``: append-only, hash-chained JSON lines.

Each line is the RFC 8785 canonical JSON of one event followed by ``\\n``::

    {"data": {...}, "hash": "<hex>", "kind": "run_started", "monotonic": 12.5,
     "prev_hash": "<hex>", "producer": "trusted_harness", "producer_sequence": 0,
     "schema": "ale-trajectory-event/v1", "seq": 0, "wall_time": "2026-11-30T04:28:38.123456Z"}

* ``seq`` counts every event of the stream from 0; ``producer_sequence`` counts the events of
  that producer from 0. Both increase by exactly one.
* ``wall_time`` (RFC 3339, UTC, microseconds) orders events across producers together with
  ``producer_sequence``; ``monotonic`` (seconds) is meaningful only within one producer.
* ``prev_hash`` is the previous event's ``hash`` (64 zeros for the first event), and ``hash`` is
  the SHA-256 (hex) of the canonical JSON of the event *without* its ``hash`` member. The last
  hash is the chain head that ``integrity.json`` records.
* The first event is ``run_started`` by ``trusted_harness`` and binds the challenge ``nonce``
  into the chain (``data.nonce``; ``null`` for a run without a site).

Nothing here does I/O: the harness writes the lines, the verifier reads them, both through this
module. docs/formats.md carries test vectors.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
import re
from collections.abc import Iterator, Mapping
from typing import Any

import attrs

from ale.core.canonical import CanonicalError, canonical_json, encode_prepared, prepare

EVENT_SCHEMA = "ale-trajectory-event/v1"
GENESIS = "0" * 64
PRODUCERS = ("trusted_harness", "trusted_evaluator", "trusted_network_proxy", "untrusted_agent", "derived_verifier")
FIELDS = frozenset(
    {"schema", "seq", "producer", "producer_sequence", "wall_time", "monotonic", "kind", "data", "prev_hash", "hash"}
)
_WALL_TIME = re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{6}Z$")
_KIND = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
MAX_LINE_BYTES = 1 << 20


class ChainError(ValueError):
    """A stream that is not a valid chain; ``reason`` is a stable code, ``line`` 1-based."""

    def __init__(self, reason: str, line: int, message: str) -> None:
        super().__init__(f"line {line}: {message}" if line else message)
        self.reason, self.line = reason, line


def event_hash(event_without_hash: Mapping[str, Any]) -> str:
    return hashlib.sha256(canonical_json(dict(event_without_hash))).hexdigest()


def format_wall_time(epoch_seconds: float) -> str:
    """RFC 3339 UTC with exactly six fractional digits, from seconds since the epoch."""
    micros = round(epoch_seconds * 1_000_000)
    moment = _dt.datetime(1970, 1, 1, tzinfo=_dt.UTC) + _dt.timedelta(microseconds=micros)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _hash_and_line(event: dict[str, Any]) -> tuple[str, bytes]:
    """The event's hash and its JSONL line, preparing the canonical form once."""
    prepared = prepare(event)
    if prepared is not None:
        try:
            digest = hashlib.sha256(encode_prepared(prepared)).hexdigest()
            prepared["hash"] = digest
            return digest, encode_prepared(prepared) + b"\n"
        except UnicodeEncodeError:
            pass
    digest = event_hash(event)
    return digest, canonical_json({**event, "hash": digest}) + b"\n"


@attrs.define
class ChainBuilder:
    """Builds events in order; the caller writes the returned lines. Not thread-safe by itself."""

    head: str = GENESIS
    seq: int = 0
    per_producer: dict[str, int] = attrs.Factory(dict)

    def append(
        self, producer: str, kind: str, data: Mapping[str, Any], *, wall_time: float, monotonic: float
    ) -> tuple[dict[str, Any], bytes]:
        """Make the next event; return it and its line (canonical JSON plus newline)."""
        if producer not in PRODUCERS:
            raise ValueError(f"unknown producer {producer!r}")
        if not _KIND.fullmatch(kind):
            raise ValueError(f"event kind {kind!r} is not a lowercase identifier")
        if not math.isfinite(monotonic):
            raise ValueError("monotonic time must be finite")
        event: dict[str, Any] = {
            "schema": EVENT_SCHEMA,
            "seq": self.seq,
            "producer": producer,
            "producer_sequence": self.per_producer.get(producer, 0),
            "wall_time": format_wall_time(wall_time),
            "monotonic": monotonic,
            "kind": kind,
            "data": dict(data),
            "prev_hash": self.head,
        }
        event["hash"], line = _hash_and_line(event)
        if len(line) > MAX_LINE_BYTES:
            raise ValueError(f"event of {len(line)} bytes exceeds the line limit of {MAX_LINE_BYTES}")
        self.head = event["hash"]
        self.seq += 1
        self.per_producer[producer] = event["producer_sequence"] + 1
        return event, line


@attrs.frozen
class ChainSummary:
    head: str
    events: int
    nonce: str | None
    per_producer: dict[str, int]
    kinds: dict[str, int]
    first_wall_time: str
    last_wall_time: str
    run_id: str | None = None  # from the first event
    #: ``trusted_evaluator`` ``eval_result`` events by session id: what the evaluator reported.
    eval_results: dict[str, dict[str, Any]] = attrs.Factory(dict)


def iter_lines(stream: bytes) -> Iterator[tuple[int, bytes, dict[str, Any]]]:
    """Parse lines strictly: each must be the canonical JSON of its own content."""
    if stream and not stream.endswith(b"\n"):
        raise ChainError("truncated", stream.count(b"\n") + 1, "the last line has no newline: truncated stream")
    for number, raw in enumerate(stream.split(b"\n")[:-1] if stream else [], start=1):
        if len(raw) > MAX_LINE_BYTES:
            raise ChainError("line_too_long", number, f"line of {len(raw)} bytes exceeds {MAX_LINE_BYTES}")
        try:
            event = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
            raise ChainError("not_json", number, "not a JSON object") from None
        if not isinstance(event, dict):
            raise ChainError("not_json", number, "not a JSON object")
        try:
            canonical = canonical_json(event)
        except CanonicalError as exc:
            raise ChainError("not_canonical", number, str(exc)) from None
        if canonical != raw:
            raise ChainError("not_canonical", number, "the line is not in canonical JSON (RFC 8785) form")
        yield number, raw, event


def iter_events(stream: bytes) -> Iterator[tuple[int, dict[str, Any]]]:
    for number, _raw, event in iter_lines(stream):
        yield number, event


def _fail(reason: str, number: int, message: str) -> None:
    raise ChainError(reason, number, message)


def _check_fields(number: int, event: dict[str, Any]) -> None:
    if event.keys() != FIELDS:
        missing, extra = sorted(FIELDS - set(event)), sorted(set(event) - FIELDS)
        _fail("bad_fields", number, f"fields missing {missing} or unexpected {extra}")
    if event["schema"] != EVENT_SCHEMA:
        _fail("bad_schema", number, f"schema is not {EVENT_SCHEMA}")
    if type(event["seq"]) is not int or type(event["producer_sequence"]) is not int:
        _fail("bad_sequence", number, "seq and producer_sequence must be integers")
    producer = event["producer"]
    if not isinstance(producer, str) or producer not in PRODUCERS:
        _fail("bad_producer", number, f"unknown producer {producer!r}")
    kind = event["kind"]
    if not isinstance(kind, str) or not _KIND.fullmatch(kind):
        _fail("bad_kind", number, "kind is not a lowercase identifier")
    wall = event["wall_time"]
    if not isinstance(wall, str) or not _WALL_TIME.fullmatch(wall):
        _fail("bad_time", number, "wall_time is not RFC 3339 UTC with microseconds")
    mono = event["monotonic"]
    if isinstance(mono, bool) or not isinstance(mono, (int, float)):
        _fail("bad_time", number, "monotonic is not a number")
    if not isinstance(event["data"], dict):
        _fail("bad_data", number, "data is not an object")
    for key in ("prev_hash", "hash"):
        value = event[key]
        if not isinstance(value, str) or not _HEX64.fullmatch(value):
            _fail("bad_hash", number, f"{key} is not 64 lowercase hex digits")


def _body_hash(raw: bytes, digest: str) -> str:
    """SHA-256 of the canonical event without its hash member, cut from the canonical line itself.

    In canonical key order ``hash`` follows ``data`` and precedes ``kind``, and every member after
    it has a checked format that cannot contain the text searched for, so the last occurrence is
    the member itself and removing it leaves exactly the canonical body.
    """
    member = b'"hash":"' + digest.encode() + b'",'
    cut = raw.rfind(member)
    if cut < 0:  # pragma: no cover - a canonical line always holds its hash member
        return ""
    return hashlib.sha256(raw[:cut] + raw[cut + len(member) :]).hexdigest()


def verify_chain(stream: bytes, *, expected_nonce: str | None = None, check_nonce: bool = False) -> ChainSummary:
    """Check every line, link and counter of a stream; return its summary or raise ChainError."""
    head, seq = GENESIS, 0
    per_producer: dict[str, int] = {}
    kinds: dict[str, int] = {}
    nonce: str | None = None
    first = last = ""
    run_id: Any = None
    eval_results: dict[str, dict[str, Any]] = {}
    last_monotonic: dict[str, float] = {}
    for number, raw, event in iter_lines(stream):
        _check_fields(number, event)
        if event["seq"] != seq:
            raise ChainError("bad_sequence", number, f"seq is {event['seq']}, expected {seq}")
        producer = event["producer"]
        expected = per_producer.get(producer, 0)
        if event["producer_sequence"] != expected:
            got = event["producer_sequence"]
            raise ChainError("bad_sequence", number, f"{producer} producer_sequence is {got}, expected {expected}")
        if event["prev_hash"] != head:
            raise ChainError("broken_link", number, "prev_hash does not match the previous event's hash")
        if _body_hash(raw, event["hash"]) != event["hash"]:
            raise ChainError("bad_hash", number, "hash does not match the event's content")
        if producer in last_monotonic and event["monotonic"] < last_monotonic[producer]:
            raise ChainError("bad_time", number, f"{producer}'s monotonic time went backwards")
        if seq == 0:
            if producer != "trusted_harness" or event["kind"] != "run_started":
                raise ChainError("bad_first_event", number, "the first event must be trusted_harness run_started")
            nonce = event["data"].get("nonce")
            if nonce is not None and not isinstance(nonce, str):
                raise ChainError("bad_first_event", number, "nonce must be a string or null")
            first = event["wall_time"]
            run_id = event["data"].get("run_id")
        if producer == "trusted_evaluator" and event["kind"] == "eval_result":
            session = event["data"].get("session_id")
            if isinstance(session, str):
                eval_results[session] = event["data"]
        last_monotonic[producer] = event["monotonic"]
        head = event["hash"]
        seq += 1
        per_producer[producer] = per_producer.get(producer, 0) + 1
        kinds[event["kind"]] = kinds.get(event["kind"], 0) + 1
        last = event["wall_time"]
    if seq == 0:
        raise ChainError("empty", 0, "the trajectory has no events")
    if check_nonce and nonce != expected_nonce:
        raise ChainError("nonce_mismatch", 1, "the first event does not bind the challenge nonce")
    return ChainSummary(
        head, seq, nonce, per_producer, kinds, first, last, run_id if isinstance(run_id, str) else None, eval_results
    )
