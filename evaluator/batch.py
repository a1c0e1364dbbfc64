"""Batch-mode evaluation: a declarative policy run in-process, episode by episode.

The evaluator never executes agent code: the artifact is data that
:mod:`ale.policy` turns into a feed-forward network. Jobs run one at a time on
a worker thread of their endpoint (the harness's jobs never queue behind the
agent's); progress and the result are read through the service. A job is
stopped with :meth:`BatchJob.stop`, which says why: the episodes in flight are
aborted and the job ends FAILED with that reason.

Where the task's copies can be stepped together (CartPole as one batch, Hopper and
InvertedPendulum on several threads: ``BatchedCartPole``, ``ParallelMujoco``), up to
``LOCKSTEP_SLOTS`` episodes run side by side; every episode is still exactly the one
the sequential loop would run (tests/test_vector_stepping.py).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from math import isfinite
from typing import Any

import attrs
import gymnasium as gym
import numpy as np

from ale.catalog import Task
from ale.env.v1 import env_pb2 as pb
from ale.policy import Policy, PolicyError, PolicyOutputError
from ale_evaluator import episodes
from ale_evaluator._gym import element_shape
from ale_evaluator.domains import Domain, EpisodeMeter
from ale_evaluator.envs import MIN_BATCHED_COPIES, BatchedCartPole, make_env
from ale_evaluator.parallel import ParallelMujoco, StepPool, step_each
from ale_evaluator.seeds import RunConfig, commitment, hidden_seed

log = logging.getLogger(__name__)

#: Episodes a batch runs side by side where its task's copies step together (BatchJob._run_lockstep).
LOCKSTEP_SLOTS = 32

#: (live slots, their actions) -> (slot, observation, reward, terminated, truncated) of each live slot.
Stepper = Callable[[list[int], np.ndarray], list[tuple[int, np.ndarray, float, bool, bool]]]


def action_bounds(space: gym.Space[Any]) -> tuple[np.ndarray | None, np.ndarray | None, int, np.dtype[Any]]:
    """(low, high, start, dtype) of the actions :meth:`Policy.act` gives for ``space``: a Box's
    float64 bounds and its dtype, or a Discrete's start (its actions are int64)."""
    if isinstance(space, gym.spaces.Discrete):
        return None, None, int(space.start), np.dtype(np.int64)
    if not isinstance(space, gym.spaces.Box):
        raise TypeError(f"unsupported action space {space}")  # check_policy_fits admits Box and Discrete
    return space.low.astype(np.float64), space.high.astype(np.float64), 0, space.dtype


def check_policy_fits(policy: Policy, task: Task) -> None:
    """Raise PolicyError unless the policy's input and output fit the task's spaces."""
    env = make_env(task)
    try:
        obs_space, act_space = env.observation_space, env.action_space
    finally:
        env.close()
    if not isinstance(obs_space, gym.spaces.Box) or len(obs_space.shape) != 1:
        raise PolicyError("batch policies need a flat Box observation space")
    if policy.architecture.observation_dim != obs_space.shape[0]:
        raise PolicyError(
            f"policy takes {policy.architecture.observation_dim} observations; the task gives {obs_space.shape[0]}"
        )
    kind = policy.architecture.output.kind
    if isinstance(act_space, gym.spaces.Discrete):
        if kind != "discrete" or policy.output_dim != act_space.n:
            raise PolicyError(f"the task's actions are Discrete({act_space.n}): the policy needs {act_space.n} outputs")
    elif isinstance(act_space, gym.spaces.Box) and (
        kind != "box" or policy.output_dim != int(np.prod(act_space.shape))
    ):
        raise PolicyError(
            f"the task's actions are a Box of shape {list(act_space.shape)}: use a box output of that size"
        )


