"""The bulk path of ``check_chunk`` against the exact loop and the plain reference.

The bulk path (``_Scan.bulk``) vouches for a chunk with few C-level calls and leaves any chunk it
doubts to the exact loop (``check_chunk(..., bulk=False)``), which names the fault. So for every
chunk, valid or not, the two give the same report, field by field; and the linked verdict is the
reference's (tests/trajectory_reference.py). Batches (``_BULK_BYTES``) are shrunk here so that
their borders fall everywhere.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
from collections.abc import Callable, Iterator
from typing import Any

import attrs
import orjson
import pytest
from fuzzing import fuzz_settings, hostile_json, json_values
from hypothesis import given
from hypothesis import strategies as st
from test_trajectory_reference import (
    EVENT_MUTATIONS,
    _byte_mutation,
    _encode,
    _events,
    _pieces,
    _rehash,
    _verdict,
    runs,
)
from trajectory_helpers import RunBuilder
from trajectory_reference import reference_verify

from ale.core import trajectory
from ale.core.canonical import ORJSON_OPTIONS
from ale.core.trajectory import ChunkReport, _bulk_events, _Scan, check_chunk, link_chunks, split_chunks

_BATCHES = st.sampled_from([1, 300, 4096, 64 * 1024])


@contextlib.contextmanager
def _batch(size: int, lines: int = 1) -> Iterator[None]:
    """Batches of about ``size`` bytes, and at least ``lines`` lines (1: the bytes alone decide)."""
    saved = trajectory._BULK_BYTES, trajectory._BULK_LINES
    trajectory._BULK_BYTES, trajectory._BULK_LINES = size, lines
    try:
        yield
    finally:
        trajectory._BULK_BYTES, trajectory._BULK_LINES = saved


def _fields(report: ChunkReport) -> dict[str, Any]:
    return attrs.asdict(report, recurse=False)


@contextlib.contextmanager
def _hasher(digests: Callable[[bytes], bytes | None]) -> Iterator[None]:
    """The bulk path's per-line hasher (trajectory.body_digests) swapped for ``digests``."""
    saved = trajectory.body_digests
    trajectory.body_digests = digests
    try:
        yield
    finally:
        trajectory.body_digests = saved


#: the hashers the bulk path may run with: the Python reference, and the C module where it was
#: built (tests/test_linehash.py holds the two together; here each is held to the exact loop)
_HASHERS = tuple(dict.fromkeys((trajectory.body_digests_reference, trajectory.body_digests)))


@contextlib.contextmanager
def _scanner(scan: Callable[[bytes], Any] | None) -> Iterator[None]:
    """The bulk path's one-pass scan of plain lines (trajectory._native_scan) swapped for ``scan``."""
    saved = trajectory._native_scan
    trajectory._native_scan = scan
    try:
        yield
    finally:
        trajectory._native_scan = saved


#: the scans the bulk path may run with: none (its passes alone), and the C one where it was built
#: (tests/test_eventscan.py holds it to the passes; here each is held to the exact loop)
_SCANNERS = tuple(dict.fromkeys((None, trajectory._native_scan)))


def _assert_bulk_is_exact(stream: bytes, cuts: list[int], batch: int, **kwargs: Any) -> tuple[str, Any]:
    """Every piece's bulk report is the exact loop's (its place known or not), with either
    hasher and with the scan or without, and the linked verdict is the reference's."""
    expected = _verdict(lambda: reference_verify(stream, **kwargs))
    if not stream.endswith(b"\n"):
        return expected
    for known, digests, scan in itertools.product((True, False), _HASHERS, _SCANNERS):
        with _batch(batch), _hasher(digests), _scanner(scan):
            reports = []
            for piece, line in _pieces(stream, cuts):
                first = line if known or line == 1 else None
                bulk, exact = check_chunk(piece, first), check_chunk(piece, first, bulk=False)
                assert _fields(bulk) == _fields(exact)
                reports.append(bulk)
            assert _verdict(lambda reports=reports: link_chunks(reports, **kwargs)) == expected
    return expected


def _vouches(chunk: bytes, first_line: int | None = 1) -> bool:
    return _Scan(first_line).bulk(chunk)


# -- valid runs -----------------------------------------------------------------------------------


