"""ale.core._eventscan (C), the bulk chain check's one-pass scan of plain lines, against the
bulk path's own passes (orjson's parse and canonical form, the column checks, the line hasher).

The scan only vouches: for a batch it does not refuse (None), the bulk path without it must vouch
too and end with the very same report, field by field; and check_chunk's report is the exact
loop's with it or without it. Whatever it refuses, the bulk path checks as before. The batches here
are plain runs (the data of strings, numbers, booleans and null), hostile edits of them (re-hashed,
as a forger would, so that the checks behind the hash are reached) and numbers and strings of every
form next to the canonical one.
"""

from __future__ import annotations

import contextlib
import json
import struct
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import attrs
import orjson
import pytest
from fuzzing import fuzz_settings, hostile_json
from hypothesis import given
from hypothesis import strategies as st
from sandbox_tools import missing
from test_trajectory_bulk import _rehash_bytes
from test_trajectory_reference import _byte_mutation
from trajectory_helpers import RunBuilder

from ale.core import trajectory
from ale.core.trajectory import _Scan, check_chunk


def _native() -> ModuleType:
    try:
        from ale.core import _eventscan  # type: ignore[attr-defined]
    except ImportError as exc:
        missing(f"ale.core._eventscan was not built ({exc}): `make install` builds it with gcc and libssl-dev")
        raise  # (missing() skipped or failed)
    return _eventscan


@contextlib.contextmanager
def _without_scan() -> Iterator[None]:
    saved = trajectory._native_scan
    trajectory._native_scan = None
    try:
        yield
    finally:
        trajectory._native_scan = saved


def _fields(report: trajectory.ChunkReport) -> dict[str, Any]:
    return attrs.asdict(report, recurse=False)


def _bulk(piece: bytes, first_line: int | None) -> trajectory.ChunkReport | None:
    scan = _Scan(first_line)
    return scan.report() if scan.bulk(piece) else None


def _assert_scan_only_vouches(stream: bytes) -> None:
    """The bulk path with the scan vouches exactly where it does without it, with the same report;
    a batch the scan vouches for, whose producers and kinds are known, the bulk path's passes
    vouch for too when its place is not yet known (nothing before it to check it against); and
    check_chunk reports as the exact loop does, with the scan and without it."""
    native = _native()
    if not stream.endswith(b"\n"):
        return
    scanned = native.scan(stream)
    for first in (1, None):
        exact = _fields(check_chunk(stream, first, bulk=False))
        assert _fields(check_chunk(stream, first)) == exact
        with_scan = _bulk(stream, first)
        with _without_scan():
            assert _fields(check_chunk(stream, first)) == exact
            without = _bulk(stream, first)
        assert (with_scan is None) == (without is None)
        if with_scan is not None and without is not None:
            assert _fields(with_scan) == _fields(without) == exact
        known = scanned is not None and set(scanned[6]) <= trajectory._PRODUCER_SET
        if first is None and known and set(scanned[9]) <= trajectory._VALID_KINDS:
            assert without is not None, "the scan vouched for a batch the bulk path's passes refuse"


class _Run(RunBuilder):
    """RunBuilder's runs, each producer's clock on by 1.25 s (RunBuilder's whole seconds are
    integral floats, which the scan leaves to the bulk path's passes)."""

    def add(self, producer: str, kind: str, data: dict[str, Any] | None = None) -> RunBuilder:
        mono = self.clock[producer] = self.clock.get(producer, 0.0) + 1.25
        _, line = self.chain.append(producer, kind, data or {}, wall_time=1_764_476_918.5 + len(self.lines),
                                    monotonic=mono)  # fmt: skip
        self.lines.append(line)
        return self


def _plain_run(data: list[tuple[str, dict[str, Any]]]) -> bytes:
    run = _Run()
    run.open_task()
    for kind, item in data:
        run.add("untrusted_agent", kind, item)
    return run.stream()


def _body(stream: bytes) -> bytes:
    """The lines after run_started, whose data is nested (and so left to the bulk path's passes)."""
    return stream[stream.index(b"\n") + 1 :]


def _set_digits(line: bytes, key: bytes, digits: bytes) -> bytes:
    """``line`` with the 64 hex digits of its member ``key`` (hash or prev_hash) replaced."""
    at = line.index(b'"' + key + b'":"') + len(key) + 4
    return line[:at] + digits + line[at + 64 :]


_text = st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x7F), max_size=12)
_plain_value = st.one_of(
    _text,
    st.integers(-(2**53) + 1, 2**53 - 1),  # (the builder refuses the others: the edits below hold them)
    st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: abs(f) < 2**53),  # (as the integers)
    st.booleans(),
    st.none(),
)
_plain_data = st.dictionaries(st.text(alphabet="abz_09", max_size=5), _plain_value, max_size=4)
_plain_events = st.lists(st.tuples(st.sampled_from(["stdout", "stderr", "note"]), _plain_data), max_size=20)


