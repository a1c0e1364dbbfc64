"""The evaluator's event log counts environment steps, which the harness checks the step budget against."""

from __future__ import annotations

import io
import json

import grpc
import numpy as np
import pytest
from evaluator_helpers import wait_for_batch

from ale.client import AleEnvError
from ale.env.v1 import env_pb2 as pb
from ale.policy import linear_policy
from ale_evaluator.events import MAX_STRING_CHARS, EventLog


def _summaries(ev) -> list[dict]:
    ev.state.events.close()  # flush pending counters
    return [e for e in map(json.loads, ev.events.getvalue().splitlines()) if e["kind"] == "rpc_summary"]


def test_step_summaries_count_env_steps_and_the_agent_total(evaluator) -> None:
    created = evaluator.agent.create_env(num_envs=8, autoreset_mode=pb.AUTORESET_MODE_SAME_STEP)
    evaluator.agent.reset(created.env_id, seed=1)
    for _ in range(5):
        evaluator.agent.step(created.env_id, np.ones(8, dtype=np.int64))
    harness_env = evaluator.harness.create_env(num_envs=2, autoreset_mode=pb.AUTORESET_MODE_SAME_STEP)
    evaluator.harness.reset(harness_env.env_id, seed=1)
    evaluator.harness.step(harness_env.env_id, np.ones(2, dtype=np.int64))
    steps = [s for s in _summaries(evaluator) if s["method"] == "Step"]
    agent = [s for s in steps if s["endpoint"] == "agent"]
    assert sum(s["env_steps"] for s in agent) == 40
    assert max(s["agent_env_steps_total"] for s in agent) == 40
    harness = [s for s in steps if s["endpoint"] == "harness"]
    assert sum(s["env_steps"] for s in harness) == 2
    assert all("agent_env_steps_total" not in s for s in harness)


def test_refused_steps_count_no_env_steps(evaluator) -> None:
    created = evaluator.agent.create_env(num_envs=1)
    with pytest.raises(AleEnvError):
        evaluator.agent.step(created.env_id, np.ones(1, dtype=np.int64))  # before Reset: refused
    steps = [s for s in _summaries(evaluator) if s["method"] == "Step"]
    assert steps
    assert all(s["env_steps"] == 0 for s in steps)


def _lines(ev) -> list[dict]:
    ev.state.events.close()
    return [json.loads(line) for line in ev.events.getvalue().splitlines()]


FALLING = linear_policy(np.array([[0.0, 0.0, -1.0, 0.0], [0.0, 0.0, 1.0, 0.0]]), output="discrete")


def test_a_1_2_mib_session_id_never_reaches_the_event_log_whole(evaluator) -> None:
    """Issue 10, points 8 and 14: the id is refused at the decoder, and logged cut, not whole."""
    huge = "s" * (1200 * 1024)
    for client in (evaluator.agent, evaluator.harness):
        with pytest.raises(AleEnvError) as info:
            client.get_eval_result(huge)
        assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    raw = evaluator.events.getvalue()
    assert len(raw) < 4096
    calls = [e for e in _lines(evaluator) if e["kind"] == "rpc" and e["method"] == "GetEvalResult"]
    assert [e["code"] for e in calls] == ["INVALID_ARGUMENT", "INVALID_ARGUMENT"]
    for e in calls:
        assert e["session_id"] == "s" * MAX_STRING_CHARS + f"... [{len(huge) - MAX_STRING_CHARS} characters cut]"


def test_every_string_an_event_line_holds_is_cut_to_the_documented_length() -> None:
    stream = io.StringIO()
    log = EventLog(stream)
    log.record("eval_result", session_id="x" * 100_000, nested={"k" * 1000: ["v" * 1000]})
    log.rpc("agent", "Step", "OK", summarise=True, duration_s=0.0, env_id="e" * 50_000)
    log.close()
    lines = stream.getvalue().splitlines()
    assert all(len(line) < 2048 for line in lines)
    first = json.loads(lines[0])
    assert first["session_id"].endswith(f"... [{100_000 - MAX_STRING_CHARS} characters cut]")
    ((key, value),) = first["nested"].items()
    assert len(key) < 300
    assert value[0].startswith("v" * MAX_STRING_CHARS + "... [")
    assert json.loads(lines[1])["env_id"].startswith("e" * MAX_STRING_CHARS + "... [")


def test_agent_batch_steps_count_in_the_agent_total_the_harness_checks(evaluator) -> None:
    """Issue 10, point 10: agent-side batch episodes were not counted (env_steps 0 after ~700k steps)."""
    created = evaluator.agent.create_env(num_envs=4, autoreset_mode=pb.AUTORESET_MODE_SAME_STEP)
    evaluator.agent.reset(created.env_id, seed=1)
    for _ in range(5):
        evaluator.agent.step(created.env_id, np.ones(4, dtype=np.int64))
    batch = evaluator.agent.submit_batch_eval(FALLING, num_episodes=3, seed=7)
    status = wait_for_batch(evaluator.agent, batch.batch_id)
    batch_steps = sum(e.length for e in status.result.episodes)
    assert batch_steps > 3
    assert evaluator.state.budget.used == 20 + batch_steps
    lines = _lines(evaluator)
    progress = [e for e in lines if e["kind"] == "batch_progress"]
    assert progress
    final = progress[-1]
    assert final["batch_id"] == batch.batch_id
    assert (final["state"], final["endpoint"], final["official"]) == ("done", "agent", False)
    assert (final["episodes_done"], final["num_episodes"], final["env_steps"]) == (3, 3, batch_steps)
    assert final["agent_env_steps_total"] == 20 + batch_steps
    assert max(e.get("agent_env_steps_total", 0) for e in lines) == 20 + batch_steps


def test_official_steps_over_the_agent_endpoint_do_not_count_against_the_budget(make_evaluator) -> None:
    ev = make_evaluator(mode="interactive")
    session = ev.harness.start_eval_session(ev.harness.create_env(official=True).env_id, num_episodes=1)
    ev.agent.reset(session.env_id)
    for _ in range(3):
        ev.agent.step(session.env_id, np.ones(1, dtype=np.int64))
    assert ev.state.budget.used == 0
    steps = [s for s in _lines(ev) if s["kind"] == "rpc_summary" and s["method"] == "Step"]
    assert sum(s["env_steps"] for s in steps) == 3, "the steps are logged"
    assert all(s["agent_env_steps_total"] == 0 for s in steps), "but not counted as the agent's"
