"""reacher-jacobian: the Jacobian-transpose operational-space PD controller of the paper.

tau = J(q)^T (Kp e) - Kd qdot, a = clip(tau, -1, 1), with e = target - fingertip = -(o[8], o[9]),
link lengths l1 = 0.10 m, l2 = 0.11 m and the reported gains Kp = 150, Kd = 0.2. The agent checks
the forward kinematics against the observation and plays a few practice episodes before it writes
the policy script; it writes this module's source into the workspace (``derivation/``) first.
"""

from __future__ import annotations

import inspect
import sys

import numpy as np

from ale.agents._common import AgentContext
from ale.client import RemoteVectorEnv

L1, L2 = 0.10, 0.11
KP, KD = 150.0, 0.2
CHECK_COPIES = 16


def jt_pd(obs: np.ndarray) -> np.ndarray:
    """Jacobian-transpose PD: clip(J(q)^T (KP e) - KD qdot, -1, 1) for a batch [..., 10] of observations."""
    obs = np.asarray(obs, dtype=np.float64)
    q1 = np.arctan2(obs[..., 2], obs[..., 0])
    q2 = np.arctan2(obs[..., 3], obs[..., 1])
    s1, c1 = np.sin(q1), np.cos(q1)
    s12, c12 = np.sin(q1 + q2), np.cos(q1 + q2)
    fx, fy = -KP * obs[..., 8], -KP * obs[..., 9]  # KP (target - fingertip)
    # J = [[-L1 s1 - L2 s12, -L2 s12], [L1 c1 + L2 c12, L2 c12]];  tau = J^T f - KD qdot
    tau1 = (-L1 * s1 - L2 * s12) * fx + (L1 * c1 + L2 * c12) * fy - KD * obs[..., 6]
    tau2 = (-L2 * s12) * fx + (L2 * c12) * fy - KD * obs[..., 7]
    tau: np.ndarray = np.clip(np.stack([tau1, tau2], axis=-1), -1.0, 1.0)
    return tau


def policy_script() -> str:
    """A self-contained policy script: the constants and the source of :func:`jt_pd`, run by run_policy."""
    return f'''
"""Jacobian-transpose operational-space PD controller for Reacher (written by ale.agents.demo)."""

import numpy as np

from ale.client import run_policy

L1, L2 = {L1!r}, {L2!r}
KP, KD = {KP!r}, {KD!r}


{inspect.getsource(jt_pd)}

if __name__ == "__main__":
    played = run_policy(lambda obs: jt_pd(obs).astype(np.float32))
    print(f"J-transpose PD policy: played {{played}} episodes", flush=True)
'''


def forward_kinematics(obs: np.ndarray) -> np.ndarray:
    q1 = np.arctan2(obs[..., 2], obs[..., 0])
    q2 = np.arctan2(obs[..., 3], obs[..., 1])
    return np.stack(
        [L1 * np.cos(q1) + L2 * np.cos(q1 + q2), L1 * np.sin(q1) + L2 * np.sin(q1 + q2)],
        axis=-1,
    )


def check(ctx: AgentContext, k: int = CHECK_COPIES) -> tuple[float, float, float]:
    """Practice episodes, one per copy: (FK residual max, mean final distance, max joint speed)."""
    act = jt_pd
    horizon = int(ctx.spec.max_episode_steps) or 50
    ctx.reserve_steps(horizon * k)
    env = RemoteVectorEnv(ctx.evaluator, k)
    fk_err, speed = 0.0, 0.0
    final = np.full(k, np.nan)
    try:
        obs, _ = env.reset(seed=ctx.seed + 40_000)
        for _ in range(horizon):
            # The observation gives fingertip - target and the target, so the fingertip is known.
            fk_err = max(fk_err, float(np.max(np.abs(forward_kinematics(obs) - (obs[:, 4:6] + obs[:, 8:10])))))
            obs, _, terminated, truncated, infos = env.step(act(obs).astype(np.float32))
            ctx.count_steps(k)
            done = terminated | truncated
            last = np.where(done[:, None], infos.get("final_obs", obs), obs)
            speed = max(speed, float(np.max(np.abs(last[:, 6:8]))))
            newly = done & np.isnan(final)
            final[newly] = np.linalg.norm(last[newly, 8:10], axis=1)
            if not np.isnan(final).any():
                break
    finally:
        env.close()
    return fk_err, float(np.nanmean(final)), speed


def solve(ctx: AgentContext) -> None:
    (source,) = ctx.write_sources(sys.modules[__name__])
    ctx.note(f"wrote the derivation's source: {source}")
    ctx.note(f"Jacobian-transpose PD controller: l1={L1} m, l2={L2} m, Kp={KP}, Kd={KD}")
    fk_err, dist, speed = check(ctx)
    ctx.note(
        f"practice check (own seeds, {CHECK_COPIES} episodes): forward-kinematics residual {fk_err:.2e} m, "
        f"mean final distance {dist:.4f} m, peak joint speed {speed:.1f} rad/s"
    )
    path = ctx.write_policy_script(policy_script())
    ctx.note(f"wrote {path}: a = clip(J(q)^T (Kp e) - Kd qdot, -1, 1)")