def test_the_scan_vouches_for_plain_lines_and_reads_what_the_bulk_path_reads() -> None:
    native = _native()
    stream = _plain_run([("stdout", {"text": f'line {i} "q" \\ \t\n\r', "n": i, "x": i + 0.25}) for i in range(40)])
    lines = stream.split(b"\n")[:-1]
    body = _body(stream)
    scanned = native.scan(body)
    assert scanned is not None
    count, seq0, prev0, head, wall0, wall_last, producers, sequences, monotonics, kinds, spans = scanned
    events = [json.loads(line) for line in lines[1:]]
    assert count == len(events)
    assert (seq0, prev0, head) == (events[0]["seq"], events[0]["prev_hash"], events[-1]["hash"])
    assert (wall0, wall_last) == (events[0]["wall_time"], events[-1]["wall_time"])
    assert producers == [e["producer"] for e in events]
    assert sequences == [e["producer_sequence"] for e in events]
    assert monotonics == [e["monotonic"] for e in events]
    assert [type(m) for m in monotonics] == [type(e["monotonic"]) for e in events]
    assert kinds == [e["kind"] for e in events]
    offsets = struct.unpack(f"{2 * count}I", spans)
    assert [orjson.loads(body[offsets[2 * i] : offsets[2 * i + 1]]) for i in range(count)] == [
        e["data"] for e in events
    ]
    _assert_scan_only_vouches(body)
    _assert_scan_only_vouches(stream)


def test_the_scan_refuses_what_is_not_a_batch_of_whole_lines() -> None:
    native = _native()
    assert native.scan(b"") is None
    line = _plain_run([("stdout", {"text": "x"})]).split(b"\n")[-2]
    assert native.scan(line) is None  # no newline at the end
    assert native.scan(line + b"\n") is not None
    assert native.scan(bytearray(line + b"\n")) is not None  # any bytes-like object
    with pytest.raises(TypeError):
        native.scan("text")


def _one(data: dict[str, Any]) -> bytes:
    """A plain event's line (its chain of one, re-hashed by _rehash_bytes after edits)."""
    return _plain_run([("stdout", data)]).split(b"\n")[-2] + b"\n"


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (b'"text":"x"', b'"text":"\\u0078"'),  # an escape orjson does not write
        (b'"text":"x"', b'"text":"\\/"'),
        (b'"text":"x"', b'"text":"\xc3\xa9"'),  # not ASCII (the bulk path's passes decide)
        (b'"text":"x"', b'"text":"\x7f"'),
        (b'"text":"x"', b'"text":"\x01"'),
        (b'"text":"x"', b'"text":{"y":1}'),  # nested data
        (b'"text":"x"', b'"text":[1]'),
        (b'"text":"x"', b'"text":"x","text":"x"'),  # a key twice
        (b'"n":1,"text":"x"', b'"text":"x","n":1'),  # keys out of order
        (b'"n":1', b'"n":-0'),
        (b'"n":1', b'"n":01'),
        (b'"n":1', b'"n":1e5'),
        (b'"n":1', b'"n":1.0'),
        (b'"n":1', b'"n":1.50'),
        (b'"n":1', b'"n":9007199254740992'),
        (b'"n":1', b'"n":.5'),
        (b'"n":1', b'"n":tru'),
        (b'"n":1', b'"n": 1'),
        (b'"n":1', b'"n":1.00001e-5'),
    ],
)
def test_the_scan_refuses_every_form_but_the_plainest_and_the_bulk_path_decides(old: bytes, new: bytes) -> None:
    native = _native()
    line = _one({"n": 1, "text": "x"})
    assert native.scan(_rehash_bytes(line)) is not None
    edited = _rehash_bytes(line.replace(old, new, 1))
    assert edited != line
    assert native.scan(edited) is None
    _assert_scan_only_vouches(edited)


def test_the_scan_refuses_a_line_over_the_limit() -> None:
    native = _native()
    text = "x" * (trajectory.MAX_LINE_BYTES - 1000)
    assert native.scan(_one({"text": text})) is not None
    line = _one({"text": text})
    over = _rehash_bytes(line.replace(b'"text":"', b'"text":"' + b"y" * 1000, 1))  # (the builder refuses it)
    assert len(over) - 1 > trajectory.MAX_LINE_BYTES
    assert native.scan(over) is None
    _assert_scan_only_vouches(over)