def _plain_run(body: int = 40) -> bytes:
    run = RunBuilder()
    run.open_task()
    run.body(body)
    run.add("untrusted_agent", "stdout", {"text": 'a \u00e9 \u20ac "quoted" back\\slash\ttab'})
    run.add("untrusted_agent", "stderr", {"text": "x", "n": [1, {"y": 0.5}], "ok": True, "none": None})
    run.close_task()
    return run.finish().stream()


@pytest.mark.parametrize(("batch", "lines"), [(1, 1), (500, 1), (4096, 1), (1 << 20, 1), (1, 3), (500, 7), (300, 40)])
def test_bulk_vouches_for_a_plain_run_with_the_exact_report_at_every_batch_size(batch: int, lines: int) -> None:
    stream = _plain_run()
    with _batch(batch, lines):
        for parts in (1, 3, 8):
            for piece, line in split_chunks(stream, parts):
                for first in {line, None if line != 1 else 1}:
                    scan = _Scan(first)
                    assert scan.bulk(piece)
                    assert _fields(scan.report()) == _fields(check_chunk(piece, first, bulk=False))


_simple_data = st.dictionaries(
    st.text(alphabet="abcxyz_", max_size=6),
    st.one_of(
        st.integers(-(2**53) + 1, 2**53 - 1),
        st.text(alphabet=st.characters(max_codepoint=0xFFFF, exclude_categories=("Cs",)), max_size=10),
        st.floats(min_value=1e-4, max_value=1e15).filter(lambda f: not f.is_integer()),
        st.lists(st.integers(0, 9), max_size=3),
    ),
    max_size=4,
)


@fuzz_settings
@given(st.lists(st.tuples(st.sampled_from(["stdout", "stderr", "note"]), _simple_data), max_size=30),
       st.lists(st.integers(0, 100_000), max_size=4), _BATCHES)  # fmt: skip
def test_bulk_vouches_for_every_valid_chunk_of_plain_values(
    events: list[tuple[str, dict[str, Any]]], cuts: list[int], batch: int
) -> None:
    """Not merely agreeing by always falling back: chunks of strings, integers and plain floats
    are vouched for by the bulk path itself."""
    run = RunBuilder()
    run.open_task()
    for kind, data in events:
        run.add("untrusted_agent", kind, data)
    stream = run.stream()
    with _batch(batch):
        for piece, line in _pieces(stream, cuts):
            scan = _Scan(line)
            assert scan.bulk(piece)
            assert _fields(scan.report()) == _fields(check_chunk(piece, line, bulk=False))


@fuzz_settings
@given(runs(), st.lists(st.integers(0, 100_000), max_size=6), _BATCHES)
def test_bulk_agrees_with_the_exact_loop_and_the_reference_on_random_valid_runs(
    stream: bytes, cuts: list[int], batch: int
) -> None:
    verdict = _assert_bulk_is_exact(stream, cuts, batch, expected_nonce=None, check_nonce=False)
    assert verdict[0] == "ok", verdict


# -- mutated and hostile chunks -------------------------------------------------------------------


@pytest.mark.fuzz
@fuzz_settings
@given(
    runs(),
    st.lists(st.tuples(st.sampled_from(sorted(EVENT_MUTATIONS)), st.integers(0, 10_000)), min_size=1, max_size=2),
    st.sampled_from(["none", "hashes", "everything"]),
    st.lists(st.integers(0, 100_000), max_size=4),
    _BATCHES,
)
def test_fuzz_bulk_agrees_with_the_exact_loop_on_mutated_runs(
    stream: bytes, mutations: list[tuple[str, int]], rehash: str, cuts: list[int], batch: int
) -> None:
    """Swapped, duplicated, removed lines, wrong seq, producer_sequence, monotonic, hashes, unknown
    kinds and producers, floats in the exponent band, deep data: re-chained by a forger or not."""
    events = _events(stream)
    for name, where in mutations:
        if events:
            EVENT_MUTATIONS[name](events, where % len(events))
    if rehash != "none":
        events = _rehash(events, recount=rehash == "everything")
    _assert_bulk_is_exact(_encode(events), cuts, batch)


