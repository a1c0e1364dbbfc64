"""Stable-Baselines3's ``VecEnv`` over the evaluator: K copies, one Step RPC per vector step.

::

    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import VecMonitor
    from ale.client.sb3 import RemoteSB3VecEnv

    venv = VecMonitor(RemoteSB3VecEnv("unix:/ale/evaluator.sock", num_envs=8))
    PPO("MlpPolicy", venv, seed=0).learn(20_000)

It needs Stable-Baselines3 and PyTorch (``pip install 'ale-robotics[sb3]'``); ``import ale.client``
never imports them, and this module says so when they are missing. In the agent's sandbox they are
not installed: docs/agent-contract.md ("Stable-Baselines3") says how an agent can bring them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from ale.client import AleEnvClient, RemoteVectorEnv

try:
    from stable_baselines3.common.vec_env.base_vec_env import VecEnv, VecEnvIndices, VecEnvObs, VecEnvStepReturn
except ImportError as exc:  # optional: the agent's environment does not bring it (ale.runner.agent_env)
    raise ModuleNotFoundError(
        f"ale.client.sb3 needs Stable-Baselines3 and PyTorch ({exc}): pip install 'ale-robotics[sb3]'; "
        "inside the agent's sandbox see docs/agent-contract.md, 'Stable-Baselines3'",
        name=(exc.name or "stable_baselines3").partition(".")[0],
    ) from exc

#: What ``env_method`` can call on a copy: the copies run in the evaluator, so only what answers
#: from the client's side (no rendering there: ``render_mode`` is None, ``render`` gives None).
_METHODS = ("get_wrapper_attr", "has_wrapper_attr", "render")


class RemoteSB3VecEnv(VecEnv):
    """K copies of the task's environment on the evaluator as an SB3 ``VecEnv``.

    Built on :class:`~ale.client.RemoteVectorEnv` (SAME_STEP autoreset), with SB3's conventions: a
    copy whose episode ended is already reset in the same step, its last observation is
    ``infos[i]["terminal_observation"]``, and ``infos[i]["TimeLimit.truncated"]`` says it ran out of
    steps rather than terminated; ``infos[i]["cost"]`` counts its safety events. ``seed(s)``
    seeds copy i with ``s + i`` at the next :meth:`reset`, as the evaluator does. ``remote`` is the
    underlying ``RemoteVectorEnv``, ``spec`` the task's gymnasium ``EnvSpec``.
    """

    def __init__(self, target: str, num_envs: int, *, client: AleEnvClient | None = None, task_id: str = "") -> None:
        self.remote = RemoteVectorEnv(target, num_envs, task_id=task_id, client=client)
        self.spec = self.remote.spec
        self._actions: Any = None
        super().__init__(num_envs, self.remote.single_observation_space, self.remote.single_action_space)

    def _attributes(self) -> dict[str, Any]:
        """What each copy answers for ``get_attr``: the same for all, since they are one environment's copies."""
        return {
            "render_mode": None,
            "metadata": {"render_modes": []},
            "spec": self.spec,
            "observation_space": self.remote.single_observation_space,
            "action_space": self.remote.single_action_space,
        }

    def _targets(self, indices: VecEnvIndices) -> list[int]:
        """The copies ``indices`` names (all when None), or IndexError."""
        targets = list(self._get_indices(indices))
        for i in targets:
            if not -self.num_envs <= i < self.num_envs:
                raise IndexError(f"copy {i}: this VecEnv has {self.num_envs} copies")
        return targets

    def reset(self) -> VecEnvObs:
        seed = self._seeds[0]
        if self._seeds != [None if seed is None else seed + i for i in range(self.num_envs)]:
            raise ValueError(f"the evaluator seeds copy i with seed + i: seeds {self._seeds} are not of that form")
        if any(self._options):
            raise ValueError(f"the evaluator's Reset takes no options; got {self._options}")
        obs: np.ndarray = self.remote.reset(seed=seed)[0]
        self._reset_seeds()
        self._reset_options()
        for i in range(self.num_envs):
            self.reset_infos[i] = {}
        self._actions = None
        return obs

    def step_async(self, actions: np.ndarray) -> None:
        self._actions = actions

    def step_wait(self) -> VecEnvStepReturn:
        actions, self._actions = self._actions, None
        if actions is None:
            raise RuntimeError("step_wait() without step_async(actions) first")
        obs, rewards, terminated, truncated, extra = self.remote.step(actions)
        dones = terminated | truncated
        if dones.any() and "final_obs" not in extra:
            raise RuntimeError("the evaluator's Step reply has no final_observation for the copies that ended")
        final: np.ndarray | None = extra.get("final_obs")
        cost = extra["cost"]
        infos: list[dict[str, Any]] = []
        for i in range(self.num_envs):
            info: dict[str, Any] = {
                "cost": int(cost[i]),
                "TimeLimit.truncated": bool(truncated[i] and not terminated[i]),
            }
            if dones[i] and final is not None:
                info["terminal_observation"] = final[i]
                self.reset_infos[i] = {}
            infos.append(info)
        return obs, rewards.astype(np.float32), dones, infos

    def close(self) -> None:
        self.remote.close()

    def get_images(self) -> Sequence[np.ndarray | None]:
        return [None] * self.num_envs  # the evaluator renders nothing

    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        attributes = self._attributes()
        if attr_name not in attributes:
            raise AttributeError(
                f"{attr_name!r}: the copies run in the evaluator; of their attributes these answer here: "
                f"{', '.join(sorted(attributes))}"
            )
        return [attributes[attr_name] for _ in self._targets(indices)]

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        raise AttributeError(
            f"cannot set {attr_name!r}: the copies run in the evaluator, which changes them only by Reset and Step"
        )

    def env_method(
        self, method_name: str, *method_args: Any, indices: VecEnvIndices = None, **method_kwargs: Any
    ) -> list[Any]:
        targets = self._targets(indices)
        if method_name == "render":
            return [None for _ in targets]
        if method_name in ("get_wrapper_attr", "has_wrapper_attr") and len(method_args) == 1 and not method_kwargs:
            name = method_args[0]
            if method_name == "has_wrapper_attr":
                return [name in self._attributes() for _ in targets]
            return self.get_attr(name, targets)
        raise AttributeError(
            f"{method_name!r} with {len(method_args)} arguments: the copies run in the evaluator; "
            f"env_method can call {', '.join(_METHODS)} (one name argument for the attribute ones)"
        )

    def env_is_wrapped(
        self, wrapper_class: type[gym.Wrapper[Any, Any, Any, Any]], indices: VecEnvIndices = None
    ) -> list[bool]:
        """No wrapper of this process is around the copies (an SB3 ``Monitor`` neither): all False.
        The evaluator's own time limit is ``spec.max_episode_steps``."""
        return [False for _ in self._targets(indices)]
