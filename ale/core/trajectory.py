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

import bisect
import collections
import datetime as _dt
import hashlib
import itertools
import math
import operator
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import attrs
import orjson

from ale.core import grammar
from ale.core import network as netstats
from ale.core.canonical import (
    NON_BMP,
    ORJSON_EXPONENT_BAND,
    ORJSON_OPTIONS,
    CanonicalError,
    canonical_json,
    parse_canonical,
    prepare,
)
from ale.core.parse import JsonLimitError, ParseError, parse_json

EVENT_SCHEMA = "ale-trajectory-event/v1"
GENESIS = "0" * 64
PRODUCERS = ("trusted_harness", "trusted_evaluator", "trusted_network_proxy", "untrusted_agent", "derived_verifier")
FIELDS = frozenset(
    {"schema", "seq", "producer", "producer_sequence", "wall_time", "monotonic", "kind", "data", "prev_hash", "hash"}
)
#: a wall time as the formats write it (RFC 3339 UTC, six fractional digits, a Z)
WALL_TIME = re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{6}Z$")
_KIND = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
MAX_LINE_BYTES = 1 << 20
#: containers nest at most this deep in a line (the event object is level 1, its data level 2)
MAX_LINE_DEPTH = 64
_YEAR_10000 = 253_402_300_800  # seconds since the epoch


class ChainError(ValueError):
    """A stream that is not a valid chain; ``reason`` is a stable code, ``line`` 1-based."""

    def __init__(self, reason: str, line: int, message: str) -> None:
        super().__init__(f"line {line}: {message}" if line else message)
        self.reason, self.line, self.detail = reason, line, message


def event_hash(event_without_hash: Mapping[str, Any]) -> str:
    return hashlib.sha256(canonical_json(dict(event_without_hash))).hexdigest()


_last_second: tuple[int, str] = (-1, "")  # the last whole second formatted, and its text


def format_wall_time(epoch_seconds: float) -> str:
    """RFC 3339 UTC with exactly six fractional digits, from seconds since the epoch."""
    global _last_second
    second, micros = divmod(round(epoch_seconds * 1_000_000), 1_000_000)
    cached = _last_second  # one tuple, replaced whole: consistent whichever thread reads it
    if cached[0] != second:
        moment = _dt.datetime(1970, 1, 1, tzinfo=_dt.UTC) + _dt.timedelta(seconds=second)
        cached = _last_second = (second, moment.strftime("%Y-%m-%dT%H:%M:%S"))
    return f"{cached[1]}.{micros:06d}Z"


def _number(value: Any) -> str | None:
    """A time's canonical JSON number where Python's and ECMAScript's shortest forms agree."""
    if type(value) is float:
        if value.is_integer():
            return str(int(value)) if abs(value) <= 2**53 - 1 else None
        return repr(value) if 1e-4 <= abs(value) < 1e16 else None
    if type(value) is int and abs(value) <= 2**53 - 1:
        return str(value)
    return None


def _tail(event: Mapping[str, Any], monotonic: str) -> bytes:
    """The members after ``hash`` in RFC 8785's order, their values the chain's own (no escaping needed)."""
    return (
        f'"kind":"{event["kind"]}","monotonic":{monotonic},"prev_hash":"{event["prev_hash"]}",'
        f'"producer":"{event["producer"]}","producer_sequence":{event["producer_sequence"]},'
        f'"schema":"{EVENT_SCHEMA}","seq":{event["seq"]},"wall_time":"{event["wall_time"]}"}}'
    ).encode()


def _assemble(data: bytes, tail: bytes) -> tuple[str, bytes]:
    digest = hashlib.sha256(b'{"data":' + data + b"," + tail).hexdigest()
    return digest, b'{"data":' + data + b',"hash":"' + digest.encode() + b'",' + tail + b"\n"


def _fast_line(event: dict[str, Any], prepared: Any | None) -> tuple[str, bytes] | None:
    """The event's hash and line, assembled member by member in RFC 8785's key order (data, hash,
    kind, monotonic, prev_hash, producer, producer_sequence, schema, seq, wall_time): only
    ``data`` is encoded as a whole, once, by orjson, when :func:`prepare` vouched for it
    (``prepared``: where orjson and RFC 8785 agree; see ale.core.canonical). The other members are the chain's own:
    identifiers, hex digests, counters and a formatted time, which need no escaping (build
    checked them). None: take the reference path."""
    monotonic = _number(event["monotonic"])
    if prepared is None or monotonic is None or event["schema"] != EVENT_SCHEMA:
        return None
    try:
        data = orjson.dumps(prepared, option=ORJSON_OPTIONS)
    except orjson.JSONEncodeError:  # a lone surrogate, an integer orjson refuses: the reference decides
        return None
    return _assemble(data, _tail(event, monotonic))


def _hash_and_line(event: dict[str, Any], prepared: Any | None = None) -> tuple[str, bytes]:
    """The event's hash and its JSONL line: the fast assembly (given ``data`` prepared), or the
    reference path."""
    fast = _fast_line(event, prepared)
    if fast is not None:
        return fast
    # The reference path: its numbers and strings are the unusual ones (an integral float past
    # 2**53 is written as an integer no verifier accepts, a lone surrogate has no form at all), so
    # the line is read back the way a verifier reads it.
    digest = event_hash(event)
    line = canonical_json({**event, "hash": digest})
    try:
        parse_line(line, 0)
    except ChainError as exc:
        raise ValueError(f"the event has no form a verifier reads back ({exc.reason}: {exc.detail})") from None
    return digest, line + b"\n"


