"""The fast chain checker against the plain reference (tests/trajectory_reference.py).

``check_chunk`` writes the canonical parser out in its hot loop, finds the hash by byte offset and
hands the grammar only a summary of each chunk; the reference does each step the obvious way.
Hypothesis builds random valid runs and hostile or mutated streams, cuts them anywhere, and the
two must agree: the same reason at the same line, or the same summary.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest
from fuzzing import fuzz_settings, hostile_json, json_values
from hypothesis import given, settings
from hypothesis import strategies as st
from trajectory_helpers import TASK, RunBuilder
from trajectory_reference import reference_verify

from ale.core import grammar
from ale.core.canonical import canonical_json
from ale.core.trajectory import GENESIS, ChainBuilder, ChainError, check_chunk, link_chunks, split_chunks, verify_chain

OTHER = "pendulum-lqr@1.0.0"
_floats = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([1e-6, 2.5e-6, 1e-7, 5e-324, 1.0, 3.0, 1e21, 0.1, -0.0, 1e16]),
)
_data = st.dictionaries(
    st.text(max_size=6),
    st.one_of(json_values, _floats, st.text(alphabet=st.sampled_from('a\u00e9\u20ac\U0001f600"\\\n'), max_size=8)),
    max_size=4,
).filter(lambda d: _canonical_ok(d))


def _canonical_ok(data: dict[str, Any]) -> bool:
    """Data the chain builder writes (it refuses what no verifier reads back)."""
    try:
        ChainBuilder().build("untrusted_agent", "note", data, wall_time=0, monotonic=0)
    except ValueError:
        return False
    return True


def _verdict(check: Any) -> tuple[str, Any]:
    try:
        return ("ok", check())
    except ChainError as exc:
        return ("error", (exc.reason, exc.line))


def _pieces(stream: bytes, cuts: list[int]) -> list[tuple[bytes, int]]:
    """Cut at the newlines after ``cuts``: the pieces, each with its first line number."""
    ends = sorted({stream.find(b"\n", c % max(1, len(stream))) + 1 for c in cuts} - {0, len(stream)})
    pieces, start, line = [], 0, 1
    for end in [*ends, len(stream)]:
        pieces.append((stream[start:end], line))
        line += stream[start:end].count(b"\n")
        start = end
    return pieces


def _cut(stream: bytes, cuts: list[int], known: bool) -> Any:
    """Cut at the newlines after ``cuts``; check each piece (knowing its first line, or not); link."""
    return [check_chunk(piece, line if known or line == 1 else None) for piece, line in _pieces(stream, cuts)]


def _assert_same(stream: bytes, cuts: list[int], **kwargs: Any) -> tuple[str, Any]:
    expected = _verdict(lambda: reference_verify(stream, **kwargs))
    assert _verdict(lambda: verify_chain(stream, **kwargs)) == expected
    if stream.endswith(b"\n"):
        for known in (True, False):
            assert _verdict(lambda known=known: link_chunks(_cut(stream, cuts, known), **kwargs)) == expected
        for parts in (2, 7):
            reports = [check_chunk(c, n) for c, n in split_chunks(stream, parts)]
            assert _verdict(lambda reports=reports: link_chunks(reports, **kwargs)) == expected
    return expected


# -- random valid runs ----------------------------------------------------------------------------

_AGENT_PHASE = (
    [("untrusted_agent", kind) for kind in ("stdout", "stderr", *grammar.AGENT_CHANNEL_KINDS)]
    + [("trusted_evaluator", kind) for kind in ("rpc", "rpc_summary", "batch_submitted")]
    + [
        ("trusted_harness", "rejected_agent_event"),
        ("trusted_harness", "events_dropped"),
        ("trusted_harness", "unreadable_evaluator_event"),
    ]
)


@st.composite
def runs(draw: st.DrawFn) -> bytes:
    tasks = draw(st.sampled_from([(TASK,), (TASK, OTHER)]))
    run = RunBuilder(nonce=draw(st.sampled_from([None, "nonce-abc"])), tasks=tasks)
    for task in tasks:
        run.open_task(task)
        for producer, kind in draw(st.lists(st.sampled_from(_AGENT_PHASE), max_size=12)):
            run.add(producer, kind, {"task": task, **draw(_data)})
        interactive = draw(st.booleans())
        run.harness("agent_finished", task).harness("official_evaluation_started", task)
        session = f"session-{task}"
        run.harness("eval_session_opened" if interactive else "policy_artifact", task)
        for index in range(draw(st.integers(0, 3))):
            if interactive:
                run.add("untrusted_agent", "policy_stdout", {"text": f"episode {index}"})
            run.add("trusted_evaluator", "episode_end", {"task": task, "session_id": session, "index": index})
        if interactive:
            run.harness("policy_finished", task)
        run.add("trusted_evaluator", "eval_result", {"task": task, "session_id": session, "complete": True})
        run.harness("official_evaluation_finished", task).harness("task_finished", task)
    return run.finish().stream()


# -- mutations ------------------------------------------------------------------------------------


def _events(stream: bytes) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.splitlines()]


def _encode(events: list[dict[str, Any]]) -> bytes:
    return b"".join(canonical_json(e) + b"\n" for e in events)


def _rehash(events: list[dict[str, Any]], *, recount: bool) -> list[dict[str, Any]]:
    """What a forger recomputes: every hash and link, and (``recount``) seq and producer_sequence."""
    head, per = GENESIS, {}
    for i, e in enumerate(events):
        if recount:
            e["seq"], e["producer_sequence"] = i, per.get(e["producer"], 0)
            per[e["producer"]] = e["producer_sequence"] + 1
        e["prev_hash"] = head
        e["hash"] = head = hashlib.sha256(canonical_json({k: v for k, v in e.items() if k != "hash"})).hexdigest()
    return events


def _duplicate(events: list[dict[str, Any]], i: int) -> None:
    events.insert(i, json.loads(json.dumps(events[i])))


def _insert_kind(producer: str, kind: str) -> Any:
    def insert(events: list[dict[str, Any]], i: int) -> None:
        event = json.loads(json.dumps(events[i]))
        event.update(producer=producer, kind=kind, data={"task": TASK})
        events.insert(i, event)

    return insert


def _of_kind(kind: str, then: Any) -> Any:
    """Apply ``then`` to the first event of ``kind`` at or after ``i`` (wrapping around), if any."""

    def mutate(events: list[dict[str, Any]], i: int) -> None:
        found = [j for j, e in enumerate(events) if e["kind"] == kind]
        if found:
            then(events, next((j for j in found if j >= i), found[0]))

    return mutate


EVENT_MUTATIONS = {
    "duplicate_episode_end": _of_kind("episode_end", _duplicate),
    "duplicate_eval_result": _of_kind("eval_result", _duplicate),
    "drop_task_finished": _of_kind("task_finished", lambda ev, i: ev.pop(i)),
    "drop_agent_finished": _of_kind("agent_finished", lambda ev, i: ev.pop(i)),
    "stdout_after_agent_finished": _of_kind("official_evaluation_started", _insert_kind("untrusted_agent", "stdout")),
    "episode_end_after_official": _of_kind("task_finished", _insert_kind("trusted_evaluator", "episode_end")),
    "wrong_task": _of_kind("agent_started", lambda ev, i: ev[i]["data"].update(task=OTHER)),
    "run_started_tasks": lambda ev, i: ev[0]["data"].update(tasks=[TASK, TASK]),
    "drop": lambda ev, i: ev.pop(i),
    "duplicate": _duplicate,
    "swap": lambda ev, i: ev.insert(max(0, i - 1), ev.pop(i)),
    "drop_last": lambda ev, i: ev.pop(),
    "thought": _insert_kind("untrusted_agent", "thought"),
    "chain_of_thought": _insert_kind("untrusted_agent", "chain_of_thought"),
    "derived_verifier": _insert_kind("derived_verifier", "note"),
    "unknown_kind": _insert_kind("trusted_harness", "made_up"),
    "late_stdout": _insert_kind("untrusted_agent", "stdout"),
    "second_run_started": _insert_kind("trusted_harness", "run_started"),
    "edit_data": lambda ev, i: ev[i]["data"].update(x=1.5e-6),
    "edit_task": lambda ev, i: ev[i]["data"].update(task=OTHER),
    "edit_session": lambda ev, i: ev[i]["data"].update(session_id=["not", "a", "string"]),
    "edit_monotonic": lambda ev, i: ev[i].update(monotonic=-1),
    "edit_seq": lambda ev, i: ev[i].update(seq=True),
    "edit_kind": lambda ev, i: ev[i].update(kind="Bad"),
    "edit_prev": lambda ev, i: ev[i].update(prev_hash=""),
    "edit_hash": lambda ev, i: ev[i].update(hash="A" * 64),
    "deep_data": lambda ev, i: ev[i].update(data={"d": json.loads("[" * 70 + "]" * 70)}),
}


def _byte_mutation(stream: bytes, kind: str, position: int, value: bytes) -> bytes:
    position %= max(1, len(stream))
    if kind == "flip":
        return stream[:position] + value[:1] + stream[position + 1 :]
    if kind == "insert":
        return stream[:position] + value + stream[position:]
    if kind == "line":  # a whole hostile line at a line boundary
        cut = stream.find(b"\n", position) + 1
        return stream[:cut] + value.replace(b"\n", b" ") + b"\n" + stream[cut:]
    return stream[:position]  # truncate


@fuzz_settings
@given(
    runs(),
    st.lists(st.tuples(st.sampled_from(sorted(EVENT_MUTATIONS)), st.integers(0, 10_000)), min_size=1, max_size=2),
    st.sampled_from(["none", "hashes", "everything", "everything"]),
    st.lists(st.integers(0, 100_000), max_size=4),
    st.sampled_from([None, "nonce-abc", "other"]),
)
def test_fast_path_agrees_with_the_reference_on_mutated_runs(
    stream: bytes, mutations: list[tuple[str, int]], rehash: str, cuts: list[int], nonce: str | None
) -> None:
    events = _events(stream)
    for name, where in mutations:
        if events:
            EVENT_MUTATIONS[name](events, where % len(events))
    if rehash != "none":
        events = _rehash(events, recount=rehash == "everything")
    mutated = _encode(events)
    _assert_same(mutated, cuts, expected_nonce=nonce, check_nonce=nonce is not None)


@pytest.mark.fuzz
@fuzz_settings
@given(
    runs(),
    st.sampled_from(["flip", "insert", "line", "truncate"]),
    st.integers(0, 100_000),
    st.one_of(hostile_json, st.binary(min_size=1, max_size=8)),
    st.lists(st.integers(0, 100_000), max_size=4),
)
def test_fuzz_chain_checker_agrees_with_the_reference_on_hostile_bytes(
    stream: bytes, kind: str, position: int, value: bytes, cuts: list[int]
) -> None:
    """The trajectory line parser and chain checker's fuzz target: hostile bytes anywhere."""
    _assert_same(_byte_mutation(stream, kind, position, value), cuts)


@settings(max_examples=200, deadline=None)
@given(runs(), st.lists(st.integers(0, 100_000), max_size=6))
def test_random_valid_runs_verify_the_same_everywhere(stream: bytes, cuts: list[int]) -> None:
    verdict = _assert_same(stream, cuts, expected_nonce=None, check_nonce=False)
    assert verdict[0] == "ok", verdict
