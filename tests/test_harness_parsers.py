"""Fuzz targets for the harness's parsers of untrusted lines: the agent's event channel and the
evaluator's log. Whatever the line, the parser answers (a value or a reason, never an exception),
and the trajectory the recorder writes from it is one a verifier accepts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fuzzing import fuzz_settings, hostile_json, json_values
from hypothesis import given
from hypothesis import strategies as st

from ale.core.trajectory import verify_chain
from ale.runner.harness import AGENT_EVENT_KINDS, EvaluatorTail, _agent_sink, _channel_event
from ale.runner.recorder import LineQueue, Recorder
from ale.runner.tails import log_line

TASK = "cartpole-balance@1.0.0"


class _Run:
    """A recorder in the agent phase of a one-task run, its lines kept in memory."""

    def __init__(self) -> None:
        self.queue = LineQueue()
        self.rec = Recorder(Path("unused"), self.queue)
        self.rec.emit("trusted_harness", "run_started", {"nonce": None, "run_id": "r", "tasks": [TASK]})
        for kind in ("task_started", "evaluator_started", "agent_started"):
            self.rec.emit("trusted_harness", kind, {"task": TASK})
        self.rec.open_channel("agent", TASK)
        self.rec.open_channel("evaluator", TASK)

    def stream(self) -> bytes:
        self.rec.close_channel("agent")
        for kind in ("agent_finished", "official_evaluation_started", "official_evaluation_skipped"):
            self.rec.emit("trusted_harness", kind, {"task": TASK})
        self.rec.close_channel("evaluator")
        self.rec.emit("trusted_harness", "task_finished", {"task": TASK})
        self.rec.emit("trusted_harness", "run_finished", {"tasks": {TASK: "not_completed"}})
        return b"".join(self.queue.pending)


def _encoded(value: Any) -> bytes:
    return json.dumps(value).encode()


_channel_lines = st.one_of(
    hostile_json,
    st.builds(
        lambda kind, data: _encoded({"kind": kind, "data": data}),
        st.sampled_from([*sorted(AGENT_EVENT_KINDS), "thought", "stdout", "run_finished", "Note", ""]),
        st.dictionaries(st.text(max_size=8), json_values, max_size=5),
    ),
    json_values.map(_encoded),
)


@pytest.mark.fuzz
@fuzz_settings
@given(st.lists(_channel_lines, min_size=1, max_size=8))
def test_fuzz_event_fd_line_parser(lines: list[bytes]) -> None:
    run = _Run()
    sink = _agent_sink(run.rec, TASK)
    for line in lines:
        parsed = _channel_event(line)
        assert isinstance(parsed, str) or (parsed[0] in AGENT_EVENT_KINDS and isinstance(parsed[1], dict))
        sink("event", line)
    summary = verify_chain(run.stream())
    recorded = summary.kinds.get("rejected_agent_event", 0) + sum(summary.kinds.get(k, 0) for k in AGENT_EVENT_KINDS)
    assert recorded == len(lines)  # each line: recorded, or its refusal


_evaluator_fields = st.fixed_dictionaries(
    {},
    optional={
        "kind": st.one_of(st.sampled_from(["rpc", "rpc_summary", "episode_end", "eval_result", "odd"]), json_values),
        "wall_time": st.one_of(st.floats(0, 2e9), json_values, st.just(1e300)),
        "monotonic": st.one_of(st.floats(-1e6, 1e6), json_values),
        "seq": json_values,
        "endpoint": st.sampled_from(["agent", "harness", 5]),
        "session_id": st.one_of(st.text(max_size=20), st.integers(1000, 3000).map(lambda n: "s" * n)),
        "index": json_values,
        "agent_env_steps_total": json_values,
    },
)


@pytest.mark.fuzz
@fuzz_settings
@given(st.lists(st.one_of(_evaluator_fields.map(_encoded), hostile_json), min_size=1, max_size=8))
def test_fuzz_evaluator_log_line_parser(lines: list[bytes]) -> None:
    run = _Run()
    tail = EvaluatorTail(Path("unused"), run.rec, TASK)
    for line in lines:
        parsed = log_line(line.replace(b"\n", b" "), "evaluator log line")
        assert isinstance(parsed, (str, tuple))
        for piece in tail._lines(line.replace(b"\n", b" ") + b"\n"):
            tail._record(piece)
    verify_chain(run.stream())
