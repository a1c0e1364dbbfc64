"""The official phase under a hostile agent: it cannot be starved, it has a deadline, and its failures say why.

Issue 10, point 10: an agent queued three 10,000-episode batches and exited; the official batch
sat at 0/3 with no deadline, and the agent's batch steps were not counted (``env_steps`` 0).
Agents are ``python -c`` programs run by the real harness (tests/test_harness_faults.py).
"""

from __future__ import annotations

from test_harness_faults import PENDULUM, _options, _policy, run_harness

from ale import catalog
from ale.runner.harness import OFFICIAL_BASE_S, OFFICIAL_PER_EPISODE_S, official_deadline_s

BALANCING = "linear_policy(np.array([[0.0, 0.0, 0.0, 0.0], [0.0, 0.5, 10.0, 2.0]]), output='discrete')"
AGENT_PRELUDE = (
    "import os, time\n"
    "import numpy as np\n"
    "from ale.client import AleEnvClient\n"
    "from ale.policy import linear_policy\n"
    "c = AleEnvClient(os.environ['ALE_EVALUATOR'])\n"
    f"good = {BALANCING}\n"
    "open('/workspace/policy.safetensors', 'wb').write(good)\n"
)


async def test_an_agent_that_queues_huge_batches_and_exits_cannot_starve_the_official_batch() -> None:
    code = AGENT_PRELUDE + (
        "practice = c.submit_batch_eval(good, num_episodes=4, seed=1)\n"
        "status = c.get_batch_eval_status(practice.batch_id, wait_ms=10000)\n"
        "print('practice steps', sum(e.length for e in status.result.episodes), flush=True)\n"
        "for _ in range(3):\n"
        "    c.submit_batch_eval(good, num_episodes=10000)\n"
        "time.sleep(0.5)\n"  # the first huge batch is running when the agent leaves
    )
    run = await run_harness(_options(code, episodes=3))
    o = run.outcome
    assert o.status == "completed", o.reason
    assert o.result["complete"]
    assert o.result["num_episodes"] == 3
    practice_steps = int(next(t for t in run.stdout() if t.startswith("practice steps")).split()[-1])
    assert practice_steps == 4 * 500
    assert o.agent["env_steps"] >= practice_steps, "the agent's batch steps count against its budget"
    progress = run.of("batch_progress", "trusted_evaluator")
    agent_final = [p for p in progress if p["endpoint"] == "agent" and p["state"] == "failed"]
    assert len(agent_final) == 3, "the three huge batches end with the agent's phase"
    assert {p["error"] for p in agent_final} == {"cancelled: the agent phase is over (the official evaluation started)"}
    assert all(p["episodes_done"] < 10_000 for p in agent_final)
    official = [p for p in progress if p["official"]]
    assert official[-1]["state"] == "done"


async def test_an_official_batch_past_its_deadline_is_finalized_with_a_clear_reason() -> None:
    run = await run_harness(_options(AGENT_PRELUDE, episodes=10_000, eval_time_s=0.5))  # 5 M steps: many seconds
    o = run.outcome
    assert o.status == "not_completed"
    assert o.reason.startswith("the official evaluation passed its deadline of 0.5 s with "), o.reason
    assert o.result is not None
    assert not o.result["complete"]
    (finished,) = run.of("task_finished", "trusted_harness")
    assert finished["reason"] == o.reason
    (official,) = [p for p in run.of("batch_progress", "trusted_evaluator") if p["official"]][-1:]
    assert official["state"] == "failed"
    assert official["error"] == "cancelled: the harness finalized the evaluation before it finished"


async def test_an_interactive_policy_past_the_deadline_is_stopped_with_a_clear_reason() -> None:
    body = (
        "env = RemoteEnv(os.environ['ALE_EVALUATOR'], env_id=os.environ['ALE_ENV_ID'])\nimport time\ntime.sleep(600)\n"
    )
    run = await run_harness(_options(_policy(body), task=PENDULUM, episodes=2, eval_time_s=1.0))
    o = run.outcome
    # The session is finalized: every episode is recorded (aborted ones score the worst value).
    assert o.status == "completed"
    assert o.result["complete"]
    assert o.result["passed_episodes"] == 0
    assert o.reason == (
        "the official evaluation passed its deadline of 1 s with 0 of 2 episodes done; 2 of 2 episodes were aborted"
    )
    (finished,) = run.of("policy_finished")
    assert finished["stopped_for"] == "wall_time"
    (task_finished,) = run.of("task_finished", "trusted_harness")
    assert task_finished["reason"] == o.reason


def test_the_official_deadline_is_derived_from_the_task_and_never_exceeds_its_wall_time_budget() -> None:
    for task in catalog.tasks().values():
        n = task.spec.official_episodes
        expected = min(task.spec.budgets.wall_time_s, OFFICIAL_BASE_S + OFFICIAL_PER_EPISODE_S * n)
        assert official_deadline_s(task, n) == expected
        assert official_deadline_s(task, 10_000) == task.spec.budgets.wall_time_s
        assert official_deadline_s(task, n, 7.5) == 7.5
