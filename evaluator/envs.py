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

import attrs
import gymnasium as gym
import numpy as np
from ale_evaluator import episodes
from ale_evaluator.domains import Domain, EpisodeMeter
from ale_evaluator.errors import invalid, precondition
from ale_evaluator.seeds import RunConfig, commitment, hidden_seed

from ale.catalog import Task
from ale.env.v1 import env_pb2 as pb


def make_env(task: Task) -> gym.Env:
    """One copy of the task's environment, exactly as the evaluator runs it."""
    return gym.make(task.spec.gym_id, disable_env_checker=True, **task.spec.gym_kwargs)


def check_actions(space: gym.Space, num_envs: int, action: np.ndarray) -> np.ndarray:
    """Validate a batch of actions against one copy's space; clip boxes to bounds."""
    if isinstance(space, gym.spaces.Box):
        expected = (num_envs, *space.shape)
        if action.shape != expected:
            raise invalid(
                f"action has shape {list(action.shape)}; expected {list(expected)} "
                f"(num_envs={num_envs}, action space shape {list(space.shape)})"
            )
        if action.dtype.kind != "f":
            raise invalid(f"action dtype is {action.dtype}; a Box action space takes float32 or float64")
        if not np.all(np.isfinite(action)):
            raise invalid("action holds NaN or infinity")
        return np.clip(action, space.low, space.high).astype(space.dtype, copy=False)
    if isinstance(space, gym.spaces.Discrete):
        if action.shape != (num_envs,):
            raise invalid(f"action has shape {list(action.shape)}; expected [{num_envs}] for a Discrete space")
        if action.dtype not in (np.dtype(np.int32), np.dtype(np.int64)):
            raise invalid(f"action dtype is {action.dtype}; a Discrete action space takes int32 or int64")
        lo, hi = int(space.start), int(space.start + space.n)
        values = action.tolist()  # min/max of a short list beat numpy's reductions
        if values and (min(values) < lo or max(values) >= hi):
            raise invalid(f"discrete action out of range [{lo}, {hi})")
        return action.astype(np.int64, copy=False)
    raise invalid(f"unsupported action space {space}")  # pragma: no cover - tasks use Box or Discrete


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
    autoreset: int
    official: bool
    owner: str  # the endpoint that created it: "agent" | "harness"
    envs: list[gym.Env] = attrs.field(init=False)
    meters: list[EpisodeMeter | None] = attrs.field(init=False)
    lock: threading.Lock = attrs.field(init=False, factory=threading.Lock)
    last_used: float = attrs.field(init=False, factory=time.monotonic)
    session: EvalSession | None = attrs.field(init=False, default=None)
    closed: str = attrs.field(init=False, default="")  # why, once closed

    def __attrs_post_init__(self) -> None:
        self.envs = [make_env(self.task) for _ in range(self.num_envs)]
        self.meters = [None] * self.num_envs

    @property
    def observation_space(self) -> gym.Space:
        return self.envs[0].observation_space

    @property
    def action_space(self) -> gym.Space:
        return self.envs[0].action_space

    def close(self, why: str) -> None:
        self.closed = why
        for env in self.envs:
            env.close()
        self.envs = []

    def _obs_batch(self) -> np.ndarray:
        space = self.observation_space
        return np.empty((self.num_envs, *space.shape), dtype=space.dtype)

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
        actions = check_actions(self.action_space, self.num_envs, action)
        # Each copy gets its element (a numpy int64 for Discrete) or its row (Box) of the batch,
        # as gymnasium's SyncVectorEnv hands them out.
        acts = list(actions)
        envs, meters, domain = self.envs, self.meters, self.domain
        obs = self._obs_batch()
        final = np.zeros_like(obs) if self.autoreset == pb.AUTORESET_MODE_SAME_STEP else None
        # Per-copy results are collected in lists and converted once: cheaper than K item writes.
        rewards, terms, truncs, costs = [], [], [], []
        ended: list[tuple[int, EpisodeMeter]] = []
        for i, env in enumerate(envs):
            o, r, term, trunc, _ = env.step(acts[i])
            meter = meters[i]
            assert meter is not None
            costs.append(meter.record_step(env, r, term, trunc))
            rewards.append(r)
            terms.append(term)
            truncs.append(trunc)
            if meter.done:
                ended.append((i, meter))
                if final is not None:
                    final[i] = o
                    o, _ = env.reset()
                    meters[i] = domain.meter(env)
            obs[i] = o
        out = StepOutput(
            observation=obs,
            reward=np.array(rewards, dtype=np.float64),
            terminated=np.array(terms, dtype=bool),
            truncated=np.array(truncs, dtype=bool),
            final_observation=final,
            cost=np.array(costs, dtype=np.int64),
        )
        return out, ended


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

    def _abort(self, index: int, reason: str) -> None:
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