@attrs.define(eq=False)
class BatchJob:
    batch_id: str
    task: Task
    domain: Domain
    policy: Policy
    num_episodes: int
    official: bool
    owner: str
    config: RunConfig
    base_seed: int = 0
    state: pb.BatchState = pb.BATCH_STATE_PENDING
    error: str = ""
    records: list[episodes.EpisodeRecord] = attrs.Factory(list)
    cancel: threading.Event = attrs.Factory(threading.Event)
    cancel_reason: str = "cancelled: the evaluator is shutting down"
    finished: threading.Event = attrs.Factory(threading.Event)
    on_record: Callable[[episodes.EpisodeRecord], None] | None = None
    on_finish: Callable[[], None] | None = None  # after the last record, before ``finished`` is set
    step_pool: StepPool | None = None  # threads that may step MuJoCo copies side by side
    env_steps: int = 0  # environment steps of the recorded episodes
    last_progress: float = 0.0  # monotonic time of its last progress event
    # How the job ends, published to ``state`` and ``error`` once ``on_finish`` has run.
    _outcome: tuple[pb.BatchState, str] = (pb.BATCH_STATE_FAILED, "internal evaluator error during the batch")
    _stop_lock: threading.Lock = attrs.Factory(threading.Lock)

    def seed(self, index: int) -> int:
        if self.official:
            return hidden_seed(self.config, self.task.spec.id, index)
        return (self.base_seed + index) % (1 << 64)

    @property
    def active(self) -> bool:
        return self.state in (pb.BATCH_STATE_PENDING, pb.BATCH_STATE_RUNNING)

    def stop(self, reason: str) -> None:
        """Stop the job (the first reason given is the one it reports); a finished job stays as it is."""
        with self._stop_lock:
            if not self.cancel.is_set():
                self.cancel_reason = reason
                self.cancel.set()

    def run(self) -> None:
        """Run every episode; called on the worker thread."""
        try:
            if self.cancel.is_set():  # stopped while it waited in the queue: nothing to build
                self._end(pb.BATCH_STATE_FAILED, self.cancel_reason)
            else:
                self._run()
        finally:
            # The end becomes visible only once it is logged: no reader sees DONE before the last event.
            try:
                if self.on_finish is not None:
                    self.on_finish()
            finally:
                self.state, self.error = self._outcome
                self.finished.set()

    def _end(self, state: pb.BatchState, error: str = "") -> None:
        self._outcome = (state, error)

    @property
    def ending(self) -> tuple[pb.BatchState, str]:
        """(state, error) the job ends with; what ``on_finish`` reports before it is published."""
        return self._outcome

    def _run(self) -> None:
        self.state = pb.BATCH_STATE_RUNNING
        slots = min(self.num_episodes, LOCKSTEP_SLOTS)
        envs: list[gym.Env] = []
        try:
            envs.append(make_env(self.task))
            # More copies only for a task that steps in lockstep, never to find out.
            if self._lockstep_fits(envs, slots):
                envs += [make_env(self.task) for _ in range(slots - 1)]
        except Exception:  # pragma: no cover - the task's own environment failed to build
            log.exception("batch %s: could not build the environment", self.batch_id)
            self._end(pb.BATCH_STATE_FAILED, "the evaluator could not build the environment")
            for env in envs:
                env.close()
            return
        try:
            stepper = self._stepper(envs) if len(envs) > 1 else None
            if stepper is not None:
                self._run_lockstep(envs, stepper)
            else:
                self._run_sequential(envs[0])
        except Exception:
            log.exception("batch %s failed", self.batch_id)
            self._end(pb.BATCH_STATE_FAILED, "internal evaluator error during the batch")
        finally:
            for env in envs:
                env.close()

    def _lockstep_fits(self, envs: list[gym.Env], slots: int) -> bool:
        """Whether ``slots`` copies like ``envs[0]`` would step together (judged on the one copy)."""
        if slots >= MIN_BATCHED_COPIES and BatchedCartPole.fits(envs):
            return True
        pool = self.step_pool
        return pool is not None and pool.threads > 1 and ParallelMujoco.mode_for(envs * slots) is not None

    def _stepper(self, envs: list[gym.Env]) -> Stepper | None:
        """How the copies step side by side: None where they do not (the episodes then run in turn)."""
        space = envs[0].observation_space
        shape = element_shape(space)
        if BatchedCartPole.fits(envs):
            batched = BatchedCartPole(envs)

            def step_cartpole(live: list[int], actions: np.ndarray) -> list[tuple[int, np.ndarray, float, bool, bool]]:
                if len(live) == len(envs):
                    o, r, term, trunc = batched.step(actions)
                    return list(zip(live, o, r.tolist(), term.tolist(), trunc.tolist(), strict=True))
                # The last episodes: fewer than the slots, each copy stepped on its own.
                n = len(live)
                o = np.empty((n, *shape), dtype=space.dtype)
                r, term, trunc = np.empty(n, dtype=np.float64), np.empty(n, dtype=bool), np.empty(n, dtype=bool)
                step_each([envs[i] for i in live], list(actions), o, r, term, trunc, 0, n)
                return list(zip(live, o, r.tolist(), term.tolist(), trunc.tolist(), strict=True))

            return step_cartpole
        if self.step_pool is not None and self.step_pool.threads > 1 and ParallelMujoco.mode_for(envs):
            parallel = ParallelMujoco(envs, self.step_pool)

            def step_mujoco(live: list[int], actions: np.ndarray) -> list[tuple[int, np.ndarray, float, bool, bool]]:
                o = np.empty((len(live), *shape), dtype=space.dtype)
                r, term, trunc = parallel.step(actions, o, live)
                return list(zip(live, o, r.tolist(), term.tolist(), trunc.tolist(), strict=True))

            return step_mujoco
        return None

    def _add(self, record: episodes.EpisodeRecord) -> None:
        self.records.append(record)
        self.env_steps += record.length
        if self.on_record is not None:
            self.on_record(record)

    def _run_sequential(self, env: gym.Env) -> None:
        for index in range(self.num_episodes):
            if self.cancel.is_set():
                self._end(pb.BATCH_STATE_FAILED, self.cancel_reason)
                return
            self._add(self._episode(env, index))
        self._end(pb.BATCH_STATE_DONE)

    def _run_lockstep(self, envs: list[gym.Env], step: Stepper) -> None:  # noqa: C901 - the batch hot loop, bit-identity tested
        """Up to LOCKSTEP_SLOTS episodes side by side, their copies stepped together by ``step``.

        Every episode is exactly the one :meth:`_episode` would run: its own copy reset with its own
        seed, the policy asked for one observation at a time (as there, so the actions are the same
        bits, and a non-finite output or action aborts that episode alone), the copies stepped bit for bit
        as ``env.step`` (tested), the same meter. A slot whose episode ends starts the next index.
        Episodes finish out of index order; the result is ordered by index. Cancelled, every episode
        in flight is aborted.
        """
        discrete = isinstance(envs[0].action_space, gym.spaces.Discrete)
        low, high, start, dtype = action_bounds(envs[0].action_space)
        act, cancelled = self.policy.act, self.cancel.is_set
        next_index = 0
        slots: list[tuple[int, bytes, EpisodeMeter] | None] = [None] * len(envs)
        obs = np.empty((len(envs), *element_shape(envs[0].observation_space)), dtype=envs[0].observation_space.dtype)

        def begin(i: int) -> None:
            nonlocal next_index
            if next_index >= self.num_episodes:
                slots[i] = None
                return
            index, next_index = next_index, next_index + 1
            obs[i], commit, meter = self._begin(envs[i], index)
            slots[i] = (index, commit, meter)

        for i in range(len(envs)):
            begin(i)
        while any(slot is not None for slot in slots):
            if cancelled():
                for slot in slots:
                    if slot is not None:
                        self._add(episodes.aborted(slot[0], slot[1], self.domain, "session_closed", slot[2]))
                self._end(pb.BATCH_STATE_FAILED, self.cancel_reason)
                return
            live, chosen = [], []
            for i, slot in enumerate(slots):
                if slot is None:
                    continue
                try:
                    action = act(obs[i][None, :], low, high, start)[0]
                except PolicyOutputError:
                    action = None
                if action is None or (not discrete and not all(map(isfinite, action.tolist()))):
                    self._add(episodes.aborted(slot[0], slot[1], self.domain, "policy_error", slot[2]))
                    begin(i)  # its next episode steps from the next round on
                    continue
                live.append(i)
                chosen.append(action)
            if not live:
                continue
            for i, o, r, term, trunc in step(live, np.array(chosen).astype(dtype, copy=False)):
                slot = slots[i]
                assert slot is not None  # step answers for live slots only
                index, commit, meter = slot
                obs[i] = o
                meter.record_step(envs[i], r, term, trunc)
                if meter.done:
                    value, success = meter.outcome(envs[i])
                    self._add(episodes.finished(index, commit, meter, value, success))
                    begin(i)
        self._end(pb.BATCH_STATE_DONE)

    def _begin(self, env: gym.Env, index: int) -> tuple[np.ndarray, bytes, EpisodeMeter]:
        """Episode ``index`` starts: its copy reset with its seed; (observation, commitment, meter)."""
        seed = self.seed(index)
        obs, _ = env.reset(seed=seed)
        return obs, commitment(self.config, seed), self.domain.meter(env)

    def _episode(self, env: gym.Env, index: int) -> episodes.EpisodeRecord:
        obs, commit, meter = self._begin(env, index)
        discrete = isinstance(env.action_space, gym.spaces.Discrete)
        low, high, start, dtype = action_bounds(env.action_space)
        # Looked up once per episode: this loop runs once per environment step.
        act, step, record, cancelled = self.policy.act, env.step, meter.record_step, self.cancel.is_set
        while not meter.done:
            if cancelled():
                return episodes.aborted(index, commit, self.domain, "session_closed", meter)
            try:
                action = act(obs[None, :], low, high, start)[0]
            except PolicyOutputError:  # a non-finite output, whatever the output kind
                return episodes.aborted(index, commit, self.domain, "policy_error", meter)
            if not discrete:
                # A finite output can still map to a non-finite action (tanh into a box of huge bounds).
                if not all(map(isfinite, action.tolist())):  # math.isfinite: same test, far cheaper on a few floats
                    return episodes.aborted(index, commit, self.domain, "policy_error", meter)
                action = action.astype(dtype)
            # A Discrete action stays a numpy int64, as a vector env hands it to its copies.
            obs, reward, terminated, truncated, _ = step(action)
            record(env, reward, terminated, truncated)
        value, success = meter.outcome(env)
        return episodes.finished(index, commit, meter, value, success)

    def result(self, evaluator_version: str) -> pb.EvalResult:
        spec = self.task.spec
        return episodes.build_result(
            records=list(self.records),
            num_episodes=self.num_episodes,
            domain=self.domain,
            direction=spec.headline.direction,
            session_id=self.batch_id,
            run_id=self.config.run_id,
            task_id=spec.id,
            task_version=spec.version,
            task_digest=self.task.digest,
            mode="batch",
            official=self.official,
            evaluator_version=evaluator_version,
        )