_TEXT_EDITS = [
    (b'"monotonic":1', b'"monotonic":1.0'),  # a non-canonical number
    (b'"monotonic":2', b'"monotonic":2e0'),
    (b'"seq":1,', b'"seq":01,'),
    (b'"kind":"', b'"kind":"\\u0061'),  # a non-canonical escape
    (b'"text":"', b'"text":"\\/'),
    (b'"text":"', b'"text":"\xf0\x9f\x98\x80'),  # text outside the BMP
    (b'"data":{', b'"data":{"x":[1\n2],'),  # a line that JSON-merges across a newline
    (b'"data":{', b' "data":{'),
    (b"}\n", b"} \n"),
    (b"}\n", b"}\n\n"),
    (b"}\n", b"},{}\n"),
    (b'"producer":"untrusted_agent"', b'"producer":"someone_else"'),
    (b'"kind":"note"', b'"kind":"made_up"'),
    (b'"hash":"', b'"hash":"0'),
    (b'"prev_hash":"', b'"prev_hash":"0'),
    (b'"wall_time":"2', b'"wall_time":"3'),
]


@pytest.mark.fuzz
@fuzz_settings
@given(runs(), st.sampled_from(_TEXT_EDITS), st.integers(0, 100_000), st.booleans(),
       st.lists(st.integers(0, 100_000), max_size=4), _BATCHES)  # fmt: skip
def test_fuzz_bulk_agrees_with_the_exact_loop_on_edited_lines(
    stream: bytes, edit: tuple[bytes, bytes], where: int, rehash: bool, cuts: list[int], batch: int
) -> None:
    """Non-canonical numbers and escapes, non-BMP text, lines merging across a newline, whitespace,
    unknown producers and kinds, wrong hashes: one occurrence edited, the chain re-hashed over the
    edited bytes or not."""
    old, new = edit
    at = [i for i in range(len(stream)) if stream.startswith(old, i)]
    if not at:
        return
    i = at[where % len(at)]
    edited = stream[:i] + new + stream[i + len(old) :]
    if rehash:
        edited = _rehash_bytes(edited)
    _assert_bulk_is_exact(edited, cuts, batch)


def _rehash_bytes(stream: bytes) -> bytes:
    """Recompute each line's prev_hash and hash over its own bytes (not its canonical form), where
    the line still has the members' text: a forger keeping the edit."""
    out, head = [], trajectory.GENESIS
    for line in stream.split(b"\n")[:-1]:
        cut = line.rfind(b'"hash":"')
        prev = line.find(b'"prev_hash":"')
        if cut < 0 or prev < 0 or line[cut + 72 : cut + 74] != b'",':
            out.append(line)
            continue
        line = line[: prev + 13] + head.encode() + line[prev + 13 + 64 :]
        cut = line.rfind(b'"hash":"')
        head = hashlib.sha256(line[:cut] + line[cut + 74 :]).hexdigest()
        out.append(line[: cut + 8] + head.encode() + line[cut + 72 :])
    return b"".join(piece + b"\n" for piece in out)


@pytest.mark.fuzz
@fuzz_settings
@given(runs(), st.sampled_from(["flip", "insert", "line"]), st.integers(0, 100_000),
       st.one_of(hostile_json, st.binary(min_size=1, max_size=8)), st.lists(st.integers(0, 100_000), max_size=4),
       _BATCHES)  # fmt: skip
def test_fuzz_bulk_agrees_with_the_exact_loop_on_hostile_bytes(
    stream: bytes, kind: str, position: int, value: bytes, cuts: list[int], batch: int
) -> None:
    _assert_bulk_is_exact(_byte_mutation(stream, kind, position, value), cuts, batch)


# -- the joined comparison ------------------------------------------------------------------------


@pytest.mark.fuzz
@fuzz_settings
@given(st.lists(st.tuples(st.dictionaries(st.text(max_size=4), json_values, max_size=4),
                          st.lists(st.tuples(st.integers(0, 10_000),
                                             st.sampled_from([b" ", b"\t", b"\r", b",", b"\n"])),
                                   max_size=2)), min_size=1, max_size=5))  # fmt: skip
