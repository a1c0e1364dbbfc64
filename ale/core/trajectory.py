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
import operator
import re
from collections.abc import Iterator, Mapping
from typing import Any

import attrs
import orjson

from ale.core.canonical import (
    NON_BMP,
    ORJSON_EXPONENT_BAND,
    ORJSON_OPTIONS,
    CanonicalError,
    canonical_json,
    encode_prepared,
    floats_agree,
    parse_canonical,
    prepare,
)

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
        self.reason, self.line, self.detail = reason, line, message


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


def _strict_parse(raw: bytes, number: int) -> dict[str, Any]:
    """The reference path: parse strictly, re-encode with RFC 8785, compare; names the fault."""
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
    return event


def _parse_line(raw: bytes, number: int) -> dict[str, Any]:
    if len(raw) > MAX_LINE_BYTES:
        raise ChainError("line_too_long", number, f"line of {len(raw)} bytes exceeds {MAX_LINE_BYTES}")
    event = parse_canonical(raw)
    return event if type(event) is dict else _strict_parse(raw, number)


def _refuse_truncated(stream: bytes) -> None:
    if stream and not stream.endswith(b"\n"):
        raise ChainError("truncated", stream.count(b"\n") + 1, "the last line has no newline: truncated stream")


def iter_events(stream: bytes) -> Iterator[tuple[int, dict[str, Any]]]:
    """Parse lines strictly: each must be the canonical JSON of its own content."""
    _refuse_truncated(stream)
    for number, raw in enumerate(stream.split(b"\n")[:-1] if stream else [], start=1):
        yield number, _parse_line(raw, number)


def _fail(reason: str, number: int, message: str) -> None:
    raise ChainError(reason, number, message)


_VALID_KINDS: set[str] = set()  # kinds already seen to match _KIND (a cache: the regex is the rule)


def _check_fields(number: int, event: dict[str, Any], head: str = "") -> None:
    """Every member's presence and format. ``head`` is a hash already checked (a ``prev_hash``
    equal to it needs no second look); a ``hash`` of the right length is proven to be hex when it
    matches the SHA-256 of the body (:func:`_hash_fault` names it otherwise)."""
    if event.keys() != FIELDS:
        missing, extra = sorted(FIELDS - set(event)), sorted(set(event) - FIELDS)
        _fail("bad_fields", number, f"fields missing {missing} or unexpected {extra}")
    if event["schema"] != EVENT_SCHEMA:
        _fail("bad_schema", number, f"schema is not {EVENT_SCHEMA}")
    if type(event["seq"]) is not int or type(event["producer_sequence"]) is not int:
        _fail("bad_sequence", number, "seq and producer_sequence must be integers")
    producer = event["producer"]
    if type(producer) is not str or producer not in _PRODUCER_SET:
        _fail("bad_producer", number, f"unknown producer {producer!r}")
    kind = event["kind"]
    if type(kind) is not str or kind not in _VALID_KINDS:
        if not isinstance(kind, str) or not _KIND.fullmatch(kind):
            _fail("bad_kind", number, "kind is not a lowercase identifier")
        if len(_VALID_KINDS) < 4096:
            _VALID_KINDS.add(kind)
    wall = event["wall_time"]
    if type(wall) is not str or not _WALL_TIME.fullmatch(wall):
        _fail("bad_time", number, "wall_time is not RFC 3339 UTC with microseconds")
    mono = event["monotonic"]
    if type(mono) is not float and type(mono) is not int:
        _fail("bad_time", number, "monotonic is not a number")
    if type(event["data"]) is not dict:
        _fail("bad_data", number, "data is not an object")
    prev = event["prev_hash"]
    if prev != head and (type(prev) is not str or not _HEX64.fullmatch(prev)):
        _fail("bad_hash", number, "prev_hash is not 64 lowercase hex digits")
    digest = event["hash"]
    if type(digest) is not str or len(digest) != 64:
        _fail("bad_hash", number, "hash is not 64 lowercase hex digits")


def _hash_fault(number: int, digest: str) -> tuple[int, int, str, str]:
    if not _HEX64.fullmatch(digest):
        return (number, _RANK_HASH, "bad_hash", "hash is not 64 lowercase hex digits")
    return (number, _RANK_HASH, "bad_hash", "hash does not match the event's content")