def test_the_scan_refuses_a_broken_hash_link_or_seq_as_the_bulk_path_does() -> None:
    native = _native()
    body = _body(_plain_run([("stdout", {"i": i}) for i in range(6)]))
    assert native.scan(body) is not None
    lines = body.split(b"\n")[:-1]
    forged = b"f" * 64
    cases = {
        # line 3's hash is not its body's, though line 4 links to it
        "hash": [*lines[:2], _set_digits(lines[2], b"hash", forged), _set_digits(lines[3], b"prev_hash", forged),
                 *lines[4:]],
        "link": [*lines[:3], _set_digits(lines[3], b"prev_hash", forged), *lines[4:]],
        "seq": [*lines[:4], lines[4].replace(b'"seq":', b'"seq":1', 1), *lines[5:]],
    }  # fmt: skip
    for name, edited in cases.items():
        batch = b"".join(line + b"\n" for line in edited)
        assert batch != body, name
        assert native.scan(batch) is None, name
        _assert_scan_only_vouches(batch)


@fuzz_settings
@given(_plain_events)
def test_the_scan_only_vouches_on_plain_runs(events: list[tuple[str, dict[str, Any]]]) -> None:
    stream = _plain_run(events)
    _assert_scan_only_vouches(_body(stream))
    _assert_scan_only_vouches(stream)


@pytest.mark.fuzz
@fuzz_settings
@given(_plain_events, st.sampled_from(["flip", "insert", "line"]), st.integers(0, 100_000),
       st.one_of(hostile_json, st.binary(min_size=1, max_size=8), st.sampled_from(
           [b"0", b"-", b".", b"e", b"\\", b'"', b"\\u0041", b"\x80", b"1.0", b"00", b"}", b",", b" "])),
       st.booleans())  # fmt: skip
def test_fuzz_the_scan_only_vouches_on_hostile_edits(
    events: list[tuple[str, dict[str, Any]]], kind: str, position: int, value: bytes, rehash: bool
) -> None:
    stream = _plain_run(events)
    edited = _byte_mutation(stream, kind, position, value)
    _assert_scan_only_vouches(_rehash_bytes(edited) if rehash else edited)


_FLOAT_FORMS = (repr, lambda x: f"{x:.17g}", lambda x: f"{x:.15g}", lambda x: f"{x:.16f}", lambda x: f"{x:.3f}",
                lambda x: repr(x) + "0", lambda x: f"{x:.1f}")  # fmt: skip


@fuzz_settings
@given(st.one_of(st.floats(allow_nan=False, allow_infinity=False), st.floats(1e-5, 1e17), st.floats(-1e4, 1e4)))
def test_a_number_the_scan_vouches_for_is_the_canonical_form_of_its_value(x: float) -> None:
    native = _native()
    line = _one({"n": 0.5})
    for form in _FLOAT_FORMS:
        text = form(x).encode()
        if not text or b"n" in text or b"i" in text:  # nan, inf
            continue
        edited = _rehash_bytes(line.replace(b'"n":0.5', b'"n":' + text, 1))
        scanned = native.scan(edited)
        if scanned is not None:
            value = orjson.loads(text)  # an integer's text ("0", "12") reads as an int
            assert orjson.dumps(value) == text, text
            assert type(value) is int or not value.is_integer()
            _assert_scan_only_vouches(edited)
        monotonic = _rehash_bytes(line.replace(b'"monotonic":1.25', b'"monotonic":' + text, 1))
        if native.scan(monotonic) is not None:
            assert orjson.dumps(orjson.loads(text)) == text, text
            _assert_scan_only_vouches(monotonic)


def test_the_scan_takes_an_integral_monotonic_time_as_an_integer_and_refuses_it_as_a_float() -> None:
    native = _native()
    line = _one({})
    assert b'"monotonic":1.25,' in line
    assert native.scan(line) is not None
    as_float = _rehash_bytes(line.replace(b'"monotonic":1.25,', b'"monotonic":1.0,', 1))
    assert native.scan(as_float) is None  # 1.0: the bulk path's passes decide (RFC 8785 writes 1)
    _assert_scan_only_vouches(as_float)
    as_int = _rehash_bytes(line.replace(b'"monotonic":1.25,', b'"monotonic":1,', 1))
    scanned = native.scan(as_int)
    assert scanned is not None
    assert scanned[8] == [1]
    assert type(scanned[8][0]) is int
    _assert_scan_only_vouches(as_int)


def test_the_chain_check_uses_the_scan_where_it_was_built() -> None:
    _native()
    assert trajectory.EVENTSCAN == "native"
    stream = _plain_run([("stdout", {"text": "x" * 100, "i": i}) for i in range(300)])
    calls = []
    saved = trajectory._native_scan
    assert saved is not None

    def counting(piece: bytes) -> Any:
        calls.append(len(piece))
        return saved(piece)

    trajectory._native_scan = counting
    try:
        with _without_scan():
            expected = _fields(check_chunk(_body(stream), None))
        report = check_chunk(_body(stream), None)
    finally:
        trajectory._native_scan = saved
    assert calls
    assert report.fault is None
    assert _fields(report) == expected
