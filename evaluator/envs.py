"""Environment copies, eval sessions and their episode bookkeeping.

An :class:`EnvGroup` is K copies of the task's gymnasium environment behind one
env_id. Every method is called with the group's lock held by the service; the
group itself does no locking. A group becomes an *official* environment when
created with ``official=True``: its resets ignore client seeds and draw hidden
ones, and it runs only inside an :class:`EvalSession`.
"""

from __future__ import annotations

import threading
import time
from typing import Any, cast

import attrs
import gymnasium as gym
import numpy as np

from ale.catalog import Task
from ale.core.results import AbortReason
from ale.env.v1 import env_pb2 as pb
from ale_evaluator import episodes
from ale_evaluator._gym import CartPoleBatch, CartPoleCopy, TimeLimited, element_shape
from ale_evaluator.domains import Domain, EpisodeMeter
from ale_evaluator.errors import invalid, precondition
from ale_evaluator.parallel import ParallelMujoco, StepPool, step_each
from ale_evaluator.seeds import RunConfig, commitment, hidden_seed


def make_env(task: Task) -> gym.Env:
    """One copy of the task's environment, exactly as the evaluator runs it."""
    return gym.make(task.spec.gym_id, disable_env_checker=True, **task.spec.gym_kwargs)


def action_shape(space: gym.Space[Any], num_envs: int) -> tuple[int, ...]:
    """The shape of a Step's action tensor: [K, *one copy's action shape] (a Discrete action is a scalar)."""
    return (num_envs, *space.shape) if isinstance(space, gym.spaces.Box) else (num_envs,)


def check_actions(space: gym.Space[Any], shape: tuple[int, ...], action: np.ndarray) -> np.ndarray:
    """Validate a batch of actions of ``shape`` (``action_shape``; the service's tensor decoder
    checks it first) against one copy's space; clip boxes to bounds."""
    if action.shape != shape:
        raise invalid(f"action has shape {list(action.shape)}; expected {list(shape)}")
    if isinstance(space, gym.spaces.Box):
        if action.dtype.kind != "f":
            raise invalid(f"action dtype is {action.dtype}; a Box action space takes float32 or float64")
        if not np.all(np.isfinite(action)):
            raise invalid("action holds NaN or infinity")
        clipped: np.ndarray = np.clip(action, space.low, space.high).astype(space.dtype, copy=False)
        return clipped
    if isinstance(space, gym.spaces.Discrete):
        if action.dtype not in (np.dtype(np.int32), np.dtype(np.int64)):
            raise invalid(f"action dtype is {action.dtype}; a Discrete action space takes int32 or int64")
        lo, hi = int(space.start), int(space.start + space.n)
        values = action.tolist()  # min/max of a short list beat numpy's reductions
        if values and (min(values) < lo or max(values) >= hi):
            raise invalid(f"discrete action out of range [{lo}, {hi})")
        return action.astype(np.int64, copy=False)
    raise invalid(f"unsupported action space {space}")  # pragma: no cover - tasks use Box or Discrete


#: From this many copies on, CartPole groups step as one batch (below, stepping each copy is cheaper).
MIN_BATCHED_COPIES = 16

#: The physical constants a CartPole copy and gymnasium's CartPoleVectorEnv must share.
_CARTPOLE_CONSTANTS = (
    "gravity",
    "masscart",
    "masspole",
    "total_mass",
    "length",
    "polemass_length",
    "force_mag",
    "tau",
    "kinematics_integrator",
    "theta_threshold_radians",
    "x_threshold",
    "_sutton_barto_reward",
)


