"""gRPC stub wrapper and the gymnasium environments built on it."""

from __future__ import annotations

from typing import Any

import grpc
import gymnasium as gym
import numpy as np
from gymnasium.envs.registration import EnvSpec
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from ale.client._rpc import AleEnvClient, AleEnvError
from ale.env.v1 import env_pb2 as pb
from ale.protocol import decode_space, decode_tensor


def _squeezed(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(n for n in shape if n != 1)


def _action_array(space: gym.Space[Any], actions: Any, k: int) -> np.ndarray:
    """``actions`` as the Step tensor ``[k, *action_shape]``, or ValueError saying why they do not fit.

    The shape may differ from it only by axes of length one (``0.1`` for one copy of a ``(1,)``
    box, ``(8, 1)`` for eight Discrete copies), which never changes which value goes where; any
    other shape is refused rather than reshaped, so transposed or missing values are an error.
    """
    assert isinstance(space, gym.spaces.Box | gym.spaces.Discrete), "decode_space gives Box or Discrete"
    copies = f"{k} cop{'y' if k == 1 else 'ies'}"
    try:
        arr = np.asarray(actions)
    except (ValueError, TypeError, OverflowError) as exc:  # ragged nesting, unconvertible objects
        raise ValueError(f"action for {copies} of {space}: not an array ({exc})") from None
    if arr.dtype.kind not in "biuf":
        raise ValueError(f"action for {copies} of {space}: numbers expected, got {arr.dtype} values")
    shape = (k, *(space.shape or ()))
    if _squeezed(arr.shape) != _squeezed(shape):
        raise ValueError(f"action of shape {arr.shape} for {copies} of {space}: the shape must be {shape}")
    if isinstance(space, gym.spaces.Discrete):
        if not _whole(arr):
            raise ValueError(f"action for {copies} of {space}: whole numbers expected, got {_some(arr)}")
        return arr.astype(np.int64).reshape(k)
    dtype = arr.dtype if arr.dtype in (np.float32, np.float64) else space.dtype  # the wire's float types
    return arr.astype(dtype, copy=False).reshape(shape)


def _whole(arr: np.ndarray) -> bool:
    """Whether every value is a whole number that int64 holds exactly (floats: up to 2**53)."""
    if arr.dtype.kind == "f":
        wide = arr.astype(np.float64)
        return bool(np.isfinite(wide).all() and (wide == np.round(wide)).all() and (np.abs(wide) <= 2.0**53).all())
    if arr.dtype.kind == "u" and arr.size:
        return int(arr.max()) <= np.iinfo(np.int64).max
    return True


def _some(arr: np.ndarray) -> str:
    """A few of ``arr``'s values for an error message, however large it is."""
    flat = arr.ravel()
    return np.array2string(flat[:8]) + (f" ... ({flat.size} values)" if flat.size > 8 else "")


def gym_spec(message: pb.EnvSpec, target: str) -> EnvSpec:
    """The task as gymnasium's ``EnvSpec``: its id and step limit as the evaluator reports them
    (0 steps, no limit, is ``None``); ``gymnasium.make(spec)`` creates a new copy on ``target``."""
    return EnvSpec(
        id=message.task_id,
        entry_point="ale.client:RemoteEnv",
        max_episode_steps=message.max_episode_steps or None,
        kwargs={"target": target, "task_id": message.task_id},
    )


class RemoteEnv(gym.Env):
    """One environment copy on the evaluator, as a ``gymnasium.Env``.

    Autoreset is disabled: after an episode ends, call :meth:`reset`. ``info``
    carries ``cost`` (safety events this step) and, inside an eval session,
    ``eval`` (session progress). ``spec`` is the task's ``EnvSpec`` (:func:`gym_spec`);
    ``spec_message`` the evaluator's whole description.
    """

    metadata = {"render_modes": []}  # noqa: RUF012 - gymnasium's convention

    def __init__(
        self, target: str, *, env_id: str | None = None, task_id: str = "", client: AleEnvClient | None = None
    ) -> None:
        self.client = client or AleEnvClient(target)
        if env_id is None:
            created = self.client.create_env(task_id=task_id, num_envs=1)
            env_id, spec = created.env_id, created.spec
        else:
            spec = self.client.get_spec(env_id)
        if spec.num_envs != 1:
            raise ValueError(f"environment {env_id} has {spec.num_envs} copies; use RemoteVectorEnv")
        self.env_id = env_id
        self.spec_message = spec
        self.spec = gym_spec(spec, self.client.target)
        self.observation_space = decode_space(spec.observation_space)
        self.action_space = decode_space(spec.action_space)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        reply = self.client.reset(self.env_id, seed)
        info: dict[str, Any] = {}
        if reply.HasField("eval"):
            info["eval"] = {
                "episode_index": reply.eval.episode_index,
                "num_episodes": reply.eval.num_episodes,
            }
        return decode_tensor(reply.observation, what="observation")[0], info

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        reply = self.client.step(self.env_id, _action_array(self.action_space, action, 1))
        obs = decode_tensor(reply.observation, what="observation")[0]
        reward = float(decode_tensor(reply.reward)[0])
        terminated = bool(decode_tensor(reply.terminated)[0])
        truncated = bool(decode_tensor(reply.truncated)[0])
        info: dict[str, Any] = {"cost": int(decode_tensor(reply.cost)[0])}
        return obs, reward, terminated, truncated, info

    def close(self) -> None:
        self.client.close()
        super().close()


class RemoteVectorEnv(VectorEnv):
    """K copies on the evaluator stepped with one RPC, with gymnasium's SAME_STEP autoreset.

    ``infos["final_obs"]`` (masked by ``infos["_final_obs"]``) holds the last
    observation of copies whose episode ended in this step; their row of the
    returned observation already starts the next episode. ``spec`` is the task's
    ``EnvSpec`` of one copy, as for :class:`RemoteEnv`.
    """

    metadata = {"autoreset_mode": AutoresetMode.SAME_STEP}  # noqa: RUF012

    def __init__(self, target: str, num_envs: int, *, task_id: str = "", client: AleEnvClient | None = None) -> None:
        self.client = client or AleEnvClient(target)
        created = self.client.create_env(task_id=task_id, num_envs=num_envs, autoreset_mode=pb.AUTORESET_MODE_SAME_STEP)
        self.env_id = created.env_id
        self.num_envs = num_envs
        self.spec_message = created.spec
        self.spec = gym_spec(created.spec, self.client.target)
        self.single_observation_space = decode_space(created.spec.observation_space)
        self.single_action_space = decode_space(created.spec.action_space)
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)

    def reset(
        self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        if isinstance(seed, list):
            raise ValueError("RemoteVectorEnv seeds copy i with seed + i; pass one int")
        super().reset(seed=seed)
        reply = self.client.reset(self.env_id, seed)
        return decode_tensor(reply.observation, what="observation"), {}

    def step(self, actions: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        reply = self.client.step(self.env_id, _action_array(self.single_action_space, actions, self.num_envs))
        obs = decode_tensor(reply.observation, what="observation")
        terminated = decode_tensor(reply.terminated)
        truncated = decode_tensor(reply.truncated)
        done = terminated | truncated
        infos: dict[str, Any] = {
            "cost": decode_tensor(reply.cost),
            "_cost": np.ones(self.num_envs, dtype=bool),
        }
        if done.any() and reply.HasField("final_observation"):
            infos["final_obs"] = decode_tensor(reply.final_observation, what="final_observation")
            infos["_final_obs"] = done
        return obs, decode_tensor(reply.reward), terminated, truncated, infos

    def close_extras(self, **kwargs: Any) -> None:
        self.client.close()


def run_policy(act: Any, *, target: str | None = None, env_id: str | None = None) -> int:
    """Play an interactive eval session to its end with ``act(obs) -> action``; return episodes played.

    Attaches to ``env_id`` (default ``$ALE_ENV_ID``) on ``target`` (default ``$ALE_EVALUATOR``)
    and plays episodes until the evaluator refuses a Reset because the session is complete.
    """
    import os

    target = target or os.environ["ALE_EVALUATOR"]
    env_id = env_id or os.environ["ALE_ENV_ID"]
    env = RemoteEnv(target, env_id=env_id)
    played = 0
    try:
        while True:
            try:
                obs, _ = env.reset()
            except AleEnvError as exc:
                if exc.code == grpc.StatusCode.FAILED_PRECONDITION:
                    return played
                raise
            done = False
            while not done:
                obs, _, terminated, truncated, _ = env.step(act(obs))
                done = terminated or truncated
            played += 1
    finally:
        env.close()