def test_the_batch_parsed_as_one_array_writes_back_to_itself_exactly_when_each_line_is_its_own_form(
    items: list[tuple[dict[str, Any], list[tuple[int, bytes]]]],
) -> None:
    """The argument the bulk path rests on: the batch parsed once as "[" + its lines joined by ","
    + "]", each value written back, the forms joined by newlines (plus the last) equal the batch
    if and only if every line is one object's own form. Edits insert whitespace, commas and
    newlines anywhere (a value cut across lines, two values on a line)."""
    lines = []
    for value, inserts in items:
        try:
            line = orjson.dumps(value, option=ORJSON_OPTIONS)
        except orjson.JSONEncodeError:
            return
        for position, byte in inserts:
            position %= len(line) + 1
            line = line[:position] + byte + line[position:]
        lines.append(line)
    batch = b"\n".join(lines) + b"\n"
    try:
        events = orjson.loads(b"[" + batch[:-1].replace(b"\n", b",") + b"]")
    except orjson.JSONDecodeError:
        proved = False
    else:
        proved = b"\n".join(orjson.dumps(e, option=ORJSON_OPTIONS) for e in events) + b"\n" == batch

    def own_form(line: bytes) -> bool:
        try:
            value = orjson.loads(line)
        except orjson.JSONDecodeError:
            return False
        return type(value) is dict and orjson.dumps(value, option=ORJSON_OPTIONS) == line

    assert proved == all(own_form(line) for line in batch.split(b"\n")[:-1])


# -- named hostile cases --------------------------------------------------------------------------


def _run_lines(*data: dict[str, Any]) -> list[bytes]:
    run = RunBuilder()
    run.open_task()
    for item in data:
        run.add("untrusted_agent", "note", item)
    return [line.rstrip(b"\n") for line in run.lines]


def _same_fault(chunk: bytes, reason: str, line: int) -> None:
    for batch in (1, 64 * 1024):
        with _batch(batch):
            assert not _vouches(chunk)
            bulk, exact = check_chunk(chunk), check_chunk(chunk, bulk=False)
            assert _fields(bulk) == _fields(exact)
            assert bulk.fault is not None
            assert (bulk.fault[0], bulk.fault[2]) == (line, reason)


def test_bulk_leaves_lines_that_json_merge_across_a_newline_to_the_exact_loop() -> None:
    lines = _run_lines({"x": [1, 2]})
    last = lines[-1]
    cut = last.index(b"[1,") + 2  # '{"data":{"x":[1' / '2]},...}': one object if the newline were a comma
    merged = [*lines[:-1], last[:cut], last[cut + 1 :]]
    _same_fault(b"".join(line + b"\n" for line in merged), "not_json", len(lines))


def test_bulk_leaves_a_line_of_two_objects_to_the_exact_loop() -> None:
    lines = _run_lines({"a": 1})
    _same_fault(b"".join(line + b"\n" for line in [*lines[:-1], lines[-1] + b"," + lines[-1]]), "not_json", len(lines))


def test_bulk_leaves_a_value_across_two_lines_beside_two_values_on_one_line_to_the_exact_loop() -> None:
    """As many values as lines, each newline but one a comma between them: the batch parses as an
    array of as many objects, yet its lines are not one event each (the exact loop names it)."""
    lines = _run_lines({"x": [1, 2]}, {"a": 1})
    split, doubled = lines[-2], lines[-1]
    cut = split.index(b"[1,") + 2
    hostile = [*lines[:-2], split[:cut], split[cut + 1 :], doubled + b"," + doubled]
    chunk = b"".join(line + b"\n" for line in hostile)
    assert chunk.count(b"\n") == len(orjson.loads(b"[" + chunk[:-1].replace(b"\n", b",") + b"]"))
    assert _bulk_events(chunk) is None  # its forms, one a line, are not the chunk's lines
    _same_fault(chunk, "not_json", len(lines) - 1)


def test_bulk_leaves_whitespace_around_a_line_to_the_exact_loop() -> None:
    lines = _run_lines({"a": 1})
    _same_fault(b"".join(line + b"\n" for line in [*lines[:-1], b" " + lines[-1]]), "not_canonical", len(lines))


