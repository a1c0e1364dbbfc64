"""The network totals (ale.core.network) and how the harness records the gateway's log (ale.runner.tails):
every request is accounted for whatever the trajectory's budgets, and the totals the harness writes
are the ones a verifier recomputes from the stream."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fuzzing import fuzz_settings, hostile_json, json_values
from hypothesis import given
from hypothesis import strategies as st

from ale.core import network
from ale.core.trajectory import verify_chain
from ale.runner.recorder import LineQueue, Recorder
from ale.runner.tails import GatewayTail

TASK = "cartpole-balance@1.0.0"


def _request(i: int, *, decision: str = "allowed", pad: int = 0) -> dict[str, Any]:
    return {
        "kind": "llm_request",
        "wall_time": 1_800_000_000.0 + i,
        "monotonic": 100.0 + i,
        "seq": i + 2,
        "request_id": f"gw-{i}",
        "method": "POST",
        "upstream": "openai",
        "host": "api.openai.com",
        "path": "/v1/chat/completions",
        "status": 200 if decision == "allowed" else 403,
        "decision": decision,
        "reason": None if decision == "allowed" else "path_not_allowed",
        "model": "m",
        "stream": False,
        "bytes_in": 10,
        "bytes_out": 20,
        "duration_ms": 1.0,
        "ttfb_ms": 0.5,
        "usage": {"input_tokens": 100 + i, "output_tokens": 7, "cached_input_tokens": i % 3}
        if decision == "allowed"
        else {"input_tokens": 0, "output_tokens": 0, "cached_input_tokens": 0},
        "messages": [{"role": "user", "content": "m" * pad}],
        "messages_from": 0,
        "continues": None,
        "response": {"text": "r" * pad, "tool_calls": [], "stop": "stop"},
    }


class _Run:
    """A recorder with tiny gateway budgets in the agent phase of a one-task run, lines in memory."""

    def __init__(self, gateway: int, requests: int) -> None:
        self.queue = LineQueue()
        budgets = {"gateway": gateway, "gateway.requests": requests, "agent.stdout": 1 << 20}
        self.rec = Recorder(Path("unused"), self.queue, budgets=budgets)
        self.rec.emit("trusted_harness", "run_started", {"nonce": None, "run_id": "r", "tasks": [TASK]})
        for kind in ("task_started", "evaluator_started", "agent_started"):
            self.rec.emit("trusted_harness", kind, {"task": TASK})
        self.rec.open_channel("gateway", TASK)

    def events(self) -> list[dict[str, Any]]:
        self.rec.close_channel("gateway")
        for kind in ("agent_finished", "official_evaluation_started", "official_evaluation_skipped", "task_finished"):
            self.rec.emit("trusted_harness", kind, {"task": TASK})
        self.rec.emit("trusted_harness", "run_finished", {"tasks": {TASK: "not_completed"}})
        lines, self.queue.pending = self.queue.pending, []
        self.stream = b"".join(lines)
        return [json.loads(line) for line in lines]


def _feed(tail: GatewayTail, lines: list[dict[str, Any]]) -> None:
    data = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
    for piece in tail._lines(data):
        tail._record(piece)


def test_requests_past_every_budget_are_still_accounted_for() -> None:
    """Full events while ``gateway`` has room, the accounting form while ``gateway.requests`` has,
    then only the totals on events_dropped; the stream's totals are every request's."""
    run = _Run(gateway=6000, requests=3000)
    tail = GatewayTail(Path("unused"), run.rec)
    tail.task_ref = TASK
    lines = [_request(i, decision="denied" if i % 5 == 4 else "allowed", pad=500) for i in range(40)]
    _feed(tail, lines)
    events = run.events()
    recorded = [e for e in events if e["kind"] == "llm_request"]
    full = [e for e in recorded if "content_dropped" not in e["data"]]
    stripped = [e for e in recorded if e["data"].get("content_dropped") is True]
    assert full  # all three tiers were used
    assert stripped
    assert len(recorded) < len(lines)
    assert all("messages" not in e["data"] and "response" not in e["data"] for e in stripped)
    assert all(e["data"]["task"] == TASK for e in recorded)
    dropped = {e["data"]["channel"]: e["data"] for e in events if e["kind"] == "events_dropped"}
    assert dropped["gateway"]["events"] == len(lines) - len(full)
    assert dropped["gateway.requests"]["events"] == len(lines) - len(recorded)
    expected = network.tally(("trusted_network_proxy", "llm_request", line) for line in lines)
    assert dropped["gateway.requests"]["totals"]["total"] == len(lines) - len(recorded)
    totals = verify_chain(run.stream).network
    assert totals == expected
    assert totals["total"] == 40
    assert totals["denied"] == 8
    assert totals["input_tokens"] == sum(100 + i for i in range(40) if i % 5 != 4)
    assert totals["cached_input_tokens"] == sum(i % 3 for i in range(40) if i % 5 != 4)
    assert totals["unreadable"] == 0


def test_the_gateways_own_events_are_never_dropped() -> None:
    run = _Run(gateway=1, requests=1)
    tail = GatewayTail(Path("unused"), run.rec)
    base = {"wall_time": 1_800_000_000.0, "monotonic": 1.0}
    _feed(tail, [_request(i, pad=100) for i in range(5)])
    _feed(
        tail,
        [
            {**base, "kind": "budget_exhausted", "seq": 90, "budget": "output_tokens", "used": 9, "limit": 9},
            {**base, "kind": "policy_changed", "seq": 91, "policy": "closed", "phase": "official"},
        ],
    )
    kinds = [e["kind"] for e in run.events() if e["producer"] == "trusted_network_proxy"]
    assert kinds.count("budget_exhausted") == 1
    assert kinds.count("policy_changed") == 1


def test_an_unreadable_gateway_line_is_noted_with_the_open_task_or_none() -> None:
    run = _Run(gateway=1 << 20, requests=1 << 20)
    tail = GatewayTail(Path("unused"), run.rec)
    for piece in tail._lines(b"{not json\n[1, 2]\n"):
        tail._record(piece)
    tail.task_ref = TASK
    for piece in tail._lines(b'{"kind": "llm_request"}\n'):
        tail._record(piece)
    notes = [e["data"] for e in run.events() if e["kind"] == "unreadable_gateway_event"]
    assert len(notes) == 3
    assert "task" not in notes[0]
    assert notes[1]["reason"] == "not a JSON object"
    assert notes[2]["task"] == TASK


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"decision": "allowed", "usage": {"input_tokens": 3, "output_tokens": 4, "cached_input_tokens": 1}}, 1),
        ({"decision": "denied", "usage": {"input_tokens": 0, "output_tokens": 0, "cached_input_tokens": 0}}, 1),
        ({"decision": "allowed", "usage": {"input_tokens": -1, "output_tokens": 0, "cached_input_tokens": 0}}, None),
        ({"decision": "allowed", "usage": {"input_tokens": 1.0, "output_tokens": 0, "cached_input_tokens": 0}}, None),
        ({"decision": "allowed", "usage": {"input_tokens": True, "output_tokens": 0, "cached_input_tokens": 0}}, None),
        ({"decision": "maybe", "usage": {}}, None),
        ({"decision": "allowed", "usage": "lots"}, None),
        ({"decision": "allowed"}, None),
    ],
)
def test_a_requests_share_of_the_totals_or_none(data: dict[str, Any], expected: int | None) -> None:
    totals = network.request_totals(data)
    assert (totals["total"] if totals else None) == expected


def test_dropped_totals_only_of_the_gateway_requests_channel() -> None:
    assert network.dropped_totals({"channel": "agent.stdout", "totals": {"total": 5}}) == {}
    assert network.dropped_totals({"channel": "gateway.requests", "totals": {"total": 5, "denied": 5}}) == {
        "total": 5,
        "allowed": 0,
        "denied": 5,
        "input_tokens": 0,
        "output_tokens": 0,
        "cached_input_tokens": 0,
    }
    assert network.dropped_totals({"channel": "gateway.requests", "totals": {"total": -5}}) is None
    assert network.dropped_totals({"channel": "gateway.requests", "totals": {"bogus": 1}}) is None
    assert network.dropped_totals({"channel": "gateway.requests"}) is None


_TALLIED_PAIRS = {("trusted_network_proxy", "llm_request"), ("trusted_harness", "events_dropped")}
_event_data = st.one_of(
    st.dictionaries(st.sampled_from(["decision", "usage", "channel", "totals"]), json_values),
    st.fixed_dictionaries(
        {
            "decision": st.sampled_from(["allowed", "denied"]),
            "usage": st.dictionaries(st.sampled_from(network.USAGE_FIELDS), json_values),
        }
    ),
    st.fixed_dictionaries(
        {
            "channel": st.just("gateway.requests"),
            "totals": st.dictionaries(st.sampled_from([*network.REQUEST_FIELDS, "x"]), json_values),
        }
    ),
)


@pytest.mark.fuzz
@fuzz_settings
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["trusted_network_proxy", "trusted_harness", "untrusted_agent"]),
            st.sampled_from(["llm_request", "events_dropped", "gateway_started", "stdout"]),
            _event_data,
        ),
        max_size=8,
    )
)
def test_fuzz_the_tally_of_hostile_event_data(events: list[tuple[str, str, Any]]) -> None:
    """Whatever the events' data (a forged trajectory's), the tally is counts: non-negative
    integers, every field present, each unreadable event counted as such, never an exception."""
    totals = network.tally(events)
    assert set(totals) == set(network.FIELDS)
    assert all(type(v) is int and v >= 0 for v in totals.values())
    tallied = [(p, k, d) for p, k, d in events if (p, k) in _TALLIED_PAIRS]
    assert totals["unreadable"] == sum(network.event_totals(p, k, d) is None for p, k, d in tallied)


@pytest.mark.fuzz
@fuzz_settings
@given(
    st.lists(
        st.one_of(
            hostile_json,
            st.builds(
                lambda d: json.dumps({"kind": "llm_request", "wall_time": 1.0, "monotonic": 1.0, **d}).encode(),
                st.dictionaries(st.sampled_from(["decision", "usage", "request_id", "seq"]), json_values),
            ),
        ),
        min_size=1,
        max_size=6,
    )
)
def test_fuzz_gateway_log_lines_give_a_stream_a_verifier_accepts(lines: list[bytes]) -> None:
    """Hostile lines in the gateway's log: each is recorded, refused or noted; the stream verifies."""
    run = _Run(gateway=1 << 20, requests=1 << 20)
    tail = GatewayTail(Path("unused"), run.rec)
    tail.task_ref = TASK
    for line in lines:
        for piece in tail._lines(line.replace(b"\n", b" ") + b"\n"):
            tail._record(piece)
    run.events()
    verify_chain(run.stream)


def test_the_judges_gateway_events_count_in_none_of_the_agents_network_totals() -> None:
    """The faithfulness judge's own gateway (its events carry "gateway": "judge") is the harness's,
    not the agent's: its gateway_started and requests were counted into network_summary.json."""
    from ale.core import network

    request = {"decision": "allowed", "usage": {"input_tokens": 900, "output_tokens": 40, "cached_input_tokens": 0}}
    events = [
        ("trusted_network_proxy", "llm_request", request),
        ("trusted_network_proxy", "llm_request", {**request, "gateway": "judge"}),
    ]
    totals = network.tally(events)
    assert (totals["total"], totals["input_tokens"], totals["output_tokens"]) == (1, 900, 40)
    assert network.agents("trusted_network_proxy", {"gateway": "judge"}) is False
