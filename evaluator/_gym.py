"""Typed views of the gymnasium internals the evaluator's fast paths read and write.

gymnasium types its public API, not these: ``TimeLimit``'s step count, ``CartPoleEnv``'s
``steps_beyond_terminated`` and ``CartPoleVectorEnv``'s ``state`` start as None and are typed as
None. ``BatchedCartPole`` and ``ParallelMujoco`` first check that the copies are exactly what
``make_env`` builds, ``TimeLimit(OrderEnforcing(raw))``, and then see them through these protocols.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import gymnasium as gym
import numpy as np

if TYPE_CHECKING:
    from gymnasium.wrappers import OrderEnforcing


def element_shape(space: gym.Space[Any]) -> tuple[int, ...]:
    """The shape of one element of ``space``: a Box's shape, () for a Discrete.

    gymnasium types ``Space.shape`` as optional; the spaces the tasks use always have one."""
    shape = space.shape
    if shape is None:
        raise TypeError(f"{space} has no shape")
    return shape


class TimeLimited(Protocol):
    """A copy as ``make_env`` builds it: ``TimeLimit(OrderEnforcing(raw))``, with the step count."""

    env: OrderEnforcing[Any, Any]
    _elapsed_steps: int
    _max_episode_steps: int


class CartPoleCopy(Protocol):
    """The state of one ``CartPoleEnv``, which ``BatchedCartPole`` gathers and writes back."""

    state: np.ndarray
    steps_beyond_terminated: int | None


class CartPoleBatch(Protocol):
    """``CartPoleVectorEnv``: the state of K copies, stepped at once."""

    state: np.ndarray
    steps: np.ndarray
    prev_done: np.ndarray

    def step(self, action: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]: ...