# -- verification in two phases ------------------------------------------------------------------
#
# A stream is verified as chunks of consecutive lines, each checked on its own (possibly in another
# process), then linked in order. Within a line the checks run in a fixed order, ranked below; a
# chunk cannot check what depends on lines before it (the first line's prev_hash, and each
# producer's first producer_sequence and monotonic time in the chunk), so it reports those and
# the link phase checks them. The first fault is the one with the smallest (line, rank): exactly
# the fault a single pass over the whole stream reports, however the stream was cut.

_RANK_LINE, _RANK_SEQ, _RANK_PSEQ, _RANK_LINK, _RANK_HASH, _RANK_TIME, _RANK_FIRST = range(7)
_PRODUCER_SET = frozenset(PRODUCERS)
#: an event's members, in the order check_chunk unpacks them
_MEMBERS = operator.itemgetter(
    "schema", "seq", "producer", "producer_sequence", "wall_time", "monotonic", "kind", "data", "prev_hash", "hash"
)


@attrs.frozen
class ChunkReport:
    """What checking a chunk of lines found; plain data, so it can cross a process boundary.

    Line numbers are absolute when the chunk was given its ``first_line``; otherwise they count
    from 1 within the chunk and the link phase adds the lines before it.
    """

    first_line: int | None
    lines: int
    #: the first line's seq and prev_hash, once read (checked by the link phase against what precedes)
    first_seq: int | None
    first_prev_hash: str | None
    last_hash: str
    #: producer -> (line, producer_sequence, monotonic) of its first event in the chunk
    first_of: dict[str, tuple[int, int, float]]
    #: producer -> (events, last monotonic) in the chunk
    counts: dict[str, tuple[int, float]]
    kinds: dict[str, int]
    first_wall_time: str
    last_wall_time: str
    #: the run_started event's data, if the chunk holds line 1
    run_started: dict[str, Any] | None
    eval_results: dict[str, dict[str, Any]]
    #: the chunk's first fault: (line, rank, reason, message); lines after it were not checked
    fault: tuple[int, int, str, str] | None