@pytest.mark.parametrize(
    ("old", "new"),
    [(b'"text":"a', b'"text":"\\u0061'), (b'"n":15', b'"n":1.5e1'), (b'"n":15', b'"n":15.0'), (b'"n":15', b'"n":015')],
)
def test_bulk_leaves_non_canonical_escapes_and_numbers_to_the_exact_loop(old: bytes, new: bytes) -> None:
    lines = _run_lines({"text": "abc", "n": 15})
    assert old in lines[-1]
    lines[-1] = lines[-1].replace(old, new)
    reason = "not_canonical" if new != b'"n":015' else "not_json"
    _same_fault(b"".join(line + b"\n" for line in lines), reason, len(lines))


@pytest.mark.parametrize(
    "data",
    [{"text": "\U0001f600 outside the BMP"}, {"\U0001f600": 1, "\uff61": 2}, {"x": 1.5e-6}, {"x": 3e-7}, {"x": 1e21}],
)
def test_bulk_leaves_non_bmp_text_and_banded_floats_to_the_exact_loop_which_accepts_them(data: dict[str, Any]) -> None:
    chunk = b"".join(line + b"\n" for line in _run_lines(data))
    assert not _vouches(chunk)
    bulk, exact = check_chunk(chunk), check_chunk(chunk, bulk=False)
    assert _fields(bulk) == _fields(exact)
    assert bulk.fault is None


def test_bulk_names_a_wrong_hash_as_the_exact_loop_does() -> None:
    lines = _run_lines({"a": 1}, {"a": 2})
    cut = lines[2].rfind(b'"hash":"') + 8
    lines[2] = lines[2][:cut] + (b"0" if lines[2][cut : cut + 1] != b"0" else b"1") + lines[2][cut + 1 :]
    _same_fault(b"".join(line + b"\n" for line in lines), "bad_hash", 3)


def test_bulk_cuts_the_hash_member_not_a_hash_member_text_in_the_data() -> None:
    """A "hash" member inside data (text the bulk path could take for the event's own): vouched
    for when honest; a hash forged over the line cut at the data's member is refused as exactly."""
    honest = _run_lines({"hash": "f" * 64, "kind": "note"})
    chunk = b"".join(line + b"\n" for line in honest)
    assert _vouches(chunk)
    assert _fields(check_chunk(chunk)) == _fields(check_chunk(chunk, bulk=False))
    line = honest[-1]
    inner, outer = line.find(b'"hash":"'), line.rfind(b'"hash":"')
    assert inner < outer
    forged_digest = hashlib.sha256(line[:inner] + line[inner + 74 :]).hexdigest().encode()
    forged = line[: outer + 8] + forged_digest + line[outer + 72 :]
    _same_fault(b"".join(x + b"\n" for x in [*honest[:-1], forged]), "bad_hash", len(honest))


def test_bulk_names_wrong_seq_sequence_and_monotonic_across_a_batch_border() -> None:
    base = _events(b"".join(line + b"\n" for line in _run_lines({"a": 1}, {"a": 2}, {"a": 3})))
    cases = {
        "seq": (lambda ev: ev[-1].update(seq=ev[-1]["seq"] + 1), "bad_sequence"),
        "producer_sequence": (lambda ev: ev[-1].update(producer_sequence=7), "bad_sequence"),
        "monotonic": (lambda ev: ev[-1].update(monotonic=0.5), "bad_time"),
        "producer": (lambda ev: ev[-1].update(producer="someone"), "bad_producer"),
        "kind": (lambda ev: ev[-1].update(kind="Not-A-Kind"), "bad_kind"),
    }
    for mutate, reason in cases.values():
        events = json.loads(json.dumps(base))
        mutate(events)
        _same_fault(_encode(_rehash(events, recount=False)), reason, len(events))


@pytest.mark.parametrize(
    "wall",
    [
        "2026-11-30T04:28:38.12345\u0664Z",  # an Arabic-Indic digit: not [0-9]
        "2026-11-30T04:28:38.12345\uff16Z",  # a fullwidth digit
        "2026-11-30 04:28:38.123456Z",
        "2026-11-30T04:28:38,123456Z",
        "2026-11-30T04:28:38.123456z",
        "0000-00-00T00:00:00.000000Z0",
    ],
)
def test_bulk_names_a_wall_time_of_the_right_length_but_not_the_form_as_the_exact_loop_does(wall: str) -> None:
    """The bulk path reads every wall time of a batch at once (digits written as 0, compared with
    the form): only ASCII digits count, as in the exact loop's [0-9]."""
    events = _events(b"".join(line + b"\n" for line in _run_lines({"a": 1}, {"a": 2}, {"a": 3})))
    events[-2]["wall_time"] = wall
    _same_fault(_encode(_rehash(events, recount=False)), "bad_time", len(events) - 1)