@attrs.define
class ChainBuilder:
    """Builds events in order; the caller writes the returned lines. Not thread-safe by itself."""

    head: str = GENESIS
    seq: int = 0
    per_producer: dict[str, int] = attrs.Factory(dict)

    def build(
        self, producer: str, kind: str, data: Mapping[str, Any], *, wall_time: float, monotonic: float
    ) -> tuple[dict[str, Any], bytes]:
        """The next event and its line (canonical JSON plus newline), not yet taken: :meth:`commit`
        it, or drop it. Raises ValueError for an event no verifier would read back."""
        if producer not in PRODUCERS:
            raise ValueError(f"unknown producer {producer!r}")
        if type(kind) is not str or (kind not in _VALID_KINDS and not _kind_ok(kind)):
            raise ValueError(f"event kind {kind!r} is not a lowercase identifier")
        if not math.isfinite(monotonic):
            raise ValueError("monotonic time must be finite")
        if not 0 <= wall_time < _YEAR_10000:  # (false for NaN and the infinities too)
            raise ValueError(f"wall time {wall_time!r} is not a time between 1970 and 9999")
        prepared = prepare(data)
        event: dict[str, Any] = {
            "schema": EVENT_SCHEMA,
            "seq": self.seq,
            "producer": producer,
            "producer_sequence": self.per_producer.get(producer, 0),
            "wall_time": format_wall_time(wall_time),
            "monotonic": monotonic,
            "kind": kind,
            "data": dict(data) if prepared is None else prepared,  # prepared: a copy, as a verifier reads it
            "prev_hash": self.head,
        }
        event["hash"], line = _hash_and_line(event, prepared)
        if len(line) > MAX_LINE_BYTES:
            raise ValueError(f"event of {len(line)} bytes exceeds the line limit of {MAX_LINE_BYTES}")
        return event, line

    def adopt(self, line: bytes, event: Mapping[str, Any], *, monotonic: float) -> tuple[dict[str, Any], bytes]:
        """The next event of this chain made of an event of another, verified chain (``event``, parsed
        from its ``line``, without the newline): the same producer, kind, data and wall time, at
        ``monotonic``; not yet taken (:meth:`commit` it). The data's bytes are the line's own (a
        verified line is canonical); only the chain's members are new."""
        if not math.isfinite(monotonic):
            raise ValueError("monotonic time must be finite")
        producer = event["producer"]
        adopted: dict[str, Any] = {
            "schema": EVENT_SCHEMA,
            "seq": self.seq,
            "producer": producer,
            "producer_sequence": self.per_producer.get(producer, 0),
            "wall_time": event["wall_time"],
            "monotonic": monotonic,
            "kind": event["kind"],
            "data": event["data"],
            "prev_hash": self.head,
        }
        cut = line.rfind(b',"hash":"')
        number = _number(monotonic)
        if not line.startswith(b'{"data":') or cut < 0 or number is None:
            adopted["hash"], out = _hash_and_line(adopted)
            return adopted, out
        adopted["hash"], out = _assemble(line[8:cut], _tail(adopted, number))
        return adopted, out

    def commit(self, event: Mapping[str, Any]) -> None:
        """Take the event :meth:`build` returned last: the chain moves past it."""
        if event["seq"] != self.seq or event["prev_hash"] != self.head:
            raise ValueError("not the next event of this chain")
        self.head = event["hash"]
        self.seq += 1
        self.per_producer[event["producer"]] = event["producer_sequence"] + 1

    def append(
        self, producer: str, kind: str, data: Mapping[str, Any], *, wall_time: float, monotonic: float
    ) -> tuple[dict[str, Any], bytes]:
        """Make and take the next event; return it and its line."""
        event, line = self.build(producer, kind, data, wall_time=wall_time, monotonic=monotonic)
        self.commit(event)
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
    #: the network totals (every member of ale.core.network.FIELDS) and each gateway_started's upstreams
    network: dict[str, int] = attrs.Factory(lambda: dict.fromkeys(netstats.FIELDS, 0))
    gateways: tuple[Any, ...] = ()
    #: each task's ``task_finished`` ``ended`` (None where it has none), by task reference
    task_ends: dict[str, Any] = attrs.Factory(dict)


def parse_line(raw: bytes, number: int) -> dict[str, Any]:
    """The reference line parser: strictly (:func:`ale.core.parse.parse_json`), then the line must be
    the RFC 8785 form of what it holds. Names the fault; the fast path defers to it when in doubt."""
    if len(raw) > MAX_LINE_BYTES:
        raise ChainError("line_too_long", number, f"line of {len(raw)} bytes exceeds {MAX_LINE_BYTES}")
    try:
        event = parse_json(raw, what="event", max_bytes=MAX_LINE_BYTES, max_depth=MAX_LINE_DEPTH, unique_keys=False)
    except JsonLimitError:
        raise ChainError("too_deep", number, f"nested deeper than {MAX_LINE_DEPTH} levels") from None
    except ParseError as exc:  # not UTF-8, not JSON, or not I-JSON (NaN, a lone surrogate, a huge integer)
        raise ChainError("not_json", number, str(exc)) from None
    if type(event) is not dict:
        raise ChainError("not_json", number, "not a JSON object")
    try:
        canonical = canonical_json(event)
    except CanonicalError as exc:
        raise ChainError("not_canonical", number, str(exc)) from None
    if canonical != raw:
        raise ChainError("not_canonical", number, "the line is not in canonical JSON (RFC 8785) form")
    return event


def _parse_line(raw: bytes, number: int) -> dict[str, Any]:
    event = parse_canonical(raw) if len(raw) <= MAX_LINE_BYTES else None
    return event if type(event) is dict and _nested_agrees(event, 1) else parse_line(raw, number)


def _refuse_truncated(stream: bytes) -> None:
    if stream and not stream.endswith(b"\n"):
        raise ChainError("truncated", stream.count(b"\n") + 1, "the last line has no newline: truncated stream")


def iter_events(stream: bytes) -> Iterator[tuple[int, dict[str, Any]]]:
    """Parse lines strictly: each must be the canonical JSON of its own content."""
    _refuse_truncated(stream)
    for number, raw in enumerate(stream.split(b"\n")[:-1] if stream else [], start=1):
        yield number, _parse_line(raw, number)


# -- an event's members ---------------------------------------------------------------------------

_PRODUCER_SET = frozenset(PRODUCERS)
#: kinds known to match _KIND: the grammar's, and others once seen (a cache: the regex is the rule)
_VALID_KINDS: set[str] = {kind for kinds in grammar.KINDS.values() for kind in kinds}
#: an event's members, in the order check_chunk unpacks them
_MEMBER_NAMES = (
    "schema", "seq", "producer", "producer_sequence", "wall_time", "monotonic", "kind", "data", "prev_hash", "hash"
)  # fmt: skip
_MEMBERS = operator.itemgetter(*_MEMBER_NAMES)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:80] + "..."


def _kind_ok(kind: Any) -> bool:
    if type(kind) is str and kind in _VALID_KINDS:
        return True
    if not isinstance(kind, str) or not _KIND.fullmatch(kind):
        return False
    if len(_VALID_KINDS) < 4096:
        _VALID_KINDS.add(kind)
    return True


