"""Stepping the copies of a MuJoCo vector env on several threads.

MuJoCo's ``mj_step`` releases the GIL, so K copies can step on every core the evaluator may use. What
each copy computes is unchanged: each runs gymnasium's own code on its own ``MjModel``/``MjData``, so
the result is bit for bit that of stepping the copies one after the other
(tests/test_vector_stepping.py compares them over thousands of steps, resets included).

Two ways, chosen per environment class, because what pays depends on how much Python surrounds the
physics (``bench/evaluator_bench.py`` measures it):

* ``threads`` (Hopper): the copies are cut into one contiguous chunk per thread and each thread runs
  ``env.step`` of its copies. Pays where the physics dominates (Hopper: ~1.7x on two cores).
* ``pendulum`` (InvertedPendulum): its ``step`` is ``do_simulation`` and then a few array operations
  on ``qpos``/``qvel``. Where a step holds so little physics (~20 us), threads running whole
  ``env.step`` calls spend the gain handing the GIL back and forth, so the threads run only each
  copy's own ``do_simulation`` (shape check, ``ctrl``, ``mj_step``, ``mj_rnePostConstraint``) and the
  calling thread then computes the rest of the step for all copies at once, with the expressions of
  ``InvertedPendulumEnv.step``/``_get_obs`` and the ``TimeLimit``/``OrderEnforcing`` wrappers. That
  mirrors gymnasium's code, so it is used only while that code is exactly the code it was written
  from (:func:`pendulum_code_matches`: the syntax trees of those methods, whatever gymnasium
  version is installed); otherwise the copies step one after the other.

Every other class steps its copies one after the other (Reacher, for one, is slower on threads).
"""

from __future__ import annotations

import ast
import contextlib
import functools
import hashlib
import inspect
import os
import textwrap
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import gymnasium as gym
import numpy as np
from gymnasium.error import ResetNeeded

from ale_evaluator._gym import TimeLimited

if TYPE_CHECKING:
    from gymnasium.envs.mujoco.mujoco_env import MujocoEnv

#: The fewest copies for which each way pays. Handing chunks to a helper thread costs ~80-100 us a
#: Step on the 2-core development machine; EnvGroup.step of K copies with and without helpers, side
#: by side: Hopper breaks even at 4 copies and gains 1.26x at 8, 1.5x at 16; InvertedPendulum breaks
#: even at 8 and gains 1.26x at 16.
MIN_PARALLEL_COPIES = {"threads": 6, "pendulum": 12}

#: At most this many threads step one group, the calling thread included.
MAX_STEP_THREADS = 8


#: SHA-256 over the syntax trees of the gymnasium methods the ``pendulum`` way mirrors (gymnasium 1.4.0).
PENDULUM_CODE_SHA256 = "dc1359dd1c074e00ae1b17c79b41e2e9984723a555ff2b6d38cd3f8b783f3257"


@functools.cache
def pendulum_code_sha256() -> str:
    from gymnasium.envs.mujoco.inverted_pendulum_v5 import InvertedPendulumEnv
    from gymnasium.wrappers import OrderEnforcing, TimeLimit

    digest = hashlib.sha256()
    for method in (InvertedPendulumEnv.step, InvertedPendulumEnv._get_obs, TimeLimit.step, OrderEnforcing.step):
        digest.update(ast.dump(ast.parse(textwrap.dedent(inspect.getsource(method)))).encode())
    return digest.hexdigest()


def pendulum_code_matches() -> bool:
    try:
        return pendulum_code_sha256() == PENDULUM_CODE_SHA256
    except (OSError, TypeError, SyntaxError):  # no source to read: nothing to vouch for
        return False


def _class_modes() -> dict[type[gym.Env], str]:
    from gymnasium.envs.mujoco.hopper_v5 import HopperEnv
    from gymnasium.envs.mujoco.inverted_pendulum_v5 import InvertedPendulumEnv

    modes: dict[type[gym.Env], str] = {HopperEnv: "threads"}
    if pendulum_code_matches():
        modes[InvertedPendulumEnv] = "pendulum"
    return modes


def default_step_threads(cpus: Sequence[int] | frozenset[int] | None = None) -> int:
    """One thread per CPU this process may use (the calling thread is one of them), at most 8."""
    n = len(cpus) if cpus is not None else len(os.sched_getaffinity(0))
    return max(1, min(n, MAX_STEP_THREADS))


def init_helper_thread(name: str, cpus: frozenset[int] | None) -> None:
    """Start of a helper thread: the CPUs it may use, and its name where ``top -H`` and ``ps -L`` show
    it (Python names its threads only for itself)."""
    if cpus:
        os.sched_setaffinity(0, cpus)
    with contextlib.suppress(OSError):
        Path(f"/proc/self/task/{threading.get_native_id()}/comm").write_text(name[:15])


