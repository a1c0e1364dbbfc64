"""The evaluator's event log counts environment steps, which the harness checks the step budget against."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ale.client import AleEnvError
from ale.env.v1 import env_pb2 as pb


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