def check_chunk(chunk: bytes, first_line: int | None = 1) -> ChunkReport:
    """Check consecutive complete lines (each ending in a newline) that start at ``first_line``,
    or somewhere not yet known (None: a chunk cut from a stream still being decompressed)."""
    if chunk and not chunk.endswith(b"\n"):
        raise ValueError("a chunk ends at a newline")
    ascii = chunk.isascii()
    first_of: dict[str, tuple[int, int, float]] = {}
    counts: dict[str, tuple[int, float]] = {}
    kinds: dict[str, int] = {}
    eval_results: dict[str, dict[str, Any]] = {}
    run_started: dict[str, Any] | None = None
    first_prev: str | None = None
    head = ""
    first_wall = last_wall = ""
    fault: tuple[int, int, str, str] | None = None
    number = 0 if first_line is None else first_line - 1
    first_seq: int | None = None
    checked = 0
    # This loop is the hot path of verification, so the common case is written out in it (locals,
    # no calls); whatever it cannot vouch for goes to the exact helpers, which name the fault.
    view, find, rfind, startswith = memoryview(chunk), chunk.find, chunk.rfind, chunk.startswith
    loads, dumps, orjson_errors = orjson.loads, orjson.dumps, (orjson.JSONDecodeError, orjson.JSONEncodeError)
    sha256, wall_time_ok, hex64 = hashlib.sha256, _WALL_TIME.fullmatch, _HEX64.fullmatch
    low, high = ORJSON_EXPONENT_BAND
    try:
        start, size = 0, len(chunk)
        while start < size:
            end = find(b"\n", start)
            number += 1
            if end - start > MAX_LINE_BYTES:
                raise ChainError("line_too_long", number, f"line of {end - start} bytes exceeds {MAX_LINE_BYTES}")
            # The line's form: ale.core.canonical.parse_canonical written out, its float walk narrowed.
            # Floats can only be in monotonic and data, as the field checks below prove for the rest.
            event: Any = None
            members: tuple[Any, ...] | None = None
            if ascii or not NON_BMP.search(chunk, start, end):
                try:
                    event = loads(view[start:end])
                    again = dumps(event, option=ORJSON_OPTIONS)
                except orjson_errors:
                    event = None
                else:
                    if len(again) != end - start or not startswith(again, start) or type(event) is not dict:
                        event = None
            if event is not None:
                if event.keys() == FIELDS:
                    members = _MEMBERS(event)
                    monotonic, data = members[5], members[7]
                else:
                    monotonic, data = event.get("monotonic"), event.get("data")
                if type(monotonic) is float and (monotonic.is_integer() or low <= abs(monotonic) < high):
                    event = None
                elif type(data) is dict:
                    for value in data.values():
                        if type(value) is not str:  # numbers or containers: the general walk
                            if not floats_agree((data,)):
                                event = None
                            break
                elif not floats_agree((data,)):
                    event = None
            if event is None:
                event = _strict_parse(chunk[start:end], number)
                members = _MEMBERS(event) if event.keys() == FIELDS else None
            # The members (what _check_fields checks, which names the fault when this cannot vouch).
            if members is None or not (
                members[0] == EVENT_SCHEMA
                and type(members[1]) is int
                and type(members[3]) is int
                and type(members[2]) is str
                and members[2] in _PRODUCER_SET
                and type(members[6]) is str
                and members[6] in _VALID_KINDS
                and type(members[4]) is str
                and wall_time_ok(members[4])
                and (type(members[5]) is float or type(members[5]) is int)
                and type(members[7]) is dict
                and type(members[8]) is str
                and (members[8] == head or hex64(members[8]))
                and type(members[9]) is str
                and len(members[9]) == 64
            ):
                try:
                    _check_fields(number, event, head)
                except ChainError:
                    _strict_parse(chunk[start:end], number)  # a line out of canonical form is named so first
                    raise
                members = _MEMBERS(event)
            _schema, seq, producer, sequence, wall, monotonic, kind, data, prev, digest = members
            if checked == 0 and first_line is None:
                first_seq = seq  # where the chunk sits is the link phase's to check
            elif seq != (number - 1 if first_seq is None else first_seq + checked):
                expected_seq = number - 1 if first_seq is None else first_seq + checked
                fault = (number, _RANK_SEQ, "bad_sequence", f"seq is {seq}, expected {expected_seq}")
                break
            seen = counts.get(producer)
            if seen is None:
                first_of[producer] = (number, sequence, monotonic)
            else:
                expected = first_of[producer][1] + seen[0]
                if sequence != expected:
                    message = f"{producer} producer_sequence is {sequence}, expected {expected}"
                    fault = (number, _RANK_PSEQ, "bad_sequence", message)
                    break
            if checked == 0:
                first_prev, first_wall = prev, wall
            elif prev != head:
                fault = (number, _RANK_LINK, "broken_link", "prev_hash does not match the previous event's hash")
                break
            # The hash: SHA-256 of the line without its hash member. In canonical key order "hash"
            # follows "data" and precedes "kind", and no member after it can hold the text searched
            # for, so its last occurrence is the member, and cutting it leaves the canonical body.
            cut = rfind(b'"hash":"', start, end)
            computed = ""
            if cut >= 0 and startswith(digest.encode(), cut + 8):
                body = sha256(view[start:cut])
                body.update(view[cut + 74 : end])  # '"hash":"' + 64 hex digits + '",'
                computed = body.hexdigest()
            if computed != digest:
                fault = _hash_fault(number, digest)
                break
            if seen is not None and monotonic < seen[1]:
                fault = (number, _RANK_TIME, "bad_time", f"{producer}'s monotonic time went backwards")
                break
            if number == 1 and first_line == 1:
                nonce = data.get("nonce")
                if producer != "trusted_harness" or kind != "run_started":
                    message = "the first event must be trusted_harness run_started"
                    fault = (number, _RANK_FIRST, "bad_first_event", message)
                    break
                if nonce is not None and not isinstance(nonce, str):
                    fault = (number, _RANK_FIRST, "bad_first_event", "nonce must be a string or null")
                    break
                run_started = data
            if kind == "eval_result" and producer == "trusted_evaluator":
                session = data.get("session_id")
                if isinstance(session, str):
                    eval_results[session] = data
            counts[producer] = (1 if seen is None else seen[0] + 1, monotonic)
            kinds[kind] = kinds.get(kind, 0) + 1
            head = digest
            last_wall = wall
            checked += 1
            start = end + 1
    except ChainError as exc:
        fault = (exc.line, _RANK_LINE, exc.reason, exc.detail)
    return ChunkReport(
        first_line, checked, first_seq, first_prev, head, first_of, counts, kinds, first_wall, last_wall, run_started,
        eval_results, fault,
    )  # fmt: skip