class StepPool:
    """The threads that help the calling thread step a group's copies; ``threads`` counts the caller.

    ``cpus``: the CPUs the helper threads may use (the serving threads may keep to one CPU; the
    helpers must not, or they would share it with the thread they help)."""

    def __init__(self, threads: int, cpus: frozenset[int] | None = None) -> None:
        if threads < 1:
            raise ValueError(f"step threads must be at least 1, got {threads}")
        self.threads = threads
        self._pool: ThreadPoolExecutor | None = None
        if threads > 1:
            self._pool = ThreadPoolExecutor(
                max_workers=threads - 1,
                thread_name_prefix="ale-step",
                initializer=init_helper_thread,
                initargs=("ale-step", cpus),
            )

    def run(self, work: Callable[[int, int], None], n: int) -> None:
        """Call ``work(lo, hi)`` over contiguous chunks of ``range(n)``, one per thread, the first on
        the calling thread; return when all are done, raising the first error."""
        chunks = min(self.threads, n)
        if self._pool is None or chunks < 2:
            work(0, n)
            return
        bounds = [n * c // chunks for c in range(chunks + 1)]
        futures: list[Future[None]] = [self._pool.submit(work, bounds[c], bounds[c + 1]) for c in range(1, chunks)]
        try:
            work(bounds[0], bounds[1])
        finally:
            errors = [f.exception() for f in futures]  # waits for every chunk, error or not
        for error in errors:
            if error is not None:
                raise error

    def shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)


def step_each(
    envs: Sequence[gym.Env],
    actions: Sequence[Any],
    obs: np.ndarray,
    rewards: np.ndarray,
    terms: np.ndarray,
    truncs: np.ndarray,
    lo: int,
    hi: int,
) -> None:
    """``env.step`` of copies ``lo`` to ``hi - 1``, each with its action (a row of a Box batch, an
    element of a Discrete one, as gymnasium's SyncVectorEnv hands them out), into row i of each
    output array."""
    for i in range(lo, hi):
        obs[i], rewards[i], terms[i], truncs[i], _ = envs[i].step(actions[i])


class ParallelMujoco:
    """Steps K copies of one MuJoCo environment class on a :class:`StepPool` (see the module)."""

    def __init__(self, envs: list[gym.Env], pool: StepPool) -> None:
        self.envs = envs
        # The copies are what mode_for accepts: TimeLimit(OrderEnforcing(raw)), raw a MujocoEnv of _class_modes.
        self.raws = [cast("MujocoEnv", env.unwrapped) for env in envs]
        self.pool = pool
        mode = self.mode_for(envs)
        assert mode is not None, "ParallelMujoco.mode_for said no"
        self.mode = mode

    @staticmethod
    def mode_for(envs: list[gym.Env]) -> str | None:
        """``"threads"``, ``"pendulum"``, or None where stepping the copies in turn is the way (another
        class, a changed copy, or fewer copies than the way needs to pay)."""
        from gymnasium.wrappers import OrderEnforcing, TimeLimit

        raw_type = type(envs[0].unwrapped)
        mode = _class_modes().get(raw_type)
        if mode is None or len(envs) < MIN_PARALLEL_COPIES[mode]:
            return None
        for env in envs:
            raw = env.unwrapped
            if type(raw) is not raw_type or raw.render_mode is not None:
                return None
            # The copies are what make_env builds; anything else may read the simulation elsewhere.
            if not (type(env) is TimeLimit and type(env.env) is OrderEnforcing and env.env.env is raw):
                return None
            if "do_simulation" in vars(raw) or "step" in vars(raw):  # patched: not the code mirrored
                return None
        return mode

    def step(
        self, actions: np.ndarray, obs: np.ndarray, live: list[int] | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Step copy ``live[j]`` (default: copy j) with ``actions[j]``, writing its observation to
        ``obs[j]``; (reward, terminated, truncated), row j for that copy."""
        envs = self.envs if live is None else [self.envs[i] for i in live]
        raws = self.raws if live is None else [self.raws[i] for i in live]
        n = len(envs)
        rows = list(actions)
        rewards = np.empty(n, dtype=np.float64)
        terms = np.empty(n, dtype=bool)
        truncs = np.empty(n, dtype=bool)

        if self.mode == "threads":
            self.pool.run(functools.partial(step_each, envs, rows, obs, rewards, terms, truncs), n)
            return rewards, terms, truncs

        def simulate_chunk(lo: int, hi: int) -> None:
            for i in range(lo, hi):
                raw = raws[i]
                raw.do_simulation(rows[i], raw.frame_skip)

        limits = cast("list[TimeLimited]", envs)  # as mode_for checked
        for limit in limits:  # OrderEnforcing.step
            if not limit.env._has_reset:
                raise ResetNeeded("Cannot call env.step() before calling env.reset()")
        self.pool.run(simulate_chunk, n)
        # InvertedPendulumEnv.step after do_simulation, for every copy at once.
        for i, raw in enumerate(raws):  # _get_obs: np.concatenate([qpos, qvel]).ravel()
            data = raw.data
            obs[i] = np.concatenate([data.qpos, data.qvel]).ravel()
        terms[:] = ~np.isfinite(obs).all(axis=1) | (np.abs(obs[:, 1]) > 0.2)
        rewards[:] = ~terms  # int(not terminated)
        for i, limit in enumerate(limits):  # TimeLimit.step (the env's own truncated is False)
            limit._elapsed_steps += 1
            truncs[i] = limit._elapsed_steps >= limit._max_episode_steps
        return rewards, terms, truncs
