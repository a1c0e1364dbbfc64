"""ale-trajectory-event/v1: building, verifying, and every way a stream can be broken."""

from __future__ import annotations

import hashlib
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from trajectory_helpers import T0, valid_stream

from ale.core.canonical import canonical_json
from ale.core.merkle import files_root, merkle_tree_hash
from ale.core.trajectory import (
    GENESIS,
    ChainBuilder,
    ChainError,
    ChainSummary,
    check_chunk,
    format_wall_time,
    link_chunks,
    split_chunks,
    verify_chain,
)


def _stream(n: int = 5, nonce: str | None = "nonce-abc") -> bytes:
    """A whole one-task run (14 events) with ``n`` more in its agent phase."""
    return valid_stream(n, nonce=nonce)


def _chain_only(n: int) -> bytes:
    """A chain that is not a run (the grammar refuses it): run_started, then notes of three producers."""
    chain = ChainBuilder()
    lines = [chain.append("trusted_harness", "run_started", {"nonce": None}, wall_time=T0, monotonic=1.0)[1]]
    producers = ["trusted_evaluator", "untrusted_agent", "trusted_harness"]
    for i in range(1, n):
        lines.append(chain.append(producers[i % 3], "note", {"i": i}, wall_time=T0 + i, monotonic=1.0 + i)[1])
    return b"".join(lines)


def _events(stream: bytes) -> list[dict]:
    return [json.loads(line) for line in stream.splitlines()]


def _encode(events: list[dict]) -> bytes:
    return b"".join(canonical_json(e) + b"\n" for e in events)


def _rehash(events: list[dict]) -> list[dict]:
    """Recompute every hash and link, as a forger would."""
    head = GENESIS
    for e in events:
        e["prev_hash"] = head
        body = {k: v for k, v in e.items() if k != "hash"}
        e["hash"] = head = hashlib.sha256(canonical_json(body)).hexdigest()
    return events


def test_test_vector_first_event() -> None:
    """The vector in docs/formats.md: an independent implementation must get this hash."""
    _, line = ChainBuilder().append(
        "trusted_harness", "run_started", {"nonce": "n-1", "run_id": "r-1"}, wall_time=T0, monotonic=0.5
    )
    event = json.loads(line)
    assert line == (
        b'{"data":{"nonce":"n-1","run_id":"r-1"},"hash":"' + event["hash"].encode() + b'","kind":"run_started",'
        b'"monotonic":0.5,"prev_hash":"' + GENESIS.encode() + b'","producer":"trusted_harness",'
        b'"producer_sequence":0,"schema":"ale-trajectory-event/v1","seq":0,'
        b'"wall_time":"2025-11-30T04:28:38.123456Z"}\n'
    )
    body = {k: v for k, v in event.items() if k != "hash"}
    assert event["hash"] == hashlib.sha256(canonical_json(body)).hexdigest()
    assert event["hash"] == "68536c37367c3c082f0f31bba65ea9c93b8d7e97f163cd3fef7635214efc2c2f"


def test_valid_stream_verifies_and_summarises() -> None:
    stream = _stream(7)
    summary = verify_chain(stream, expected_nonce="nonce-abc", check_nonce=True)
    assert summary.events == 21
    assert summary.nonce == "nonce-abc"
    assert summary.head == _events(stream)[-1]["hash"]
    assert summary.per_producer == {"trusted_harness": 12, "trusted_evaluator": 6, "untrusted_agent": 3}
    assert summary.run_id == "run-1"
    assert summary.eval_results == {"batch-1": {"task": "cartpole-balance@1.0.0", "session_id": "batch-1",
                                                "complete": True}}  # fmt: skip


