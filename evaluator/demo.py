"""A self-contained end-to-end demonstration of the evaluator (the main job until ``ale run`` exists).

It serves a task on two Unix sockets in a temporary folder, plays a few
practice episodes through the agent's gym client, then runs the official
evaluation the way the harness does: an eval session stepped over the agent
endpoint (interactive tasks) or a batch evaluation of a policy artifact (batch
tasks), and reads the authoritative result over the harness endpoint.
The policies here are simple hand-written controllers, not the paper's
methods: they show the path, not a score.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TextIO

import gymnasium as gym
import numpy as np

from ale.catalog import Task
from ale.client import AleEnvClient, RemoteEnv
from ale.env.v1 import env_pb2 as pb
from ale.policy import linear_policy
from ale_evaluator._gym import element_shape
from ale_evaluator.seeds import RunConfig
from ale_evaluator.server import serving, unix_address
from ale_evaluator.service import EvaluatorState

# Hand-tuned linear gains: a = W @ obs (discrete: push right iff positive).
_GAINS: dict[str, np.ndarray] = {
    "cartpole": np.array([[0.0, 0.0, 0.0, 0.0], [0.0, 0.5, 10.0, 2.0]]),
    "inverted_pendulum": np.array([[1.0, 10.0, 0.5, 1.0]]),
}


def demo_policy(task: Task) -> bytes:
    """A linear policy artifact for the task (zeros where no hand-tuned gain exists)."""
    gains = _GAINS.get(task.spec.domain)
    if gains is None:
        from ale_evaluator.envs import make_env

        env = make_env(task)
        gains = np.zeros((int(np.prod(element_shape(env.action_space))), element_shape(env.observation_space)[0]))
        env.close()
    return linear_policy(gains, output="discrete" if task.spec.domain == "cartpole" else "clip")


def _act(task: Task, env: RemoteEnv, obs: np.ndarray) -> np.ndarray | int:
    gains = _GAINS.get(task.spec.domain)
    if gains is None:
        return np.zeros(element_shape(env.action_space), dtype=np.float32)
    y = gains @ obs
    if task.spec.domain == "cartpole":
        return int(np.argmax(y))
    space = env.action_space
    assert isinstance(space, gym.spaces.Box), "the gains other than cartpole's drive a Box action"
    action: np.ndarray = np.clip(y, space.low, space.high).astype(np.float32)
    return action


def _print_result(result: pb.EvalResult, out: TextIO) -> None:
    out.write(
        f"official result: {result.headline_metric} = {result.headline_value:.4f} "
        f"({result.headline_direction} is better), "
        f"{result.passed_episodes}/{result.num_episodes} episodes passed, complete={result.complete}\n"
    )
    for s in result.safety:
        out.write(f"  safety {s.name}: {s.count} events, rate {s.rate:.4f} per episode\n")
    first = result.episodes[0] if result.episodes else None
    if first is not None:
        out.write(
            f"  episode 0: seed commitment {first.seed_commitment.hex()[:16]}..., return {first.episode_return:.2f}\n"
        )


def run_demo(task: Task, workdir: Path, *, episodes: int, out: TextIO) -> int:
    spec = task.spec
    state = EvaluatorState(task, RunConfig.generate())
    agent_addr, harness_addr = unix_address(workdir / "agent.sock"), unix_address(workdir / "harness.sock")
    out.write(f"task {spec.ref}: {spec.title}\n  {spec.genre} genre, {spec.mode} mode, simulator {spec.gym_id}\n")
    with serving(state, agent_address=agent_addr, harness_address=harness_addr):
        out.write(f"evaluator serving: agent endpoint {agent_addr}, harness endpoint {harness_addr}\n")
        # The agent's practice: its own seeds, its own environment.
        env = RemoteEnv(agent_addr)
        started = time.perf_counter()
        steps = 0
        for seed in range(3):
            obs, _ = env.reset(seed=seed)
            total, done = 0.0, False
            while not done:
                obs, reward, terminated, truncated, _ = env.step(_act(task, env, obs))
                total, steps, done = total + reward, steps + 1, terminated or truncated
            out.write(f"practice episode (seed {seed}): return {total:.2f}\n")
        out.write(f"practice: {steps} steps over gRPC at {steps / (time.perf_counter() - started):.0f} steps/s\n")
        env.close()

        # The harness's official evaluation, on hidden seeds.
        harness = AleEnvClient(harness_addr)
        n = episodes or spec.official_episodes
        if spec.mode == "batch":
            batch = harness.submit_batch_eval(demo_policy(task), official=True, num_episodes=n)
            while harness.get_batch_eval_status(batch.batch_id).state in (
                pb.BATCH_STATE_PENDING,
                pb.BATCH_STATE_RUNNING,
            ):
                time.sleep(0.05)
            result = harness.get_eval_result(batch.batch_id, finalize=True)
        else:
            official = harness.create_env(official=True)
            session = harness.start_eval_session(official.env_id, num_episodes=n)
            policy_env = RemoteEnv(agent_addr, env_id=session.env_id)  # the policy holds only the handle
            for _ in range(n):
                obs, _ = policy_env.reset(seed=12345)  # ignored: hidden seeds
                done = False
                while not done:
                    obs, _, terminated, truncated, _ = policy_env.step(_act(task, policy_env, obs))
                    done = terminated or truncated
            policy_env.close()
            result = harness.get_eval_result(session.session_id, finalize=True)
        harness.close()
        _print_result(result, out)
    return 0