_INTEGERS = "seq and producer_sequence must be integers"
_HEX_DIGITS = "is not 64 lowercase hex digits"
#: (member, test of (value, the previous hash), reason, message of the value), in the order checked.
#: A prev_hash equal to the previous event's hash needs no second look (that hash was proven hex).
_MEMBER_RULES: tuple[tuple[str, Callable[[Any, str], bool], str, Callable[[Any], str]], ...] = (
    ("schema", lambda v, _: v == EVENT_SCHEMA, "bad_schema", lambda _: f"schema is not {EVENT_SCHEMA}"),
    ("seq", lambda v, _: type(v) is int, "bad_sequence", lambda _: _INTEGERS),
    ("producer_sequence", lambda v, _: type(v) is int, "bad_sequence", lambda _: _INTEGERS),
    ("producer", lambda v, _: type(v) is str and v in _PRODUCER_SET, "bad_producer",
     lambda v: f"unknown producer {_shown(v)}"),
    ("kind", lambda v, _: _kind_ok(v), "bad_kind", lambda _: "kind is not a lowercase identifier"),
    ("wall_time", lambda v, _: type(v) is str and WALL_TIME.fullmatch(v) is not None, "bad_time",
     lambda _: "wall_time is not RFC 3339 UTC with microseconds"),
    ("monotonic", lambda v, _: type(v) is float or type(v) is int, "bad_time", lambda _: "monotonic is not a number"),
    ("data", lambda v, _: type(v) is dict, "bad_data", lambda _: "data is not an object"),
    ("prev_hash", lambda v, head: v == head or (type(v) is str and _HEX64.fullmatch(v) is not None), "bad_hash",
     lambda _: f"prev_hash {_HEX_DIGITS}"),
    # only its length here: a hash that matches the SHA-256 of the body is hex (_hash_fault names it otherwise)
    ("hash", lambda v, _: type(v) is str and len(v) == 64, "bad_hash", lambda _: f"hash {_HEX_DIGITS}"),
)  # fmt: skip


def _check_fields(number: int, event: dict[str, Any], head: str = GENESIS) -> None:
    """Every member's presence and format; ``head`` is the previous event's hash, already checked."""
    if event.keys() != FIELDS:
        missing, extra = sorted(FIELDS - set(event)), sorted(set(event) - FIELDS)
        raise ChainError("bad_fields", number, f"fields missing {missing} or unexpected {_shown(extra)}")
    for member, test, reason, message in _MEMBER_RULES:
        value = event[member]
        if not test(value, head):
            raise ChainError(reason, number, message(value))


def _data_agrees(data: dict[str, Any]) -> bool:
    """True if orjson writes every float in an event's ``data`` as RFC 8785 does, and no container in
    it nests deeper than MAX_LINE_DEPTH; the fast path vouches for nothing else (ale.core.canonical
    explains the floats). Data of strings and integers only, the common case, needs no walk."""
    for value in data.values():
        kind = type(value)
        if kind is not str and kind is not int:
            return _nested_agrees(data, 2)
    return True