@pytest.mark.parametrize("smallest", [1e-6, 5e-6, 1.5e-7, 9.99e-6])
def test_bulk_leaves_banded_monotonic_times_to_the_exact_loop_which_accepts_them(smallest: float) -> None:
    """Monotonic times all floats (the bulk path first looks at their smallest magnitude): one in
    the band where orjson's form may differ from RFC 8785's is the exact loop's to judge."""
    events = _events(b"".join(line + b"\n" for line in _run_lines({"a": 1}, {"a": 2})))
    for i, event in enumerate(events):
        event["monotonic"] = smallest if i == 0 else 0.5 + i
    chunk = _encode(_rehash(events, recount=False))
    bulk, exact = check_chunk(chunk), check_chunk(chunk, bulk=False)
    assert _fields(bulk) == _fields(exact)
    assert exact.fault is None
    assert not _vouches(chunk)
    events[0]["monotonic"] = 1e-5  # at the band's top: outside it, vouched for
    chunk = _encode(_rehash(events, recount=False))
    assert _vouches(chunk)
    assert _fields(check_chunk(chunk)) == _fields(check_chunk(chunk, bulk=False))


def test_bulk_leaves_a_kind_not_yet_seen_to_the_exact_loop_which_then_knows_it() -> None:
    kind = "bulk_kind_never_seen_before"
    assert kind not in trajectory._VALID_KINDS
    run = RunBuilder()
    run.add("untrusted_agent", kind, {"a": 1})
    chunk = run.stream()
    trajectory._VALID_KINDS.discard(kind)  # (the builder checked it: a verifier process that has not)
    assert not _vouches(chunk)
    report = check_chunk(chunk)
    assert report.fault is None
    assert kind in trajectory._VALID_KINDS
    assert _vouches(chunk)
    assert _fields(check_chunk(chunk)) == _fields(report)


def test_bulk_refuses_a_first_event_that_is_not_run_started_as_the_exact_loop_does() -> None:
    lines = _run_lines({"a": 1})
    events = _events(b"".join(line + b"\n" for line in lines))[1:]
    _same_fault(_encode(_rehash(events, recount=True)), "bad_first_event", 1)


def test_bulk_report_of_a_whole_run_links_to_the_reference_summary() -> None:
    stream = _plain_run(200)
    assert _vouches(stream)
    expected = reference_verify(stream, expected_nonce="nonce-abc", check_nonce=True)
    for batch in (1, 4096):
        with _batch(batch):
            reports = [check_chunk(c, n) for c, n in split_chunks(stream, 5)]
            assert link_chunks(reports, expected_nonce="nonce-abc", check_nonce=True) == expected


def test_bulk_compares_hashes_one_by_one_not_their_concatenation() -> None:
    """A forger's hashes of 63 and 65 characters whose concatenation is the hex of the two bodies'
    digests (each cut where the exact loop cuts it): the exact loop refuses the first (not 64
    characters); so must the bulk path, which compares the joined hex."""
    lines = _run_lines({"a": 1}, {"a": 2})

    def with_hash(line: bytes, value: bytes, width: int) -> bytes:
        cut = line.rfind(b'"hash":"') + 8
        return line[:cut] + value + line[cut + width :]

    def body(line: bytes) -> bytes:
        cut = line.rfind(b'"hash":"')
        return line[:cut] + line[cut + 74 :]

    one = with_hash(lines[1], b"0" * 63, 64)
    first = hashlib.sha256(body(one)).hexdigest().encode()
    one = with_hash(one, first[:63], 63)
    prev = lines[2].find(b'"prev_hash":"') + 13
    two = with_hash(lines[2][:prev] + first[:63] + lines[2][prev + 64 :], b"0" * 65, 64)
    two = with_hash(two, first[63:] + hashlib.sha256(body(two)).hexdigest().encode(), 65)
    chunk = b"".join(line + b"\n" for line in [lines[0], one, two])
    _same_fault(chunk, "bad_hash", 2)
