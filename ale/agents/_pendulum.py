"""pendulum-lqr: least-squares system identification from random exploration, then discrete LQR.

1. Exploration through a :class:`RemoteVectorEnv` (K copies, SAME_STEP autoreset), actions i.i.d.
   uniform in the action box. For a copy whose episode ended in a step, the true next state of
   that transition is ``infos["final_obs"]`` (its row of the observation already starts the next
   episode); nothing is dropped, as the paper asks.
2. Ordinary least squares x' = A x + B u, no intercept.
3. Discrete LQR (Q = I, R = 1) by Riccati iteration.
4. The policy script u = clip(-K x, -3, 3), with K written into it.

Before it starts, the agent writes this module's and :mod:`ale.agents._lqr`'s source into the
workspace (``derivation/``), beside the policy script.
"""

from __future__ import annotations

import sys

import numpy as np

from ale.agents import _lqr
from ale.agents._common import AgentContext, box
from ale.agents._lqr import dlqr
from ale.client import RemoteVectorEnv

NUM_COPIES = 16
TRANSITIONS = 2000
MIN_TRANSITIONS = 200  # the paper: a few hundred transitions or more make the design reliable
CHECK_COPIES = 8

_SCRIPT = '''
"""LQR on an identified linear model: u = clip(-K x, {low}, {high}) (written by ale.agents.demo)."""

import numpy as np

from ale.client import run_policy

K = np.array({gain!r})


def act(obs):
    return np.clip(-K @ np.asarray(obs, dtype=np.float64), {low!r}, {high!r}).astype(np.float32)


if __name__ == "__main__":
    played = run_policy(act)
    print(f"LQR policy: played {{played}} episodes", flush=True)
'''


def explore(ctx: AgentContext, transitions: int = TRANSITIONS, k: int = NUM_COPIES) -> tuple[np.ndarray, ...]:
    """(X, U, X') from uniformly random actions, K copies stepped together."""
    action_space = box(ctx.action_space)
    low = np.asarray(action_space.low, dtype=np.float32)
    high = np.asarray(action_space.high, dtype=np.float32)
    rng = np.random.default_rng(ctx.seed)
    steps = -(-transitions // k)
    ctx.reserve_steps(steps * k)
    env = RemoteVectorEnv(ctx.evaluator, k)
    xs, us, xn = [], [], []
    episodes = 0
    try:
        obs, _ = env.reset(seed=int(rng.integers(2**31)))
        for _ in range(steps):
            # float32 is what the simulator applies, so these are the exact inputs of the model.
            u = rng.uniform(low, high, size=(k, *low.shape)).astype(np.float32)
            nxt, _, terminated, truncated, infos = env.step(u)
            ctx.count_steps(k)
            done = terminated | truncated
            true_next = nxt.copy()
            if done.any():
                true_next[done] = infos["final_obs"][done]
                episodes += int(done.sum())
            xs.append(obs.copy())
            us.append(u.reshape(k, -1).astype(np.float64))
            xn.append(true_next)
            obs = nxt
    finally:
        env.close()
    ctx.log(f"exploration: {steps * k} transitions from {steps} vector steps of {k} copies, {episodes} episodes ended")
    return np.concatenate(xs), np.concatenate(us), np.concatenate(xn)


def identify(x: np.ndarray, u: np.ndarray, x_next: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Least squares x' = A x + B u; returns A, B and the per-component residual RMS."""
    n = x.shape[1]
    z = np.hstack([x, u])
    theta, *_ = np.linalg.lstsq(z, x_next, rcond=None)
    residual = x_next - z @ theta
    return theta[:n].T, theta[n:].T, np.sqrt(np.mean(residual**2, axis=0))


def check(ctx: AgentContext, gain: np.ndarray, k: int = CHECK_COPIES) -> tuple[int, float]:
    """One practice episode per copy with the controller: (episodes that reached the limit, max |cart|)."""
    horizon = int(ctx.spec.max_episode_steps) or 1000
    ctx.reserve_steps(horizon * k)
    action_space = box(ctx.action_space)
    low, high = float(action_space.low[0]), float(action_space.high[0])
    env = RemoteVectorEnv(ctx.evaluator, k)
    finished = np.zeros(k, dtype=bool)
    success = np.zeros(k, dtype=bool)
    max_cart = 0.0
    try:
        obs, _ = env.reset(seed=ctx.seed + 30_000)
        for _ in range(horizon):
            act = np.clip(-(obs @ gain.T), low, high).astype(np.float32)
            obs, _, terminated, truncated, _ = env.step(act)
            ctx.count_steps(k)
            live = ~finished
            max_cart = max(max_cart, float(np.abs(obs[live, 0]).max(initial=0.0)))
            success |= live & truncated & ~terminated
            finished |= terminated | truncated
            if finished.all():
                break
    finally:
        env.close()
    return int(success.sum()), max_cart


def solve(ctx: AgentContext) -> None:
    sources = ctx.write_sources(sys.modules[__name__], _lqr)
    ctx.note(f"wrote the derivation's source: {', '.join(str(p) for p in sources)}")
    # Exploration takes at most half of the step budget; the rest is for the practice check.
    transitions = int(min(TRANSITIONS, ctx.steps_left() // 2) // NUM_COPIES * NUM_COPIES)
    if transitions < MIN_TRANSITIONS:
        ctx.reserve_steps(2 * MIN_TRANSITIONS)  # raises: the budget cannot buy a reliable model
    x, u, x_next = explore(ctx, transitions)
    a, b, rms = identify(x, u, x_next)
    np.set_printoptions(precision=4, suppress=True)
    ctx.note(f"least-squares model from {len(x)} transitions: residual RMS {np.array2string(rms, precision=6)}")
    ctx.log(f"A =\n{a}\nB = {b.ravel()}")
    gain, _, iters = dlqr(a, b, np.eye(a.shape[0]), np.eye(b.shape[1]))
    ctx.note(f"discrete LQR (Q=I, R=1) converged in {iters} Riccati iterations: K = {np.round(gain, 4).tolist()}")
    action_space = box(ctx.action_space)
    low, high = float(action_space.low[0]), float(action_space.high[0])
    path = ctx.write_policy_script(_SCRIPT.format(gain=gain.tolist(), low=low, high=high))
    ctx.note(f"wrote {path}: u = clip(-K x, {low}, {high})")
    horizon = int(ctx.spec.max_episode_steps) or 1000
    if ctx.steps_left() < horizon * CHECK_COPIES:
        ctx.note("practice check skipped: it would not fit in the environment-step budget")
        return
    wins, max_cart = check(ctx, gain)
    ctx.note(
        f"practice check (own seeds): {wins}/{CHECK_COPIES} episodes kept the pole up to the time limit; "
        f"max |cart position| {max_cart:.3f} m"
    )