def _nested_agrees(value: Any, level: int) -> bool:
    """:func:`_data_agrees` for any value at ``level`` (the event itself is level 1)."""
    low, high = ORJSON_EXPONENT_BAND
    stack: list[tuple[Any, int]] = [(value, level)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_LINE_DEPTH:
            return False
        for child in item.values() if type(item) is dict else item:
            kind = type(child)
            if kind is dict or kind is list:
                stack.append((child, depth + 1))
            elif kind is float and (child.is_integer() or low <= abs(child) < high):
                return False
    return True


def _slow_members(raw: bytes, number: int, head: str) -> tuple[Any, ...]:
    """The members of a line the fast path could not vouch for, by the reference path (which names the fault)."""
    event = parse_line(raw, number)
    _check_fields(number, event, head)
    return _MEMBERS(event)  # type: ignore[no-any-return]


def _hash_fault(number: int, digest: str) -> tuple[int, int, str, str]:
    if not _HEX64.fullmatch(digest):
        return (number, _RANK_HASH, "bad_hash", f"hash {_HEX_DIGITS}")
    return (number, _RANK_HASH, "bad_hash", "hash does not match the event's content")


def _first_fault(producer: str, kind: str, data: dict[str, Any]) -> str | None:
    """What is wrong with the stream's first event, if anything."""
    if producer != "trusted_harness" or kind != "run_started":
        return "the first event must be trusted_harness run_started"
    nonce = data.get("nonce")
    if nonce is not None and not isinstance(nonce, str):
        return "nonce must be a string or null"
    return None


# -- verification in two phases ------------------------------------------------------------------
#
# A stream is verified as chunks of consecutive lines, each checked on its own (possibly in another
# process), then linked in order. Within a line the checks run in a fixed order, ranked below; a
# chunk cannot check what depends on lines before it (the first line's prev_hash, and each
# producer's first producer_sequence and monotonic time in the chunk), so it reports those and
# the link phase checks them. The first fault is the one with the smallest (line, rank): exactly
# the fault a single pass over the whole stream reports, however the stream was cut.
#
# The grammar (ale.core.grammar) is checked once the chain holds: each chunk lists its grammar
# tokens (line, rule code, key): every structural event, and each windowed rule's first event
# after a structural one; the link phase replays them in order. So a stream with a broken chain
# is refused for its chain (the first fault by line), one with an intact chain that breaks the
# grammar for the grammar's first fault, and only then is the nonce compared.

_RANK_LINE, _RANK_SEQ, _RANK_PSEQ, _RANK_LINK, _RANK_HASH, _RANK_TIME, _RANK_FIRST = range(7)
Fault = tuple[int, int, str, str]
Token = tuple[int, int, Any]


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
    fault: Fault | None
    #: the grammar's tokens, in order: (line, rule code, key)
    tokens: list[Token] = attrs.Factory(list)
    #: the network totals of the chunk's events (ale.core.network.tally), and its gateway_started upstreams
    network: dict[str, int] = attrs.Factory(dict)
    gateways: list[Any] = attrs.Factory(list)
    #: the ``ended`` of each task_finished in the chunk, by task
    task_ends: dict[str, Any] = attrs.Factory(dict)


def _chain_fault(
    number: int,
    seq: Any,
    expected_seq: int,
    producer: str,
    sequence: int,
    expected_sequence: int,
    linked: bool,
    digest: str,
    hashed: bool,
    first: str | None,
) -> Fault:
    """Which of a line's chain checks failed (the first in rank order); the monotonic check is last
    but one, so it is what is left when the others hold."""
    if seq != expected_seq:
        return (number, _RANK_SEQ, "bad_sequence", f"seq is {seq}, expected {expected_seq}")
    if sequence != expected_sequence:
        return (
            number,
            _RANK_PSEQ,
            "bad_sequence",
            f"{producer} producer_sequence is {sequence}, expected {expected_sequence}",
        )
    if not linked:
        return (number, _RANK_LINK, "broken_link", "prev_hash does not match the previous event's hash")
    if not hashed:
        return _hash_fault(number, digest)
    if first is None:
        return (number, _RANK_TIME, "bad_time", f"{producer}'s monotonic time went backwards")
    return (number, _RANK_FIRST, "bad_first_event", first)


class _Scan:
    """:func:`check_chunk`'s state: what the lines checked so far established."""

    def __init__(self, first_line: int | None) -> None:
        self.first_line = first_line
        self.checked = 0
        self.first_seq: int | None = None
        self.first_prev: str | None = None
        self.head = GENESIS
        self.first_wall = self.last_wall = ""
        self.first_of: dict[str, tuple[int, int, float]] = {}
        self.counts: dict[str, tuple[int, float]] = {}
        self.kinds: dict[str, int] = {}
        self.eval_results: dict[str, dict[str, Any]] = {}
        self.run_started: dict[str, Any] | None = None
        self.tokens: list[Token] = []
        self.fault: Fault | None = None
        self.network: dict[str, int] = {}
        self.gateways: list[Any] = []
        self.task_ends: dict[str, Any] = {}

    def report(self) -> ChunkReport:
        return ChunkReport(
            self.first_line, self.checked, self.first_seq, self.first_prev, self.head, self.first_of, self.counts,
            self.kinds, self.first_wall, self.last_wall, self.run_started, self.eval_results, self.fault, self.tokens,
            self.network, self.gateways, self.task_ends,
        )  # fmt: skip

    def _tally(self, producer: str, kind: str, data: dict[str, Any]) -> None:
        """A network event: its share of the totals (ale.core.network), a gateway's upstreams."""
        if kind == "gateway_started" and netstats.agents(producer, data):
            self.gateways.append(data.get("upstreams"))
        netstats.add(self.network, netstats.event_totals(producer, kind, data))

    def lines(self, chunk: bytes) -> None:  # noqa: C901 - the verifier hot loop; tests/trajectory_reference.py beside it
        """Check every line of ``chunk``; stop at the first fault (recorded, or raised as ChainError)."""
        # This loop is the hot path of verification, so the common case is written out in it (locals,
        # one boolean expression per step); whatever it cannot vouch for goes to the exact helpers,
        # which name the fault.
        view, find, rfind, startswith = memoryview(chunk), chunk.find, chunk.rfind, chunk.startswith
        loads, dumps, orjson_errors = orjson.loads, orjson.dumps, (orjson.JSONDecodeError, orjson.JSONEncodeError)
        sha256, wall_time_ok, hex64, non_bmp = hashlib.sha256, WALL_TIME.fullmatch, _HEX64.fullmatch, NON_BMP.search
        low, high = ORJSON_EXPONENT_BAND
        bits, structural, tallied = grammar.BITS, self._structural, netstats.TALLIED
        first_line, first_of, counts, kinds, tokens = (
            self.first_line,
            self.first_of,
            self.counts,
            self.kinds,
            self.tokens,
        )
        number, checked, head, first_seq = 0 if first_line is None else first_line - 1, 0, GENESIS, 0
        whole_ascii, window, again, wall = chunk.isascii(), 0, b"", ""
        first_event = 1 if first_line == 1 else 0  # the line number of the stream's first event, if here
        start, size = 0, len(chunk)
        while start < size:
            end = find(b"\n", start)
            number += 1
            # The line's form: ale.core.canonical.parse_canonical written out, its float walk narrowed
            # to monotonic and data (the member checks below prove the rest holds none).
            event: Any = None
            if end - start <= MAX_LINE_BYTES and (whole_ascii or not non_bmp(chunk, start, end)):
                try:
                    event = loads(view[start:end])
                    again = dumps(event, option=ORJSON_OPTIONS)
                except orjson_errors:
                    event = None
            members = (
                _MEMBERS(event)
                if type(event) is dict
                and event.keys() == FIELDS
                and len(again) == end - start
                and startswith(again, start)
                else None
            )
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
                and (type(members[5]) is int or (type(members[5]) is float and not (
                    members[5].is_integer() or low <= abs(members[5]) < high)))
                and type(members[7]) is dict
                and type(members[8]) is str
                and (members[8] == head or hex64(members[8]))
                and type(members[9]) is str
                and len(members[9]) == 64
                and _data_agrees(members[7])
            ):  # fmt: skip
                members = _slow_members(chunk[start:end], number, head)
            _schema, seq, producer, sequence, wall, monotonic, kind, data, prev, digest = members
            seen = counts.get(producer)
            # The hash: SHA-256 of the line without its hash member. In canonical key order "hash"
            # follows "data" and precedes "kind", and no member after it can hold the text searched
            # for, so its last occurrence is the member, and cutting it leaves the canonical body.
            cut = rfind(b'"hash":"', start, end)
            body = sha256(view[start:cut])
            body.update(view[cut + 74 : end])  # '"hash":"' + 64 hex digits + '",'
            expected_seq = number - 1 if first_line is not None else seq if checked == 0 else first_seq + checked
            expected_sequence = sequence if seen is None else first_of[producer][1] + seen[0]
            linked = checked == 0 or prev == head
            hashed = cut >= 0 and startswith(digest.encode(), cut + 8) and body.hexdigest() == digest
            first = _first_fault(producer, kind, data) if number == first_event else None
            # What the link phase checks against the chunks before (recorded even for a line that
            # fails a later check here: the link phase's fault may rank before it).
            if checked == 0:
                self._first(number, seq, prev, wall, data)
                first_seq = seq
            if seen is None:
                first_of[producer] = (number, sequence, monotonic)
            if not (
                seq == expected_seq
                and sequence == expected_sequence
                and linked
                and hashed
                and (seen is None or monotonic >= seen[1])
                and first is None
            ):
                self.fault = _chain_fault(
                    number, seq, expected_seq, producer, sequence, expected_sequence, linked, digest, hashed, first
                )
                break
            counts[producer] = (1 if seen is None else seen[0] + 1, monotonic)
            kinds[kind] = kinds.get(kind, 0) + 1
            if kind in tallied:
                self._tally(producer, kind, data)
            # The grammar's token: every structural event, each windowed rule's first since one.
            bit = bits[producer].get(kind, 0)
            if not bit:
                structural(number, producer, kind, data)
                window = 0
            elif not window & bit:
                window |= bit
                tokens.append((number, bit.bit_length() - 1, None))  # (bit = 1 << code)
            head = digest
            checked += 1
            start = end + 1
        self.head, self.checked = head, checked
        if checked:
            self.last_wall = wall

    def bulk(self, chunk: bytes) -> bool:
        """Vouch for every line of ``chunk`` at once (see "the bulk path" below) and take them in, as
        :meth:`lines` would; False (nothing proven) on any doubt. Only on a fresh scan."""
        try:
            return self._bulk(chunk)
        except Exception:  # any doubt: the exact loop decides, and names the fault
            return False

    def _bulk(self, chunk: bytes) -> bool:
        # A batch of lines at a time, about _BULK_BYTES: each C-level pass over a batch finds it
        # still in the cache (a whole chunk at a time is slower than the exact loop: memory-bound).
        window, kinds, start, size = 0, collections.Counter[str](), 0, len(chunk)
        while start < size:
            # (long lines: each pass's own cost is spread over at least _BULK_LINES lines, as many
            # as the batch's first line says; bytes.count would cost as much as a pass)
            first = chunk.find(b"\n", start) + 1 - start
            end = chunk.find(b"\n", start + max(_BULK_BYTES, first * _BULK_LINES) - 1) + 1 or size
            batch = self._bulk_batch(chunk[start:end], window, kinds)
            if batch is None:
                return False
            window, start = batch, end
        self.kinds = dict(kinds)
        return True

    def _bulk_batch(self, piece: bytes, window: int, kinds: collections.Counter[str]) -> int | None:
        """Vouch for a batch of lines that follows what the scan checked so far, and take it in;
        the grammar's window after it, or None."""
        if _native_scan is not None:
            scanned = _native_scan(piece)
            if scanned is not None:  # every line of the plainest form (ale/core/_eventscan.c)
                return self._bulk_scanned(piece, scanned, window, kinds)
        events = _bulk_events(piece)
        if events is None:
            return None
        columns = _bulk_columns(events)
        base = (1 if self.first_line is None else self.first_line) + self.checked
        if not (
            _bulk_members(columns)
            and self._bulk_follows(columns)
            and _bulk_hashed(piece, columns[9])
            and _bulk_producers(base, columns, self.first_of, self.counts)
        ):
            return None
        return self._bulk_take(base, columns, window, kinds)

    def _bulk_scanned(
        self, piece: bytes, scanned: tuple[Any, ...], window: int, kinds: collections.Counter[str]
    ) -> int | None:
        """:meth:`_bulk_batch` for a batch ale.core._eventscan vouched for: it checked each line's
        form, members, types and hash, the links and seq within the batch; what is left is what
        the batch is checked against (the lines before it), the producers and kinds by name, and
        taking it in."""
        count, seq0, prev0, head, wall0, wall_last, producer, sequence, monotonic, kind, spans = scanned
        data = _Spans(piece, spans)
        if not (_PRODUCER_SET.issuperset(producer) and _VALID_KINDS.issuperset(kind)):
            return None
        first = self.checked == 0
        if seq0 != self._seq_start(seq0):
            return None
        if not first:
            if prev0 != self.head:
                return None
        elif self.first_line == 1 and _first_fault(producer[0], kind[0], data[0]) is not None:
            return None  # (a first prev_hash is 64 hex digits: GENESIS, or the first of a later part)
        base = (1 if self.first_line is None else self.first_line) + self.checked
        columns = [[], [], producer, sequence, [], monotonic]  # what _bulk_producers reads
        if not _bulk_producers(base, columns, self.first_of, self.counts):
            return None
        return self._take(base, count, (seq0, prev0, wall0), (head, wall_last), producer, kind, data, window, kinds)

    def _seq_start(self, first_seq: int) -> int:
        """The seq the next batch must start at (``first_seq``: its first line's)."""
        if self.first_line is not None:
            return self.first_line - 1 + self.checked
        # a chunk whose place is not yet known: its first seq, and on by one from there
        return first_seq if self.checked == 0 else (self.first_seq or 0) + self.checked

    def _bulk_follows(self, columns: list[list[Any]]) -> bool:
        """seq counts on, each prev_hash is the hash before it, and the stream's first event is right."""
        seq, producer, kind, data, prev, digest = (columns[i] for i in (1, 2, 6, 7, 8, 9))
        first = self.checked == 0
        start = self._seq_start(seq[0])
        if seq != list(range(start, start + len(seq))) or prev[1:] != digest[:-1]:
            return False
        if not first:
            return bool(prev[0] == self.head)
        if self.first_line == 1 and _first_fault(producer[0], kind[0], data[0]) is not None:
            return False
        return bool(prev[0] == GENESIS or _HEX64.fullmatch(prev[0]))

    def _bulk_take(self, base: int, columns: list[list[Any]], window: int, kinds: collections.Counter[str]) -> int:
        """Take a vouched-for batch in, as the exact loop does; the grammar's window after it."""
        seq, producer, wall, kind, data, prev, digest = (columns[i] for i in (1, 2, 4, 6, 7, 8, 9))
        first, last = (seq[0], prev[0], wall[0]), (digest[-1], wall[-1])
        return self._take(base, len(seq), first, last, producer, kind, data, window, kinds)

    def _take(
        self,
        base: int,
        count: int,
        first: tuple[int, str, str],
        last: tuple[str, str],
        producer: list[str],
        kind: list[str],
        data: Sequence[dict[str, Any]] | _Spans,
        window: int,
        kinds: collections.Counter[str],
    ) -> int:
        """:meth:`_bulk_take` of ``count`` lines: the first's seq, prev_hash and wall time, the
        last's hash and wall time, and each line's producer, kind and data."""
        if self.checked == 0:
            self._first(base, *first, data[0])
        kinds.update(kind)
        for index in itertools.compress(itertools.count(), map(netstats.TALLIED.__contains__, kind)):
            self._tally(producer[index], kind[index], data[index])
        bits = list(map(dict.get, map(_BITS.__getitem__, producer), kind, itertools.repeat(0)))
        structural, windowed, window = _bulk_window(base, bits, window)
        before = len(self.tokens)
        for index in structural:
            self._structural(base + index, producer[index], kind[index], data[index])
        if windowed:
            self.tokens[before:] = sorted(self.tokens[before:] + windowed, key=operator.itemgetter(0))
        self.head, self.last_wall = last
        self.checked += count
        return window

    def _first(self, number: int, seq: int, prev: str, wall: str, data: dict[str, Any]) -> None:
        """The chunk's first line: what the link phase checks against the chunks before it."""
        self.first_seq = seq if self.first_line is None else None
        self.first_prev, self.first_wall = prev, wall
        if number == 1 and self.first_line == 1:
            self.run_started = data

    def _structural(self, number: int, producer: str, kind: str, data: dict[str, Any]) -> None:
        code, key = grammar.classify(producer, kind, data)
        if code == _EVAL_RESULT:
            session = data.get("session_id")
            if isinstance(session, str):
                self.eval_results[session] = data
        elif code == _TASK_FINISHED and type(key) is str:
            self.task_ends[key] = data.get("ended")
        self.tokens.append((number, code, key))


