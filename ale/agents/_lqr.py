"""Discrete-time LQR by Riccati iteration (shared by the cart-pole and pendulum solvers)."""

from __future__ import annotations

import numpy as np


def dlqr(
    a: np.ndarray, b: np.ndarray, q: np.ndarray, r: np.ndarray, *, max_iters: int = 10_000, tol: float = 1e-10
) -> tuple[np.ndarray, np.ndarray, int]:
    """Iterate P <- Q + A'PA - A'PB (R + B'PB)^-1 B'PA from P = Q to a fixed point.

    Returns the gain K = (R + B'PB)^-1 B'PA (the control is u = -K x), P and the iterations used.
    """
    p = q.copy()
    it = 0
    while it < max_iters:
        it += 1
        k = np.linalg.solve(r + b.T @ p @ b, b.T @ p @ a)
        p_next = q + a.T @ p @ a - a.T @ p @ b @ k
        if not np.all(np.isfinite(p_next)):
            raise ArithmeticError("the Riccati iteration diverged (is (A, B) stabilisable?)")
        done = float(np.max(np.abs(p_next - p))) < tol
        p = p_next
        if done:
            break
    k = np.linalg.solve(r + b.T @ p @ b, b.T @ p @ a)
    return k, p, it