class BatchedCartPole:
    """Steps K CartPole copies at once with gymnasium's own ``CartPoleVectorEnv`` dynamics.

    ``CartPoleEnv.step`` and ``CartPoleVectorEnv.step`` compute the same expressions, the one on
    scalars and the other on arrays of K, so stepping the batch gives every copy bit for bit the
    state, observation, reward and termination its own ``env.step`` would (the tests compare them
    over thousands of steps). What differs is kept per copy, as ``SyncVectorEnv`` has it: the
    copies' states are gathered before and written back after each step, each copy keeps its
    ``TimeLimit`` count and its own random stream, and resets stay ``env.reset`` of that copy (the
    vector env's own autoreset never fires: no copy is marked done inside it). Used only where the
    copies are exactly ``TimeLimit(OrderEnforcing(CartPoleEnv))`` with the vector env's constants.
    """

    def __init__(self, envs: list[gym.Env]) -> None:
        from gymnasium.envs.classic_control.cartpole import CartPoleVectorEnv

        # The copies are what fits() accepts: TimeLimit(OrderEnforcing(CartPoleEnv)).
        self.limits = cast("list[TimeLimited]", envs)
        self.raws = [cast(CartPoleCopy, env.unwrapped) for env in envs]
        self.vec = cast(
            CartPoleBatch, CartPoleVectorEnv(num_envs=len(envs), max_episode_steps=self.limits[0]._max_episode_steps)
        )

    @staticmethod
    def fits(envs: list[gym.Env]) -> bool:
        from gymnasium.envs.classic_control.cartpole import CartPoleEnv, CartPoleVectorEnv
        from gymnasium.wrappers import OrderEnforcing, TimeLimit

        first = envs[0]
        if not all(
            type(env) is TimeLimit and type(env.env) is OrderEnforcing and type(env.env.env) is CartPoleEnv
            for env in envs
        ):
            return False
        limit = cast(TimeLimited, first)._max_episode_steps  # every copy is a TimeLimit: checked above
        reference = CartPoleVectorEnv(num_envs=1, max_episode_steps=limit)
        return all(
            cast(TimeLimited, env)._max_episode_steps == limit
            and env.unwrapped.render_mode is None
            and all(getattr(env.unwrapped, c) == getattr(reference, c) for c in _CARTPOLE_CONSTANTS)
            for env in envs
        )

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Step every copy with ``actions`` [K]; (observation, reward, terminated, truncated)."""
        vec, raws, limits = self.vec, self.raws, self.limits
        vec.state = np.array([raw.state for raw in raws], dtype=np.float64).T
        vec.steps = np.array([env._elapsed_steps for env in limits], dtype=np.int32)
        vec.prev_done = np.zeros(len(raws), dtype=np.bool_)
        obs, reward, terminated, truncated, _ = vec.step(actions)
        rows = list(vec.state.T.copy())
        for raw, env, row, term in zip(raws, limits, rows, terminated.tolist(), strict=True):
            raw.state = row
            env._elapsed_steps += 1
            if term:  # what CartPoleEnv.step records when the pole has just fallen
                raw.steps_beyond_terminated = 0
        return obs, reward, terminated, truncated


@attrs.define
class StepOutput:
    observation: np.ndarray
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    final_observation: np.ndarray | None
    cost: np.ndarray


@attrs.define(eq=False)
class EnvGroup:
    env_id: str
    task: Task
    domain: Domain
    num_envs: int
    autoreset: pb.AutoresetMode
    official: bool
    owner: str  # the endpoint that created it: "agent" | "harness"
    step_pool: StepPool | None = None  # threads to step MuJoCo copies on (ale_evaluator.parallel)
    envs: list[gym.Env] = attrs.field(init=False)
    action_shape: tuple[int, ...] = attrs.field(init=False)  # of a Step's action tensor
    meters: list[EpisodeMeter | None] = attrs.field(init=False)
    lock: threading.Lock = attrs.field(init=False, factory=threading.Lock)
    last_used: float = attrs.field(init=False, factory=time.monotonic)
    session: EvalSession | None = attrs.field(init=False, default=None)
    closed: str = attrs.field(init=False, default="")  # why, once closed
    batched: BatchedCartPole | None = attrs.field(init=False, default=None)
    parallel: ParallelMujoco | None = attrs.field(init=False, default=None)

    def __attrs_post_init__(self) -> None:
        self.envs = [make_env(self.task) for _ in range(self.num_envs)]
        self.action_shape = action_shape(self.envs[0].action_space, self.num_envs)
        self.meters = [None] * self.num_envs
        if self.num_envs >= MIN_BATCHED_COPIES and BatchedCartPole.fits(self.envs):
            self.batched = BatchedCartPole(self.envs)
        elif self.step_pool is not None and self.step_pool.threads > 1 and ParallelMujoco.mode_for(self.envs):
            self.parallel = ParallelMujoco(self.envs, self.step_pool)

    @property
    def observation_space(self) -> gym.Space[Any]:
        return self.envs[0].observation_space

    @property
    def action_space(self) -> gym.Space[Any]:
        return self.envs[0].action_space

    def close(self, why: str) -> None:
        self.closed = why
        for env in self.envs:
            env.close()
        self.envs = []

    def _obs_batch(self) -> np.ndarray:
        space = self.observation_space
        return np.empty((self.num_envs, *element_shape(space)), dtype=space.dtype)

    def reset(self, seed: int | None) -> np.ndarray:
        """Reset every copy (copy i with ``seed + i``) of a non-official group."""
        obs = self._obs_batch()
        for i, env in enumerate(self.envs):
            obs[i], _ = env.reset(seed=None if seed is None else seed + i)
            self.meters[i] = self.domain.meter(env)
        return obs

    def step(self, action: np.ndarray) -> tuple[StepOutput, list[tuple[int, EpisodeMeter]]]:
        """Step every copy; return the output and the (copy, meter) of episodes that ended."""
        for i, meter in enumerate(self.meters):
            if meter is None:
                raise precondition("Step before Reset: call Reset first")
            if meter.done:
                raise precondition(f"copy {i}: the episode has ended; call Reset (autoreset is disabled)")
        actions = check_actions(self.action_space, self.action_shape, action)
        if self.batched is not None:
            obs, reward, terminated, truncated = self.batched.step(actions)
        elif self.parallel is not None:
            obs = self._obs_batch()
            reward, terminated, truncated = self.parallel.step(actions, obs)
        else:
            obs, reward, terminated, truncated = self._step_copies(actions)
        envs, meters, domain = self.envs, self.meters, self.domain
        final = np.zeros_like(obs) if self.autoreset == pb.AUTORESET_MODE_SAME_STEP else None
        costs = []
        ended: list[tuple[int, EpisodeMeter]] = []
        rows = zip(envs, meters, reward.tolist(), terminated.tolist(), truncated.tolist(), strict=True)
        for i, (env, meter, r, term, trunc) in enumerate(rows):
            assert meter is not None
            costs.append(meter.record_step(env, r, term, trunc))
            if meter.done:
                ended.append((i, meter))
                if final is not None:
                    final[i] = obs[i]
                    obs[i], _ = env.reset()
                    meters[i] = domain.meter(env)
        out = StepOutput(
            observation=obs,
            reward=reward.astype(np.float64, copy=False),
            terminated=terminated,
            truncated=truncated,
            final_observation=final,
            cost=np.array(costs, dtype=np.int64),
        )
        return out, ended

    def _step_copies(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``env.step`` of each copy in turn; (observation, reward, terminated, truncated)."""
        k = self.num_envs
        obs = self._obs_batch()
        rewards, terms, truncs = np.empty(k, dtype=np.float64), np.empty(k, dtype=bool), np.empty(k, dtype=bool)
        step_each(self.envs, list(actions), obs, rewards, terms, truncs, 0, k)
        return obs, rewards, terms, truncs