def test_wall_time_format() -> None:
    assert format_wall_time(0.0) == "1970-01-01T00:00:00.000000Z"
    assert format_wall_time(T0) == "2025-11-30T04:28:38.123456Z"


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda ev: ev[2]["data"].update(i=99), "bad_hash"),
        (lambda ev: ev.__setitem__(slice(2, 4), [ev[3], ev[2]]), "bad_sequence"),
        (lambda ev: ev.pop(3), "bad_sequence"),
        (lambda ev: ev[1].update(producer="root"), "bad_producer"),
        (lambda ev: ev[1].update(producer=["trusted_harness"]), "bad_producer"),
        (lambda ev: ev[1].update(kind={"a": 1}), "bad_kind"),
        (lambda ev: ev[1].update(kind=["note"]), "bad_kind"),
        (lambda ev: ev[1].update(wall_time=5), "bad_time"),
        (lambda ev: ev[1].update(hash=["x"]), "bad_hash"),
        (lambda ev: ev[1].update(data=[1]), "bad_data"),
        (lambda ev: ev[1].update(extra=1), "bad_fields"),
        (lambda ev: ev[1].pop("monotonic"), "bad_fields"),
        (lambda ev: ev[1].update(wall_time="yesterday"), "bad_time"),
        (lambda ev: ev[1].update(schema="ale-trajectory-event/v2"), "bad_schema"),
        (lambda ev: ev[2].update(prev_hash="f" * 64), "broken_link"),
        (lambda ev: ev.pop(0), "bad_sequence"),
    ],
)
def test_tampering_is_detected_without_rehash(mutate, reason: str) -> None:
    events = _events(_stream(6))
    mutate(events)
    with pytest.raises(ChainError) as err:
        verify_chain(_encode(events))
    assert err.value.reason == reason


def test_a_forger_who_rehashes_still_cannot_reorder_or_drop() -> None:
    events = _events(_stream(6))
    events.pop(2)
    with pytest.raises(ChainError) as err:
        verify_chain(_encode(_rehash(events)))
    assert err.value.reason == "bad_sequence"
    events = _events(_stream(6))
    events[0]["data"]["nonce"] = "other"
    with pytest.raises(ChainError) as err:
        verify_chain(_encode(_rehash(events)), expected_nonce="nonce-abc", check_nonce=True)
    assert err.value.reason == "nonce_mismatch"


@pytest.mark.parametrize(
    ("stream", "reason"),
    [
        (b"", "empty"),
        (b"{}", "truncated"),
        (b"not json\n", "not_json"),
        (b"[1]\n", "not_json"),
        (b'{"b": 1, "a": 2}\n', "not_canonical"),
        (b'{"a":1,"a":1}\n', "not_canonical"),
        (b'{"a":NaN}\n', "not_json"),
        (b'{"a":"\\ud800"}\n', "not_json"),
        (b'{"a":9007199254740993}\n', "not_json"),
        (b'{"a":' * 70 + b"1" + b"}" * 70 + b"\n", "too_deep"),
        (b"[" * 20_000 + b"\n", "too_deep"),
        (b"{}\n", "bad_fields"),
    ],
)
def test_garbage_streams_are_refused(stream: bytes, reason: str) -> None:
    with pytest.raises(ChainError) as err:
        verify_chain(stream)
    assert err.value.reason == reason


def test_first_event_must_be_the_harness_run_started() -> None:
    chain = ChainBuilder()
    _, line = chain.append("untrusted_agent", "run_started", {"nonce": None}, wall_time=T0, monotonic=0)
    with pytest.raises(ChainError) as err:
        verify_chain(line, check_grammar=False)
    assert err.value.reason == "bad_first_event"


def test_monotonic_time_may_not_go_backwards_within_a_producer() -> None:
    chain = ChainBuilder()
    lines = [
        chain.append("trusted_harness", "run_started", {"nonce": None}, wall_time=T0, monotonic=5.0)[1],
        chain.append("untrusted_agent", "x", {}, wall_time=T0, monotonic=1.0)[1],  # other producer: fine
        chain.append("trusted_harness", "x", {}, wall_time=T0, monotonic=4.0)[1],
    ]
    with pytest.raises(ChainError) as err:
        verify_chain(b"".join(lines), check_grammar=False)
    assert err.value.reason == "bad_time"
    assert err.value.line == 3


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10_000), st.integers(0, 255))
def test_any_flipped_byte_breaks_the_chain(position: int, value: int) -> None:
    stream = bytearray(_stream(4))
    position %= len(stream)
    if stream[position] == value:
        return
    stream[position] = value
    with pytest.raises(ChainError):
        verify_chain(bytes(stream))


def test_builder_refuses_unknown_producers_and_kinds() -> None:
    with pytest.raises(ValueError, match="producer"):
        ChainBuilder().append("me", "x", {}, wall_time=T0, monotonic=0)
    with pytest.raises(ValueError, match="kind"):
        ChainBuilder().append("trusted_harness", "Bad Kind", {}, wall_time=T0, monotonic=0)


