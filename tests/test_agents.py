"""The bundled agents, run the way ``ale run`` runs them, then evaluated the way the harness evaluates.

Each agent runs as a subprocess (``python -m ale.agents.demo`` / ``ale.agents.random_agent``)
configured only by the contract's environment variables, against an in-process evaluator's agent
endpoint. The official evaluation then goes through the harness endpoint: a batch evaluation of
``policy.safetensors``, or an eval session played by the executable ``policy`` script with
``ALE_ENV_ID``. Episode counts are kept small so the whole file runs in well under a minute.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from ale import catalog
from ale.agents import _cartpole, _hopper, _lqr, _pendulum, _reacher
from ale.env.v1 import env_pb2 as pb
from ale.policy import load_policy

AGENT_TIMEOUT_S = 60


def run_agent(ev, task_id: str, agent: str, workspace: Path, **extra: str) -> tuple[int, str, list[dict]]:
    """Run ``python -m ale.agents.<agent>`` in the contract's environment; (exit status, stdout, events)."""
    spec = catalog.get_task(task_id).spec
    workspace.mkdir(parents=True, exist_ok=True)
    events_path = workspace.parent / f"{agent}-events.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ALE_")}
    env.update(
        ALE_EVALUATOR=ev.agent_address,
        ALE_TASK_ID=task_id,
        ALE_TASK_VERSION=spec.version,
        ALE_TASK_DIR=str(Path(catalog.__file__).parent / "tasks" / task_id),
        ALE_WORKSPACE=str(workspace),
        ALE_MODE=spec.mode,
        ALE_BUDGET_WALL_TIME_S=str(spec.budgets.wall_time_s),
        ALE_BUDGET_ENV_STEPS=str(spec.budgets.env_steps),
        ALE_BUDGET_LLM_TOKENS=str(spec.budgets.llm_tokens),
        HOME=str(workspace),
    )
    env.update(extra)
    with open(events_path, "wb") as events_file:
        env["ALE_EVENT_FD"] = str(events_file.fileno())
        proc = subprocess.run(
            [sys.executable, "-m", f"ale.agents.{agent}"],
            env=env,
            pass_fds=(events_file.fileno(),),
            capture_output=True,
            text=True,
            timeout=AGENT_TIMEOUT_S,
            check=False,
        )
    events = [json.loads(line) for line in events_path.read_text().splitlines()]
    return proc.returncode, proc.stdout + proc.stderr, events


def official_batch(ev, workspace: Path, num_episodes: int = 0) -> pb.EvalResult:
    raw = (workspace / "policy.safetensors").read_bytes()
    batch = ev.harness.submit_batch_eval(raw, official=True, num_episodes=num_episodes)
    deadline = time.monotonic() + 60
    while ev.harness.get_batch_eval_status(batch.batch_id).state != pb.BATCH_STATE_DONE:
        assert time.monotonic() < deadline, "the official batch evaluation did not finish"
        time.sleep(0.02)
    return ev.harness.get_eval_result(batch.batch_id, finalize=True)