_EVAL_RESULT = grammar.CODES["trusted_evaluator"]["eval_result"]
_TASK_FINISHED = grammar.CODES["trusted_harness"]["task_finished"]


# -- the bulk path ---------------------------------------------------------------------------------
#
# "Vouch in bulk, name faults exactly." _Scan.lines checks a line at a time and names the first
# fault; most chunks have none, and for them the bulk path below proves the very same checks with
# a few C-level calls over a batch of lines at a time (one orjson.dumps of the batch's events,
# whole-column type and set tests, one SHA-256 map), the state carried from batch to batch as the
# exact loop carries it from line to line. It only vouches: on any doubt (a check false, an exception) it
# gives up and the exact loop checks the chunk from scratch, so a faulty chunk's fault is always
# the exact loop's. A chunk it vouches for gets the report the exact loop gives (field by field;
# tests/test_trajectory_bulk.py holds both, and tests/trajectory_reference.py, to it).
#
# The canonical form: the batch is parsed ONCE, as the JSON array "[" + its lines joined by ","
# + "]" (each newline but the last made a comma), and each of the values is written back in its
# canonical form (orjson.dumps); the forms joined by newlines, plus the last newline, must be the
# batch, byte for byte. orjson writes no raw newline (control characters in strings are escaped),
# so the batch's lines are then exactly the forms, one each: line i is the canonical JSON of value
# i, and so parses alone to it (a form parses back to its value). Whatever else the batch is (a
# value across two lines, two on one, whitespace, an empty line) either fails to parse as the
# array (orjson.loads raises: the exact loop decides) or writes back otherwise (None).

