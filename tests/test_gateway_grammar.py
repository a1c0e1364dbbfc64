"""The grammar's rows for the LLM gateway (producer ``trusted_network_proxy``): no longer reserved,
five kinds while the run is open, each request and each exhausted budget recorded once per task."""

from __future__ import annotations

from typing import Any

import pytest

from ale.core import grammar

PROXY = "trusted_network_proxy"
TASK = "cartpole-balance@1.0.0"


def _state(until: str = "agent_started") -> grammar.GrammarState:
    state = grammar.GrammarState()
    steps = [
        ("run_started", {"tasks": [TASK]}),
        ("task_started", {"task": TASK}),
        ("evaluator_started", {"task": TASK}),
        ("agent_started", {"task": TASK}),
        ("agent_finished", {"task": TASK}),
        ("official_evaluation_started", {"task": TASK}),
        ("eval_session_opened", {"task": TASK}),
    ]
    for line, (kind, data) in enumerate(steps, 1):
        assert state.event(line, "trusted_harness", kind, data) is None
        if kind == until:
            break
    return state


def _feed(state: grammar.GrammarState, kind: str, data: dict[str, Any]) -> grammar.GrammarFault | None:
    return state.event(100, PROXY, kind, data)


def test_network_proxy_is_no_longer_a_reserved_producer() -> None:
    assert PROXY not in grammar.RESERVED_PRODUCERS
    assert grammar.KINDS[PROXY] == {
        "gateway_started", "llm_request", "policy_changed", "budget_exhausted", "gateway_stopped",
    }  # fmt: skip


@pytest.mark.parametrize("until", ["run_started", "agent_started", "agent_finished", "eval_session_opened"])
@pytest.mark.parametrize(
    ("kind", "data"),
    [
        ("gateway_started", {"upstreams": [], "policy": "open", "budgets": {}}),
        ("llm_request", {"request_id": "gw-1", "status": 200}),
        ("policy_changed", {"policy": "closed", "phase": "official_evaluation"}),
        ("budget_exhausted", {"budget": "output_tokens", "used": 10, "limit": 10}),
        ("gateway_stopped", {"requests": {}, "usage": {}}),
    ],
)
def test_gateway_events_may_occur_while_the_run_is_open(until: str, kind: str, data: dict[str, Any]) -> None:
    assert _feed(_state(until), kind, data) is None


def test_gateway_event_before_run_started_is_out_of_order() -> None:
    fault = _feed(grammar.GrammarState(), "llm_request", {"request_id": "gw-1"})
    assert fault is not None
    assert fault.reason == grammar.OUT_OF_ORDER


def test_llm_request_recorded_twice_is_a_duplicate_event() -> None:
    state = _state()
    assert _feed(state, "llm_request", {"request_id": "gw-1"}) is None
    assert _feed(state, "llm_request", {"request_id": "gw-2"}) is None
    fault = _feed(state, "llm_request", {"request_id": "gw-1"})
    assert fault is not None
    assert fault.reason == grammar.DUPLICATE_EVENT


def test_budget_exhausted_twice_for_one_budget_is_a_duplicate_event() -> None:
    state = _state()
    assert _feed(state, "budget_exhausted", {"budget": "requests"}) is None
    assert _feed(state, "budget_exhausted", {"budget": "output_tokens"}) is None
    fault = _feed(state, "budget_exhausted", {"budget": "requests"})
    assert fault is not None
    assert fault.reason == grammar.DUPLICATE_EVENT


@pytest.mark.parametrize(
    ("kind", "data"),
    [("llm_request", {}), ("llm_request", {"request_id": 7}), ("budget_exhausted", {"budget": None})],
)
def test_gateway_event_without_its_key_is_a_bad_key(kind: str, data: dict[str, Any]) -> None:
    fault = _feed(_state(), kind, data)
    assert fault is not None
    assert fault.reason == grammar.BAD_KEY


@pytest.mark.parametrize(
    ("kind", "reason"),
    [
        ("request", grammar.FORBIDDEN_KIND),
        ("reasoning", grammar.HIDDEN_REASONING),
        ("thinking_block", grammar.HIDDEN_REASONING),
    ],
)
def test_gateway_kinds_outside_the_rows_are_refused(kind: str, reason: str) -> None:
    assert grammar.refusal(PROXY, kind) is not None
    fault = _feed(_state(), kind, {})
    assert fault is not None
    assert fault.reason == reason
