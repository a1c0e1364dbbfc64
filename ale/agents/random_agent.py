"""The random baseline agent: ``python -m ale.agents.random_agent``.

* batch tasks: a random linear policy artifact (``$ALE_WORKSPACE/policy.safetensors``), weights drawn
  i.i.d. normal for the task's observation and action spaces, checked once with a short practice
  batch evaluation on the agent's own seeds;
* interactive tasks: an executable ``$ALE_WORKSPACE/policy`` that plays every episode of the eval
  session with uniformly random actions through :func:`ale.client.run_policy`.

``ALE_AGENT_SEED`` (default 0) seeds the draws, so the baseline is the same run after run.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from ale.agents._common import AgentContext, describe_result, run_main
from ale.policy import linear_policy

PRACTICE_EPISODES = 5
PRACTICE_SEED = 10_000

_SCRIPT = '''
"""Random actions for every episode of the eval session (written by ale.agents.random_agent)."""

import numpy as np

from ale.client import run_policy

KIND = {kind!r}
LOW = np.array({low!r}, dtype=np.float64)
HIGH = np.array({high!r}, dtype=np.float64)
SHAPE = {shape!r}
START, N = {start!r}, {n!r}
rng = np.random.default_rng({seed!r})


def act(obs):
    if KIND == "discrete":
        return int(rng.integers(START, START + N))
    return rng.uniform(LOW, HIGH).reshape(SHAPE).astype(np.float32)


if __name__ == "__main__":
    played = run_policy(act)
    print(f"random policy: played {{played}} episodes", flush=True)
'''


def random_linear_artifact(obs_space: gym.Space[Any], act_space: gym.Space[Any], rng: np.random.Generator) -> bytes:
    """A linear policy with i.i.d. normal weights (scaled by 1/sqrt(inputs)) and zero bias."""
    obs_dim = int(np.prod(obs_space.shape or ()))  # Box and Discrete have a shape (Discrete's is ())
    if isinstance(act_space, gym.spaces.Discrete):
        w = rng.standard_normal((int(act_space.n), obs_dim)) / np.sqrt(obs_dim)
        return linear_policy(w, output="discrete")
    if isinstance(act_space, gym.spaces.Box):
        w = rng.standard_normal((int(np.prod(act_space.shape)), obs_dim)) / np.sqrt(obs_dim)
        return linear_policy(w, output="clip")
    raise SystemExit(f"unsupported action space {act_space}")


def random_policy_script(act_space: gym.Space[Any], seed: int) -> str:
    if isinstance(act_space, gym.spaces.Discrete):
        fields = dict(kind="discrete", low=[], high=[], shape=(), start=int(act_space.start), n=int(act_space.n))
    elif isinstance(act_space, gym.spaces.Box):
        fields = dict(
            kind="box",
            # an unbounded dimension samples from [-1, 1]
            low=np.nan_to_num(np.asarray(act_space.low, dtype=np.float64), neginf=-1.0).ravel().tolist(),
            high=np.nan_to_num(np.asarray(act_space.high, dtype=np.float64), posinf=1.0).ravel().tolist(),
            shape=tuple(int(d) for d in act_space.shape),
            start=0,
            n=0,
        )
    else:
        raise SystemExit(f"unsupported action space {act_space}")
    return _SCRIPT.format(seed=seed, **fields)


def solve(ctx: AgentContext) -> None:
    rng = np.random.default_rng(ctx.seed)
    if ctx.mode == "batch":
        raw = random_linear_artifact(ctx.observation_space, ctx.action_space, rng)
        path = ctx.write_artifact(raw)
        ctx.note(f"wrote a random linear policy ({len(raw)} bytes) to {path}")
        result = ctx.practice_batch_eval(raw, episodes=PRACTICE_EPISODES, seed=PRACTICE_SEED)
        ctx.note(f"practice batch evaluation (own seeds): {describe_result(result)}")
    else:
        path = ctx.write_policy_script(random_policy_script(ctx.action_space, ctx.seed))
        ctx.note(f"wrote {path}: uniformly random actions in {ctx.action_space}, via ale.client.run_policy")


def main() -> int:
    return run_main("random-agent", solve)


if __name__ == "__main__":
    raise SystemExit(main())