_HASH_KEY = b'"hash":"'
#: the bulk path's batch: about this many bytes of lines (a few dozen), small enough to stay in the cache
_BULK_BYTES = 128 * 1024
#: ... and of about this many lines at least (a batch's few dozen C-level passes each cost their own
#: microsecond or two, whatever the batch: over 90 lines of 1.4 KB that is 0.5 us a line)
_BULK_LINES = 180
_WALL_TIME_LENGTH = len("2026-11-30T04:28:38.123456Z")
#: a wall time with each (ASCII) digit written as 0: WALL_TIME's form, so that a string of
#: _WALL_TIME_LENGTH characters matches WALL_TIME exactly when _DIGITS_TO_ZERO makes it this
_WALL_TIME_FORM = "0000-00-00T00:00:00.000000Z"
_DIGITS_TO_ZERO = str.maketrans("0123456789", "0" * 10)
_SHA256_DIGEST = type(hashlib.sha256()).digest
_FIRST, _MIDDLE, _LAST = operator.itemgetter(0), operator.itemgetter(1), operator.itemgetter(2)
_PAST_HASH = slice(64 + 2, None)  # the hash's digits and '",'
#: grammar.BITS as plain dicts (looked up by map over the columns)
_BITS: dict[str, dict[str, int]] = {producer: dict(kinds) for producer, kinds in grammar.BITS.items()}
_INT_OR_STR = frozenset({int, str})
_TIME_TYPES = frozenset({int, float})
_FLOAT_TYPE = frozenset({float})


class _Spans:
    """The data of a batch ale.core._eventscan vouched for, each parsed when read (the bulk path
    reads the data of a few lines only: the first, the structural ones and those it tallies)."""

    __slots__ = ("offsets", "piece")

    def __init__(self, piece: bytes, spans: bytes) -> None:
        self.piece = piece
        self.offsets = memoryview(spans).cast("I")  # (start, end) of each line's data

    def __getitem__(self, index: int) -> Any:
        if not 0 <= index < len(self.offsets) // 2:
            raise IndexError(index)
        return orjson.loads(self.piece[self.offsets[2 * index] : self.offsets[2 * index + 1]])

    def __len__(self) -> int:
        return len(self.offsets) // 2


def _native_scanner() -> Callable[[bytes], tuple[Any, ...] | None] | None:
    """ale.core._eventscan's scan, or None where it was not built."""
    try:
        from ale.core import _eventscan  # type: ignore[attr-defined]  # (a C module, built when it can be)
    except ImportError:
        return None
    native: Callable[[bytes], tuple[Any, ...] | None] = _eventscan.scan
    return native


#: the one-pass scan of plain lines (ale/core/_eventscan.c), or None: the bulk path's passes alone
_native_scan = _native_scanner()
EVENTSCAN = "native" if _native_scan is not None else "python"


def _bulk_events(chunk: bytes) -> list[Any] | None:
    """The chunk's events if every line is provably the canonical JSON of an object with exactly
    the event's members (the exact loop's form checks), else None. (See above.)"""
    if not chunk.isascii() and NON_BMP.search(chunk):  # key order may differ from UTF-16's
        return None
    events: list[Any] = orjson.loads(b"[" + chunk[:-1].replace(b"\n", b",") + b"]")  # raises: the exact loop decides
    if set(map(type, events)) != {dict} or set(map(len, events)) != {len(FIELDS)}:
        return None  # (of len(FIELDS) members each: exactly FIELDS once each is found, by _bulk_columns)
    lines = list(map(orjson.dumps, events, itertools.repeat(None), itertools.repeat(ORJSON_OPTIONS)))
    if b"\n".join(lines) + b"\n" != chunk or max(map(len, lines)) > MAX_LINE_BYTES:
        return None
    return events


def _bulk_columns(events: list[dict[str, Any]]) -> list[list[Any]]:
    """The events' members, a list per member in _MEMBER_NAMES's order; KeyError if one lacks a member
    (with len(FIELDS) members each, as _bulk_events checked, every event's keys are then FIELDS)."""
    return list(map(list, zip(*map(_MEMBERS, events), strict=True)))


def _bulk_times(monotonic: Sequence[Any]) -> bool:
    """Every monotonic time an integer, or a float orjson writes as RFC 8785 does (not integral,
    outside ORJSON_EXPONENT_BAND): the exact loop's test, over the column."""
    types = set(map(type, monotonic))
    if not types <= _TIME_TYPES:
        return False
    if float not in types:
        return True
    floats = monotonic if types == _FLOAT_TYPE else [value for value in monotonic if type(value) is float]
    if any(map(float.is_integer, floats)):
        return False
    low, high = ORJSON_EXPONENT_BAND
    if min(map(abs, floats)) >= high:  # (the common case: no magnitude reaches down to the band)
        return True
    magnitudes = sorted(map(abs, floats))
    at = bisect.bisect_left(magnitudes, low)  # the smallest magnitude >= low must be >= high
    return at == len(magnitudes) or magnitudes[at] >= high