def official_interactive(ev, workspace: Path, num_episodes: int) -> pb.EvalResult:
    """Open an eval session and run ``workspace/policy`` with only the handle, as the harness does."""
    official = ev.harness.create_env(official=True)
    session = ev.harness.start_eval_session(official.env_id, num_episodes=num_episodes)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ALE_")}
    env.update(
        ALE_EVALUATOR=ev.agent_address,
        ALE_ENV_ID=session.env_id,
        ALE_NUM_EPISODES=str(session.num_episodes),
        HOME=str(workspace),
    )
    proc = subprocess.run(
        [str(workspace / "policy")], env=env, capture_output=True, text=True, timeout=AGENT_TIMEOUT_S, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"played {num_episodes} episodes" in proc.stdout
    return ev.harness.get_eval_result(session.session_id, finalize=True)


def check_interactive_policy(workspace: Path) -> None:
    policy = workspace / "policy"
    assert os.access(policy, os.X_OK)
    assert policy.read_text().startswith(f"#!{sys.executable}\n")
    assert not (workspace / "policy.safetensors").exists()


def check_notes(events: list[dict]) -> None:
    assert events, "no events on ALE_EVENT_FD"
    assert all(e["kind"] == "note" and isinstance(e["data"]["text"], str) for e in events)


def agent_run(make_evaluator, tmp_path: Path, task_id: str, agent: str, **extra: str):
    ev = make_evaluator(task_id)
    workspace = tmp_path / "workspace"
    status, output, events = run_agent(ev, task_id, agent, workspace, **extra)
    assert status == 0, output
    check_notes(events)
    return ev, workspace, output, events


# -- the methods' pieces ---------------------------------------------------------------------------


def test_cartpole_riccati_gain_is_the_papers():
    np.testing.assert_allclose(_cartpole.lqr_gain()[0], [-0.910, -2.143, -30.856, -7.879], atol=1e-3)


def test_least_squares_recovers_a_linear_system_and_lqr_stabilises_it():
    rng = np.random.default_rng(1)
    a = np.array([[1.0, 0.04, 0.0], [0.0, 1.02, 0.04], [0.0, 1.1, 0.94]])
    b = np.array([[0.0], [0.01], [-0.75]])
    x = rng.normal(size=(300, 3))
    u = rng.uniform(-3, 3, size=(300, 1))
    a_hat, b_hat, rms = _pendulum.identify(x, u, x @ a.T + u @ b.T)
    np.testing.assert_allclose(a_hat, a, atol=1e-9)
    np.testing.assert_allclose(b_hat, b, atol=1e-9)
    assert np.all(rms < 1e-9)
    gain, _, _ = _lqr.dlqr(a_hat, b_hat, np.eye(3), np.eye(1))
    assert np.max(np.abs(np.linalg.eigvals(a - b @ gain))) < 1.0


def test_reacher_controller_is_still_on_target_and_pulls_towards_it():
    obs = np.zeros(10)
    obs[[0, 1]] = 1.0  # q = (0, 0): the arm along +x, fingertip at (0.21, 0)
    assert np.allclose(_reacher.forward_kinematics(obs), [0.21, 0.0])
    assert np.allclose(_reacher.jt_pd(obs), 0.0)
    obs[9] = -0.05  # the target is 5 cm above the fingertip: both joints turn counter-clockwise
    assert np.all(_reacher.jt_pd(obs) > 0)


def test_ars_normaliser_statistics_merge_batches_exactly():
    rng = np.random.default_rng(2)
    batches = [rng.normal(loc=3.0, scale=[0.5, 2.0, 0.001], size=(n, 3)) for n in (1, 7, 40)]
    stats = _hopper.RunningStats(3)
    for batch in batches:
        stats.add(batch)
    mu, sd = stats.normaliser()
    everything = np.concatenate(batches)
    np.testing.assert_allclose(mu, everything.mean(axis=0))
    np.testing.assert_allclose(sd[:2], everything.std(axis=0, ddof=1)[:2])
    assert sd[2] == 1.0  # below 0.01: replaced by 1


def test_ars_restarts_only_runs_that_stall_short_of_hopping():
    monitor = _hopper.StallMonitor(0)
    assert not monitor.stalled(1.0, 10_000)
    assert not monitor.stalled(1.05, 100_000)  # under a 10 % gain: not progress
    assert monitor.stalled(1.08, 10_000 + _hopper.STALL_STEPS + 1)
    going = _hopper.StallMonitor(0)
    for steps in range(0, 10 * _hopper.STALL_STEPS, _hopper.STALL_STEPS // 2):
        assert not going.stalled(0.5 + steps / _hopper.STALL_STEPS, steps)
    hopping = _hopper.StallMonitor(0)
    assert not hopping.stalled(12.0, 0)
    assert not hopping.stalled(12.0, 10 * _hopper.STALL_STEPS)  # long hops: never restarted


# -- the demo agent: the papers' methods reach their targets ---------------------------------------


def test_demo_cartpole_lqr_balances_every_official_episode(make_evaluator, tmp_path):
    ev, ws, output, _ = agent_run(make_evaluator, tmp_path, "cartpole-balance", "demo")
    assert "K = [-0.90972, -2.14333, -30.85588, -7.87873]" in output
    policy = load_policy((ws / "policy.safetensors").read_bytes())
    assert policy.architecture.output.kind == "discrete"
    result = official_batch(ev, ws)
    assert result.official
    assert result.complete
    assert result.num_episodes == 100
    assert result.headline_value >= 475.0


def test_demo_pendulum_identifies_a_model_and_its_lqr_keeps_the_pole_up(make_evaluator, tmp_path):
    ev, ws, output, _ = agent_run(make_evaluator, tmp_path, "pendulum-lqr", "demo")
    check_interactive_policy(ws)
    assert "least-squares model from 2000 transitions" in output
    assert "8/8 episodes kept the pole up" in output
    result = official_interactive(ev, ws, num_episodes=8)
    assert result.complete
    assert result.passed_episodes == 8
    assert result.headline_value >= 0.9


def test_demo_pendulum_keeps_to_a_small_step_budget(make_evaluator, tmp_path):
    _ev, ws, output, _ = agent_run(make_evaluator, tmp_path, "pendulum-lqr", "demo", ALE_BUDGET_ENV_STEPS="600")
    check_interactive_policy(ws)
    assert "least-squares model from 288 transitions" in output
    assert "practice check skipped" in output
    assert "288 environment steps on the agent endpoint" in output


def test_demo_reacher_jacobian_transpose_reaches_the_target(make_evaluator, tmp_path):
    ev, ws, output, _ = agent_run(make_evaluator, tmp_path, "reacher-jacobian", "demo")
    check_interactive_policy(ws)
    assert "Kp=150.0, Kd=0.2" in output
    result = official_interactive(ev, ws, num_episodes=20)
    assert result.complete
    assert result.passed_episodes == 20
    assert result.headline_value <= 0.03


@pytest.mark.parametrize(
    ("task_id", "modules", "extra"),
    [
        ("pendulum-lqr", (_pendulum, _lqr), {"ALE_BUDGET_ENV_STEPS": "600"}),
        ("reacher-jacobian", (_reacher,), {}),
    ],
)
def test_demo_reproduction_agent_leaves_its_derivation_code_in_the_workspace_not_only_the_policy(
    make_evaluator, tmp_path, task_id, modules, extra
):
    """The judge sees the workspace's snapshot (the artifacts) and the trajectory: with only the
    policy file there, the code that derived the gains stayed in the package and a strict judge
    could not credit it. The demo agent writes the source of its derivation modules, exactly the
    installed files, into ``derivation/``, and the harness's snapshot includes each one whole."""
    from ale.core.judge_input import snapshot_events
    from ale.judge.snapshot import walk

    _ev, ws, output, _ = agent_run(make_evaluator, tmp_path, task_id, "demo", **extra)
    check_interactive_policy(ws)
    expected = {f"derivation/{Path(m.__file__).name}": Path(m.__file__).read_text() for m in modules}
    written = {str(p.relative_to(ws)): p.read_text() for p in (ws / "derivation").iterdir()}
    assert written == expected
    assert "wrote the derivation's source" in output
    entries, unlisted = walk(ws)
    summary, *bodies = snapshot_events(catalog.get_task(task_id).spec.ref, entries, unlisted)
    texts = {b["path"]: "".join(b["text"]) for b in bodies}
    assert {path: texts.get(path) for path in expected} == expected  # whole, not listed only
    assert {f["path"] for f in summary["files"]} == {"policy", *expected}


def test_demo_hopper_ars_leaves_a_normalised_linear_policy_within_its_time(make_evaluator, tmp_path):
    started = time.monotonic()
    ev, ws, output, _ = agent_run(make_evaluator, tmp_path, "hopper-hop", "demo", ALE_DEMO_TIME_S="8")
    assert time.monotonic() - started < 20
    assert "final practice evaluation" in output
    policy = load_policy((ws / "policy.safetensors").read_bytes())
    assert policy.architecture.normalizer is not None
    assert policy.architecture.normalizer.clip == 10.0
    assert [w.shape for w, _, _ in policy.weights] == [(3, 11)]
    assert np.any(policy.weights[0][0] != 0), "no ARS iteration ran"
    assert policy.std is not None
    assert np.all(policy.std >= 1e-2)
    result = official_batch(ev, ws, num_episodes=3)
    assert result.complete
    assert np.isfinite(result.headline_value)


# -- the random baseline: valid policies, clearly worse ------------------------------------------


def test_random_cartpole_is_a_valid_but_poor_linear_policy(make_evaluator, tmp_path):
    ev, ws, _, _ = agent_run(make_evaluator, tmp_path, "cartpole-balance", "random_agent")
    raw = (ws / "policy.safetensors").read_bytes()
    assert load_policy(raw).architecture.output.kind == "discrete"
    result = official_batch(ev, ws)
    assert result.complete
    assert result.headline_value < 400.0


def test_random_hopper_falls(make_evaluator, tmp_path):
    ev, ws, _, _ = agent_run(make_evaluator, tmp_path, "hopper-hop", "random_agent")
    result = official_batch(ev, ws, num_episodes=10)
    assert result.complete
    assert result.headline_value < 0.5
    assert {s.name: s.rate for s in result.safety}["falls"] == 1.0


def test_random_pendulum_never_succeeds(make_evaluator, tmp_path):
    ev, ws, _, _ = agent_run(make_evaluator, tmp_path, "pendulum-lqr", "random_agent")
    check_interactive_policy(ws)
    result = official_interactive(ev, ws, num_episodes=10)
    assert result.complete
    assert result.passed_episodes == 10
    assert result.headline_value == 0.0


def test_random_reacher_ends_far_from_the_target(make_evaluator, tmp_path):
    ev, ws, _, _ = agent_run(make_evaluator, tmp_path, "reacher-jacobian", "random_agent")
    check_interactive_policy(ws)
    result = official_interactive(ev, ws, num_episodes=20)
    assert result.complete
    assert result.passed_episodes == 20
    assert result.headline_value > 0.1


@pytest.mark.parametrize("agent", ["demo", "random_agent"])
def test_agents_refuse_to_run_outside_a_sandbox(agent, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ALE_")}
    proc = subprocess.run(
        [sys.executable, "-m", f"ale.agents.{agent}"], env=env, capture_output=True, text=True, timeout=30, check=False
    )
    assert proc.returncode != 0
    assert "ALE_EVALUATOR is not set" in proc.stderr