def test_merkle_root_rfc6962_vectors() -> None:
    # RFC 6962 structure: MTH of 0, 1, 2 and 3 leaves computed by hand.
    h = lambda b: hashlib.sha256(b).digest()  # noqa: E731
    assert merkle_tree_hash([]) == h(b"")
    assert merkle_tree_hash([b"a"]) == h(b"\x00a")
    assert merkle_tree_hash([b"a", b"b"]) == h(b"\x01" + h(b"\x00a") + h(b"\x00b"))
    ab = h(b"\x01" + h(b"\x00a") + h(b"\x00b"))
    assert merkle_tree_hash([b"a", b"b", b"c"]) == h(b"\x01" + ab + h(b"\x00c"))


def test_files_root_is_order_independent_and_content_sensitive() -> None:
    d = {"b.json": "11" * 32, "a.json": "22" * 32}
    assert files_root(d) == files_root(dict(reversed(list(d.items()))))
    assert files_root(d) != files_root({**d, "a.json": "23" * 32})


# -- chunked verification: the same verdict however the stream is cut -----------------------------


def _verdict(check: object) -> tuple[str, object]:
    try:
        summary = check()  # type: ignore[operator]
    except ChainError as exc:
        return ("error", (exc.reason, exc.line, str(exc)))
    return ("ok", summary)


def _chunked(stream: bytes, cuts: list[int], **kwargs: object) -> ChainSummary:
    """Cut at the newlines nearest ``cuts``, check each piece on its own, link in order."""
    ends = sorted({stream.find(b"\n", c) + 1 for c in cuts if 0 < stream.find(b"\n", c) + 1 < len(stream)})
    pieces, start, line = [], 0, 1
    for end in [*ends, len(stream)]:
        pieces.append(check_chunk(stream[start:end], line))
        line += stream[start:end].count(b"\n")
        start = end
    return link_chunks(pieces, **kwargs)  # type: ignore[arg-type]


def _break_link(events: list[dict], index: int, prev: str = "a" * 64) -> None:
    """A wrong prev_hash at ``index`` with every hash (and every later link) recomputed: only the
    link check (or for a malformed one, the field check) can see it."""
    events[index]["prev_hash"] = prev
    for i in range(index, len(events)):
        if i > index:
            events[i]["prev_hash"] = events[i - 1]["hash"]
        body = {k: v for k, v in events[i].items() if k != "hash"}
        events[i]["hash"] = hashlib.sha256(canonical_json(body)).hexdigest()


_MUTATIONS = [
    lambda ev: None,
    lambda ev: ev[3]["data"].update(i=99),
    lambda ev: ev.__setitem__(slice(4, 6), [ev[5], ev[4]]),
    lambda ev: ev.pop(5),
    lambda ev: ev[6].update(producer_sequence=ev[6]["producer_sequence"] + 1),
    lambda ev: ev[7].update(monotonic=-5.0),
    lambda ev: ev[2].update(prev_hash="f" * 64),
    lambda ev: ev[8].update(hash="nothex"),
    lambda ev: ev[4].update(prev_hash="xyz"),
    lambda ev: ev[0].update(producer="untrusted_agent"),
    lambda ev: ev[0]["data"].update(nonce=5),
    lambda ev: ev[9].update(seq=3),
    lambda ev: ev[5].update(seq=-1),
    lambda ev: ev[6].update(seq="6"),
    lambda ev: ev[7].update(kind="Not A Kind", seq=99),
    lambda ev: [e.update(seq=e["seq"] + 1) for e in ev[4:]],
    lambda ev: _break_link(ev, 4),
    lambda ev: _break_link(ev, 0),
    lambda ev: _break_link(ev, 5, "XYZ"),
    lambda ev: ev[6]["data"].update(session_id="s", x=[1.5, 2.5e-6]),
    lambda ev: ev[3].update(kind="eval_result", producer="trusted_evaluator"),
]


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(range(len(_MUTATIONS))),
    st.booleans(),
    st.lists(st.integers(0, 20_000), max_size=5),
    st.sampled_from([None, "nonce-abc", "other"]),
)
def test_chunked_verification_gives_the_single_pass_verdict(mutation: int, rehash: bool, cuts: list[int],
                                                            nonce: str | None) -> None:  # fmt: skip
    events = _events(_stream(12))
    _MUTATIONS[mutation](events)
    if rehash:
        events = _rehash(events)
    stream = _encode(events)
    kwargs = {"expected_nonce": nonce, "check_nonce": nonce is not None}
    single = _verdict(lambda: verify_chain(stream, **kwargs))
    assert _verdict(lambda: _chunked(stream, [c % max(1, len(stream)) for c in cuts], **kwargs)) == single
    assert _verdict(lambda: link_chunks([check_chunk(c, n) for c, n in split_chunks(stream, 4)], **kwargs)) == single
    # Chunks that do not know where they start (cut while decompressing): only the first does.
    unknown = [check_chunk(c, 1 if n == 1 else None) for c, n in split_chunks(stream, 5)]
    assert _verdict(lambda: link_chunks(unknown, **kwargs)) == single