def _bulk_data(datas: Sequence[dict[str, Any]]) -> bool:
    """:func:`_data_agrees` for every event's data (no walk where every value is a string or an integer)."""
    if _INT_OR_STR.issuperset(map(type, itertools.chain.from_iterable(map(dict.values, datas)))):
        return True
    return all(map(_data_agrees, datas))


def _bulk_members(columns: list[list[Any]]) -> bool:
    """The exact loop's member checks (what _check_fields checks), a column at a time. The hashes
    are left to :func:`_bulk_hashed`: one equal to the SHA-256 hex digest of its line's body is 64
    lowercase hex digits, and so is each later prev_hash, which must equal the hash before it."""
    schema, seq, producer, sequence, wall, monotonic, kind, data, prev, digest = columns
    return bool(
        set(schema) == {EVENT_SCHEMA}
        and set(map(type, seq)) == {int}
        and set(map(type, sequence)) == {int}
        and set(map(type, producer)) == {str}
        and _PRODUCER_SET.issuperset(producer)
        and set(map(type, kind)) == {str}
        and _VALID_KINDS.issuperset(kind)  # a kind not yet seen: the exact loop checks (and caches) it
        and set(map(type, wall)) == {str}
        and set(map(len, wall)) == {_WALL_TIME_LENGTH}
        and "".join(wall).translate(_DIGITS_TO_ZERO) == _WALL_TIME_FORM * len(wall)  # each one is a time
        and _bulk_times(monotonic)
        and set(map(type, data)) == {dict}
        and _bulk_data(data)
        and set(map(type, prev)) == {str}
        and (prev[0] == GENESIS or _HEX64.fullmatch(prev[0]))
        and set(map(type, digest)) == {str}
    )


def _bulk_hashed(chunk: bytes, digest: list[str]) -> bool:
    """Every line's hash is the SHA-256 of the line without its hash member, cut where the exact
    loop cuts it: at the last '"hash":"', 8 + 64 + 2 bytes ('"hash":"', the digits, '",') left out
    (:func:`body_digests`). The exact loop also checks that the 64 bytes after that '"hash":"' are
    the hash; that holds here by what is already proven: the line is the canonical form of an
    object of exactly the event's members, whose "hash" (64 hex digits once it equals a hex digest)
    RFC 8785's key order writes right after "data", and no member after it can hold '"hash":"':
    they are all strings and numbers (their types were checked), and an encoded string writes each
    quote as '\\"'."""
    digests = body_digests(chunk)
    # pieces of 64 characters each: the joins are equal if and only if each hash is its digest's hex
    return digests is not None and set(map(len, digest)) == {64} and digests.hex() == "".join(digest)


def body_digests_reference(chunk: bytes) -> bytes | None:
    """The SHA-256 digests (32 bytes each, in order) of the chunk's lines (each ending in a
    newline: else ValueError), each line without its last '"hash":"' and the 66 bytes after it
    (its 64 digits and '",'; fewer where the line ends sooner); None if a line has no '"hash":"'.
    ale.core._linehash (C, optional) computes the same; tests/test_linehash.py holds the two together."""
    if chunk and not chunk.endswith(b"\n"):
        raise ValueError("the buffer's last line does not end in a newline")
    # (head, '"hash":"', rest) at the last '"hash":"'; the body is head and rest past its 64 + 2 bytes
    parts = list(map(bytes.rpartition, chunk[:-1].split(b"\n") if chunk else (), itertools.repeat(_HASH_KEY)))
    if parts and set(map(_MIDDLE, parts)) != {_HASH_KEY}:  # (b"" where a line has none)
        return None
    tails = map(operator.getitem, map(_LAST, parts), itertools.repeat(_PAST_HASH))
    return b"".join(map(_SHA256_DIGEST, map(hashlib.sha256, map(operator.add, map(_FIRST, parts), tails))))


def _native_body_digests() -> Callable[[bytes], bytes | None] | None:
    """ale.core._linehash's body_digests, or None where it was not built."""
    try:
        from ale.core import _linehash  # type: ignore[attr-defined]  # (a C module, built when it can be)
    except ImportError:
        return None
    native: Callable[[bytes], bytes | None] = _linehash.body_digests
    return native


#: :func:`body_digests_reference`, in C where ale.core._linehash was built (one call a batch, without
#: the GIL while it hashes); LINEHASH names which
body_digests: Callable[[bytes], bytes | None] = _native_body_digests() or body_digests_reference
LINEHASH = "native" if body_digests is not body_digests_reference else "python"


def _bulk_producers(
    base: int,
    columns: list[list[Any]],
    first_of: dict[str, tuple[int, int, float]],
    counts: dict[str, tuple[int, float]],
) -> bool:
    """Take a batch's events into each producer's first_of and counts, as the exact loop does,
    if its producer_sequence goes on by one from before (or from its first in the chunk) and its
    monotonic time never goes backwards; else False."""
    producer, sequence, monotonic = columns[2], columns[3], columns[5]
    order = dict.fromkeys(producer)  # in the order of their first events, as the exact loop adds them
    for name in order:
        if len(order) == 1:
            sequences, times = sequence, monotonic
        else:
            mine = list(map(name.__eq__, producer))
            sequences, times = list(itertools.compress(sequence, mine)), list(itertools.compress(monotonic, mine))
        seen = counts.get(name)
        expected = sequences[0] if seen is None else first_of[name][1] + seen[0]
        if sequences != list(range(expected, expected + len(sequences))):
            return False
        after = times if seen is None else [seen[1], *times]
        if not all(map(operator.ge, itertools.islice(after, 1, None), after)):
            return False
        if seen is None:
            first_of[name] = (base + producer.index(name), sequences[0], times[0])
        counts[name] = (len(sequences) + (0 if seen is None else seen[0]), times[-1])
    return True


def _bulk_window(base: int, bits: list[int], window: int) -> tuple[list[int], list[Token], int]:
    """The structural lines (index in the batch), the windowed rules' tokens (each windowed rule's
    first event after a structural one, or the chunk's start) and the window after the batch, as
    the exact loop finds them."""
    structural: list[int] = []
    tokens: list[Token] = []
    if 0 not in bits:  # no structural line: each rule's first event in the batch, in order, unless windowed
        for bit in dict.fromkeys(bits):
            if not window & bit:
                window |= bit
                tokens.append((base + bits.index(bit), bit.bit_length() - 1, None))
        return structural, tokens, window
    for index, bit in enumerate(bits):
        if not bit:
            structural.append(index)
            window = 0
        elif not window & bit:
            window |= bit
            tokens.append((base + index, bit.bit_length() - 1, None))
    return structural, tokens, window


