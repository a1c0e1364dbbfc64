"""cartpole-balance: LQR on the linearised cart-pole, shipped as a discrete linear policy artifact.

The paper's method: linearise the simulator's equations around the upright equilibrium with its
physical constants, discretise with its Euler step, solve the discrete LQR by Riccati iteration
and push right exactly when -K s > 0 (a two-output arg-max head with rows 0 and -K).
"""

from __future__ import annotations

import numpy as np

from ale.agents._common import AgentContext, describe_result
from ale.agents._lqr import dlqr
from ale.policy import linear_policy

# Physical constants and step from the paper (gymnasium CartPole-v1).
GRAVITY, CART_MASS, POLE_MASS, HALF_LENGTH, TAU = 9.8, 1.0, 0.1, 0.5, 0.02
Q = np.diag([1.0, 1.0, 10.0, 1.0])
R = np.array([[1.0]])
PRACTICE_EPISODES = 100
PRACTICE_SEED = 20_000


def linearised_model() -> tuple[np.ndarray, np.ndarray]:
    """(A, B) of s' = A s + B F, the Euler discretisation of the upright linearisation."""
    g, mp, half = GRAVITY, POLE_MASS, HALF_LENGTH
    m = CART_MASS + POLE_MASS
    d = half * (4.0 / 3.0 - mp / m)
    a_c = np.array(
        [
            [0.0, 1.0, 0.0, 0.0],
            [0.0, 0.0, -mp * half * g / (m * d), 0.0],
            [0.0, 0.0, 0.0, 1.0],
            [0.0, 0.0, g / d, 0.0],
        ]
    )
    b_c = np.array([[0.0], [1.0 / m + mp * half / (m * m * d)], [0.0], [-1.0 / (m * d)]])
    return np.eye(4) + TAU * a_c, TAU * b_c


def lqr_gain() -> np.ndarray:
    a, b = linearised_model()
    k, _, _ = dlqr(a, b, Q, R)
    return k


def solve(ctx: AgentContext) -> None:
    k = lqr_gain()
    ctx.note(f"LQR on the linearised cart-pole (Q=diag(1,1,10,1), R=1, tau={TAU}): K = {np.round(k[0], 5).tolist()}")
    # Arg-max head: row 0 scores action 0 (push left), row 1 = -K scores action 1 (push right).
    raw = linear_policy(np.vstack([np.zeros(4), -k[0]]), output="discrete")
    path = ctx.write_artifact(raw)
    ctx.note(f"wrote the discrete linear policy artifact ({len(raw)} bytes) to {path}")
    result = ctx.practice_batch_eval(raw, episodes=PRACTICE_EPISODES, seed=PRACTICE_SEED)
    ctx.note(f"practice batch evaluation (own seeds): {describe_result(result)}")