def test_split_chunks_cuts_at_newlines_and_numbers_lines() -> None:
    stream = _stream(50)
    for parts in (1, 2, 3, 7, 50, 200):
        chunks = split_chunks(stream, parts)
        assert b"".join(c for c, _ in chunks) == stream
        assert len(chunks) <= parts
        assert all(c.endswith(b"\n") for c, _ in chunks)
        assert [n for _, n in chunks] == [1 + stream[: stream.find(c)].count(b"\n") for c, _ in chunks]
    assert split_chunks(b"", 3) == []
    with pytest.raises(ChainError) as err:
        split_chunks(stream[:-1], 2)
    assert err.value.reason == "truncated"


def test_link_chunks_refuses_reports_out_of_order() -> None:
    chunks = split_chunks(_stream(10), 2)
    reports = [check_chunk(c, n) for c, n in chunks]
    with pytest.raises(ValueError, match="consecutive"):
        link_chunks(reports[::-1])
    # A first chunk that does not know it starts at line 1 would skip the first event's checks.
    with pytest.raises(ValueError, match="line 1"):
        link_chunks([check_chunk(c, None) for c, _ in chunks])


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (b'"seq":1,', b'"seq":1.0,'),
        (b'"producer_sequence":0,', b'"producer_sequence":0.0,'),
        (b'"monotonic":2,', b'"monotonic":2.0,'),
        (b'"monotonic":2,', b'"monotonic":2e-6,'),
        (b'"data":{"i":1}', b'"data":{"i":1.0}'),
        (b'"data":{"i":1}', b'"data":{"i":1e-6}'),
        (b'"data":{"i":1}', b'"data":{"i":[0.5,{"j":3.0}]}'),
        (b'"seq":1,', b'"seq" :1,'),
    ],
)
def test_numbers_out_of_canonical_form_are_named_so(old: bytes, new: bytes) -> None:
    stream = _chain_only(3)
    first_line_end = stream.index(b"\n") + 1
    second = stream[first_line_end : stream.index(b"\n", first_line_end) + 1]
    assert old in second
    tampered = stream[:first_line_end] + second.replace(old, new, 1) + stream[first_line_end + len(second) :]
    for check in (
        lambda: verify_chain(tampered, check_grammar=False),
        lambda: _chunked(tampered, [first_line_end + 5], check_grammar=False),
    ):
        with pytest.raises(ChainError) as err:
            check()
        assert (err.value.reason, err.value.line) == ("not_canonical", 2)


@pytest.mark.parametrize("value", [1e-6, 2.5e-6, 1e-7, 1e-5, 5e-324, 1.0, 3.0, 1e21, 0.1])
def test_floats_written_unlike_orjson_still_verify(value: float) -> None:
    """The reference path takes over where the fast one cannot vouch: valid chains stay valid."""
    chain = ChainBuilder()
    lines = [chain.append("trusted_harness", "run_started", {"nonce": None}, wall_time=T0, monotonic=value)[1]]
    lines.append(chain.append("untrusted_agent", "note", {"x": value, "y": [value]}, wall_time=T0, monotonic=value)[1])
    stream = b"".join(lines)
    assert verify_chain(stream, check_grammar=False).events == 2
    assert _chunked(stream, [len(lines[0]) + 3], check_grammar=False).events == 2


@pytest.mark.parametrize("index", [0, 1, 4, 11])
def test_a_broken_link_with_every_hash_recomputed_is_found(index: int) -> None:
    events = _events(_stream(12))
    _break_link(events, index)
    stream = _encode(events)
    for check in (lambda: verify_chain(stream), lambda: _chunked(stream, [len(stream) // 3, len(stream) // 2])):
        with pytest.raises(ChainError) as err:
            check()
        assert (err.value.reason, err.value.line) == ("broken_link", index + 1)