def check_chunk(chunk: bytes, first_line: int | None = 1, *, bulk: bool = True) -> ChunkReport:
    """Check consecutive complete lines (each ending in a newline) that start at ``first_line``,
    or somewhere not yet known (None: a chunk cut from a stream still being decompressed).
    The bulk path vouches for a chunk without a fault; the exact loop (``bulk=False``: it alone)
    checks any other and names its first fault. The report is the same either way."""
    if chunk and not chunk.endswith(b"\n"):
        raise ValueError("a chunk ends at a newline")
    scan = _Scan(first_line)
    if bulk and chunk and scan.bulk(chunk):
        return scan.report()
    scan = _Scan(first_line)  # (afresh: whatever the bulk path began)
    try:
        scan.lines(chunk)
    except ChainError as exc:
        scan.fault = (exc.line, _RANK_LINE, exc.reason, exc.detail)
    return scan.report()


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


class _Linker:
    """:func:`link_chunks`'s state: the chain up to the end of the reports added so far."""

    def __init__(self) -> None:
        self.head, self.total = GENESIS, 0
        self.per_producer: dict[str, int] = {}
        self.last_monotonic: dict[str, float] = {}
        self.kinds: dict[str, int] = {}
        self.eval_results: dict[str, dict[str, Any]] = {}
        self.run_started: dict[str, Any] | None = None
        self.first = self.last = ""
        self.tokens: list[Token] = []
        self.network = dict.fromkeys(netstats.FIELDS, 0)
        self.gateways: list[Any] = []
        self.task_ends: dict[str, Any] = {}

    def add(self, report: ChunkReport) -> None:
        """Check the report against what precedes it (raising the first fault), then take it in."""
        offset = self._offset(report)
        faults = [] if report.fault is None else [(report.fault[0] + offset, *report.fault[1:])]
        faults += self._border_faults(report, offset)
        if faults:
            line, _rank, reason, message = min(faults, key=lambda f: (f[0], f[1]))
            raise ChainError(reason, line, message)
        if report.lines:
            self.head = report.last_hash
            self.first = self.first or report.first_wall_time
            self.last = report.last_wall_time
        for producer, (count, monotonic) in report.counts.items():
            self.per_producer[producer] = self.per_producer.get(producer, 0) + count
            self.last_monotonic[producer] = monotonic
        for kind, count in report.kinds.items():
            self.kinds[kind] = self.kinds.get(kind, 0) + count
        self.eval_results.update(report.eval_results)
        self.task_ends.update(report.task_ends)
        netstats.add(self.network, report.network)
        self.gateways += report.gateways
        self.run_started = report.run_started if report.run_started is not None else self.run_started
        self.tokens += [(line + offset, code, key) for line, code, key in report.tokens] if offset else report.tokens
        self.total += report.lines

    def _offset(self, report: ChunkReport) -> int:
        if report.first_line is not None:
            if report.first_line != self.total + 1:
                raise ValueError("chunk reports are not consecutive")
            return 0
        if self.total == 0 and (report.lines or report.fault):  # line 1 has checks of its own
            raise ValueError("the first chunk must be checked as starting at line 1")
        return self.total

    def _border_faults(self, report: ChunkReport, offset: int) -> list[Fault]:
        """The checks a chunk could not make on its own: its first line's seq and prev_hash, and
        each producer's first producer_sequence and monotonic time in it."""
        faults: list[Fault] = []
        start = self.total + 1
        if report.first_line is None and report.first_seq is not None and report.first_seq != self.total:
            faults.append((start, _RANK_SEQ, "bad_sequence", f"seq is {report.first_seq}, expected {self.total}"))
        if report.first_prev_hash is not None and report.first_prev_hash != self.head:
            faults.append((start, _RANK_LINK, "broken_link", "prev_hash does not match the previous event's hash"))
        for producer, (line, sequence, monotonic) in report.first_of.items():
            expected = self.per_producer.get(producer, 0)
            if sequence != expected:
                message = f"{producer} producer_sequence is {sequence}, expected {expected}"
                faults.append((line + offset, _RANK_PSEQ, "bad_sequence", message))
            elif producer in self.last_monotonic and monotonic < self.last_monotonic[producer]:
                faults.append((line + offset, _RANK_TIME, "bad_time", f"{producer}'s monotonic time went backwards"))
        return faults

    def summary(
        self, *, expected_nonce: str | None, check_nonce: bool, check_grammar: bool, incomplete: bool
    ) -> ChainSummary:
        if self.total == 0:
            raise ChainError("empty", 0, "the trajectory has no events")
        if check_grammar:
            fault = grammar.replay(self.tokens, self.total, incomplete=incomplete)
            if fault is not None:
                raise ChainError(fault.reason, fault.line, fault.message)
        started = self.run_started or {}
        nonce = started.get("nonce")
        if check_nonce and nonce != expected_nonce:
            raise ChainError("nonce_mismatch", 1, "the first event does not bind the challenge nonce")
        run_id = started.get("run_id")
        return ChainSummary(
            self.head, self.total, nonce, self.per_producer, self.kinds, self.first, self.last,
            run_id if isinstance(run_id, str) else None, self.eval_results, dict(self.network), tuple(self.gateways),
            self.task_ends,
        )  # fmt: skip


def link_chunks(
    reports: list[ChunkReport],
    *,
    expected_nonce: str | None = None,
    check_nonce: bool = False,
    check_grammar: bool = True,
    incomplete: bool = False,
) -> ChainSummary:
    """Phase two: the checks that cross chunk borders, the grammar, the nonce, then the summary.
    Reports in stream order. ``check_grammar=False`` checks the chain only (a test vector, a
    stream that is not a whole run); ``incomplete=True`` accepts a run that ends with run_failed
    or run_interrupted (a kept ``.incomplete.jsonl``; a bundle's trajectory ends with run_finished)."""
    linker = _Linker()
    for report in reports:
        linker.add(report)
    return linker.summary(
        expected_nonce=expected_nonce, check_nonce=check_nonce, check_grammar=check_grammar, incomplete=incomplete
    )


def verify_chain(
    stream: bytes,
    *,
    expected_nonce: str | None = None,
    check_nonce: bool = False,
    check_grammar: bool = True,
    incomplete: bool = False,
) -> ChainSummary:
    """Check every line, link and counter of a stream, and its grammar; return its summary or raise ChainError."""
    reports = [check_chunk(chunk, line) for chunk, line in split_chunks(stream, 1)]
    return link_chunks(
        reports, expected_nonce=expected_nonce, check_nonce=check_nonce, check_grammar=check_grammar,
        incomplete=incomplete,
    )  # fmt: skip