@attrs.define(eq=False)
class EvalSession:
    """An official evaluation on hidden seeds over one K=1 official group (interactive mode)."""

    session_id: str
    group: EnvGroup
    config: RunConfig
    num_episodes: int
    records: dict[int, episodes.EpisodeRecord] = attrs.Factory(dict)
    started: int = 0  # episodes begun so far
    finalized: bool = False

    def _commitment(self, index: int) -> bytes:
        return commitment(self.config, hidden_seed(self.config, self.group.task.spec.id, index))

    @property
    def running(self) -> int | None:
        """Index of the episode in progress, if any."""
        meter = self.group.meters[0]
        if self.started and meter is not None and not meter.done and (self.started - 1) not in self.records:
            return self.started - 1
        return None

    def progress(self, out: pb.EvalProgress) -> None:
        out.session_id = self.session_id
        out.episode_index = max(self.started - 1, 0)
        out.episodes_done = len(self.records)
        out.num_episodes = self.num_episodes

    def reset(self) -> np.ndarray:
        if self.finalized:
            raise precondition("the eval session is closed")
        if self.started >= self.num_episodes:
            # Refused before anything changes: a running last episode keeps running.
            raise precondition(f"the eval session is complete: all {self.num_episodes} episodes have run")
        running = self.running
        if running is not None:
            self._abort(running, "reset_mid_episode")
        index = self.started
        env = self.group.envs[0]
        obs = self.group._obs_batch()
        obs[0], _ = env.reset(seed=hidden_seed(self.config, self.group.task.spec.id, index))
        self.group.meters[0] = self.group.domain.meter(env)
        self.started += 1
        return obs

    def on_step(self, ended: list[tuple[int, EpisodeMeter]]) -> None:
        for _, meter in ended:
            index = self.started - 1
            if index in self.records:  # a reported record never changes
                continue
            value, success = meter.outcome(self.group.envs[0])
            self.records[index] = episodes.finished(index, self._commitment(index), meter, value, success)

    def _abort(self, index: int, reason: AbortReason) -> None:
        meter = self.group.meters[0] if index == self.started - 1 else None
        self.records[index] = episodes.aborted(index, self._commitment(index), self.group.domain, reason, meter)

    def finalize(self) -> None:
        """Tear down: the running episode and those never started are aborted."""
        if self.finalized:
            return
        running = self.running
        if running is not None:
            self._abort(running, "session_closed")
        for index in range(self.num_episodes):
            if index not in self.records:
                self._abort(index, "not_started")
        self.finalized = True

    def result(self, evaluator_version: str) -> pb.EvalResult:
        spec = self.group.task.spec
        return episodes.build_result(
            records=list(self.records.values()),
            num_episodes=self.num_episodes,
            domain=self.group.domain,
            direction=spec.headline.direction,
            session_id=self.session_id,
            run_id=self.config.run_id,
            task_id=spec.id,
            task_version=spec.version,
            task_digest=self.group.task.digest,
            mode="interactive",
            official=True,
            evaluator_version=evaluator_version,
        )