def split_chunks(stream: bytes, parts: int) -> list[tuple[bytes, int]]:
    """Cut a stream at newlines into at most ``parts`` chunks of similar size, with first line numbers."""
    _refuse_truncated(stream)
    chunks: list[tuple[bytes, int]] = []
    start, line = 0, 1
    for i in range(1, max(1, parts) + 1):
        target = len(stream) * i // max(1, parts)
        end = len(stream) if i == parts else stream.find(b"\n", max(start, target - 1)) + 1
        if end <= start:
            continue
        piece = stream[start:end]
        chunks.append((piece, line))
        if end < len(stream):  # the next chunk's first line (the last chunk has no next)
            line += piece.count(b"\n")
        start = end
    return chunks


def link_chunks(
    reports: list[ChunkReport], *, expected_nonce: str | None = None, check_nonce: bool = False
) -> ChainSummary:
    """Phase two: the checks that cross chunk borders, then the summary. Reports in stream order."""
    head, total = GENESIS, 0
    per_producer: dict[str, int] = {}
    last_monotonic: dict[str, float] = {}
    kinds: dict[str, int] = {}
    eval_results: dict[str, dict[str, Any]] = {}
    run_started: dict[str, Any] | None = None
    first = last = ""
    for report in reports:
        offset = 0
        if report.first_line is None:
            if total == 0 and (report.lines or report.fault):  # line 1 has checks of its own
                raise ValueError("the first chunk must be checked as starting at line 1")
            offset = total
        elif report.first_line != total + 1:
            raise ValueError("chunk reports are not consecutive")
        faults = [] if report.fault is None else [(report.fault[0] + offset, *report.fault[1:])]
        start = total + 1
        if report.first_line is None and report.first_seq is not None and report.first_seq != total:
            faults.append((start, _RANK_SEQ, "bad_sequence", f"seq is {report.first_seq}, expected {total}"))
        if report.first_prev_hash is not None and report.first_prev_hash != head:
            message = "prev_hash does not match the previous event's hash"
            faults.append((start, _RANK_LINK, "broken_link", message))
        for producer, (line, sequence, monotonic) in report.first_of.items():
            line += offset
            expected = per_producer.get(producer, 0)
            if sequence != expected:
                message = f"{producer} producer_sequence is {sequence}, expected {expected}"
                faults.append((line, _RANK_PSEQ, "bad_sequence", message))
            elif producer in last_monotonic and monotonic < last_monotonic[producer]:
                faults.append((line, _RANK_TIME, "bad_time", f"{producer}'s monotonic time went backwards"))
        if faults:
            line, _rank, reason, message = min(faults, key=lambda f: (f[0], f[1]))
            raise ChainError(reason, line, message)
        if report.lines:
            head = report.last_hash
            first = first or report.first_wall_time
            last = report.last_wall_time
        for producer, (count, monotonic) in report.counts.items():
            per_producer[producer] = per_producer.get(producer, 0) + count
            last_monotonic[producer] = monotonic
        for kind, count in report.kinds.items():
            kinds[kind] = kinds.get(kind, 0) + count
        eval_results.update(report.eval_results)
        if report.run_started is not None:
            run_started = report.run_started
        total += report.lines
    if total == 0:
        raise ChainError("empty", 0, "the trajectory has no events")
    nonce = run_started.get("nonce") if run_started is not None else None
    if check_nonce and nonce != expected_nonce:
        raise ChainError("nonce_mismatch", 1, "the first event does not bind the challenge nonce")
    run_id = run_started.get("run_id") if run_started is not None else None
    return ChainSummary(
        head, total, nonce, per_producer, kinds, first, last, run_id if isinstance(run_id, str) else None, eval_results
    )


def verify_chain(stream: bytes, *, expected_nonce: str | None = None, check_nonce: bool = False) -> ChainSummary:
    """Check every line, link and counter of a stream; return its summary or raise ChainError."""
    reports = [check_chunk(chunk, line) for chunk, line in split_chunks(stream, 1)]
    return link_chunks(reports, expected_nonce=expected_nonce, check_nonce=check_nonce)
