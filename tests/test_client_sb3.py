"""The client meets Stable-Baselines3: ``RemoteEnv.spec``, the ``RemoteSB3VecEnv`` adapter, PPO
trained through both, and the adapter inside a real sandbox once the agent brings SB3.

Without Stable-Baselines3 installed the SB3 tests skip with the reason on a developer's machine;
CI (``ALE_SITE_TOOLS_REQUIRED=1``, .ci/run installs the ``sb3`` extra) fails instead.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
import gymnasium as gym
import numpy as np
import pytest
from fuzzing import fuzz_settings
from hypothesis import event, given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from sandbox_tools import missing

from ale import catalog
from ale.client import AleEnvClient, AleEnvError, RemoteEnv, RemoteVectorEnv
from ale.client._remote import _action_array, gym_spec
from ale.env.v1 import env_pb2 as pb
from ale.protocol import decode_tensor, encode_tensor
from ale_evaluator.envs import make_env

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def sb3() -> ModuleType:
    """Stable-Baselines3, or skip (fail in CI) saying how to install it."""
    try:
        import stable_baselines3
        import torch
    except ImportError as exc:
        missing(f"Stable-Baselines3 is not installed ({exc}): pip install 'torch==2.13.0' -e '.[sb3]' (see .ci/run)")
    torch.set_num_threads(1)  # the machine's two cores are shared; results are the same
    return stable_baselines3


def adapter(target: str, num_envs: int, **kw: Any) -> Any:
    from ale.client.sb3 import RemoteSB3VecEnv

    return RemoteSB3VecEnv(target, num_envs, **kw)


def local_vec_env(task_id: str, num_envs: int) -> Any:
    """SB3's own DummyVecEnv of the task's environments built in this process (the reference)."""
    from stable_baselines3.common.vec_env import DummyVecEnv

    task = catalog.get_task(task_id)
    return DummyVecEnv([lambda: make_env(task) for _ in range(num_envs)])


def episode_returns(env: RemoteEnv, act: Callable[[np.ndarray], Any], seeds: range) -> list[float]:
    returns = []
    for seed in seeds:
        obs, _ = env.reset(seed=seed)
        total, done = 0.0, False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(act(obs))
            total += reward
            done = terminated or truncated
        returns.append(total)
    return returns


# --- import ale.client stays light --------------------------------------------------------------------


def test_import_ale_client_imports_neither_sb3_nor_torch() -> None:
    code = (
        "import sys, ale.client, ale.client._remote\n"
        "print(sorted(m for m in ('stable_baselines3', 'torch') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]"


def test_the_adapter_without_sb3_says_what_to_install() -> None:
    code = (
        "import sys\n"
        "sys.modules['stable_baselines3'] = None  # as if it were not installed\n"
        "try:\n"
        "    import ale.client.sb3\n"
        "except ModuleNotFoundError as exc:\n"
        "    print(exc.name, '|', exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    name, _, message = out.stdout.partition(" | ")
    assert name == "stable_baselines3"
    assert "pip install 'ale-robotics[sb3]'" in message
    assert "docs/agent-contract.md" in message


# --- RemoteEnv.spec ------------------------------------------------------------------------------------


@pytest.mark.parametrize("task_id", ["cartpole-balance", "pendulum-lqr", "reacher-jacobian"])
def test_remote_env_spec_is_the_tasks_id_and_step_limit_as_the_evaluator_reports_them(make_evaluator, task_id):
    ev = make_evaluator(task_id)
    env = RemoteEnv(ev.agent_address)
    reported = ev.agent.get_spec(env.env_id)
    assert isinstance(env.spec, gym.envs.registration.EnvSpec)
    assert env.spec.id == reported.task_id == task_id
    assert env.spec.max_episode_steps == reported.max_episode_steps > 0
    # the evaluator's number is the simulator's own registered limit
    assert env.spec.max_episode_steps == gym.spec(catalog.get_task(task_id).spec.gym_id).max_episode_steps
    assert env.spec.nondeterministic is False  # a seed and the actions fix the episode (docs/protocol.md)
    venv = RemoteVectorEnv(ev.agent_address, 3)
    assert venv.spec == env.spec
    env.close()
    venv.close()


def test_an_evaluator_reporting_no_step_limit_gives_a_spec_without_one() -> None:
    spec = gym_spec(pb.EnvSpec(task_id="cartpole-balance", max_episode_steps=0), "unix:/x.sock")
    assert spec.max_episode_steps is None
    assert spec.id == "cartpole-balance"


def test_the_spec_of_an_eval_session_handle_comes_from_get_spec(make_evaluator):
    ev = make_evaluator(mode="interactive")
    official = ev.harness.create_env(official=True)
    session = ev.harness.start_eval_session(official.env_id, num_episodes=1)
    env = RemoteEnv(ev.agent_address, env_id=session.env_id)
    assert env.spec.id == "cartpole-balance"
    assert env.spec.max_episode_steps == ev.agent.get_spec(session.env_id).max_episode_steps == 500
    ev.harness.get_eval_result(session.session_id, finalize=True)
    env.close()


def test_gymnasium_make_of_the_spec_creates_a_new_copy_that_replays_the_same_episode(evaluator):
    env = RemoteEnv(evaluator.agent_address)
    made = gym.make(env.spec)
    assert isinstance(made.unwrapped, RemoteEnv)
    assert made.unwrapped.env_id != env.env_id
    assert made.spec is not None
    assert made.spec.max_episode_steps == 500
    a, _ = env.reset(seed=5)
    b, _ = made.reset(seed=5)
    assert a.tobytes() == b.tobytes()
    for action in [0, 1, 1, 0, 1]:
        assert env.step(action)[0].tobytes() == made.step(action)[0].tobytes()
    made.close()
    env.close()


# --- actions of the wrong shape ------------------------------------------------------------------------


def test_vector_env_refuses_transposed_box_actions_instead_of_scrambling_them(make_evaluator):
    """Reacher's action is a (2,) box: three copies need (3, 2); a (2, 3) array used to be reshaped
    into it silently, each copy getting another copy's torques."""
    ev = make_evaluator("reacher-jacobian")
    venv = RemoteVectorEnv(ev.agent_address, 3)
    venv.reset(seed=0)
    actions = np.arange(6, dtype=np.float32).reshape(3, 2) / 10
    with pytest.raises(ValueError, match=r"shape \(2, 3\).*must be \(3, 2\)"):
        venv.step(actions.T)
    venv.step(actions)  # the right shape still works
    venv.close()


@pytest.mark.parametrize(
    "action",
    [np.zeros((2, 2), dtype=np.int64), [0, 1, 0], np.zeros(5, dtype=np.int64), [0.5, 1, 0, 1], ["a", "b", "c", "d"]],
    ids=["2x2", "too-few", "too-many", "fractional", "strings"],
)
def test_wrong_discrete_actions_give_a_clear_error_and_leave_the_env_usable(evaluator, action):
    venv = RemoteVectorEnv(evaluator.agent_address, 4)
    venv.reset(seed=0)
    with pytest.raises(ValueError, match=r"4 copies of Discrete\(2\)"):
        venv.step(action)
    obs, *_ = venv.step(np.array([[0], [1], [0], [1]]))  # (4, 1): only an axis of length one differs
    assert obs.shape == (4, 4)
    venv.close()


def test_remote_env_refuses_an_action_with_too_many_values(make_evaluator):
    ev = make_evaluator("pendulum-lqr")
    env = RemoteEnv(ev.agent_address)
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"1 copy of Box.*must be \(1, 1\)"):
        env.step([0.1, 0.2])
    env.step(0.1)  # a scalar for a (1,) box is the same value
    env.close()


_DTYPES = st.sampled_from(["f2", "f4", ">f4", "f8", "i1", "i8", "u8", "?", "c8", "U1"])
_SPACES = st.one_of(
    st.builds(lambda n, start: gym.spaces.Discrete(n, start=start), st.integers(1, 5), st.integers(-3, 3)),
    st.lists(st.integers(1, 3), max_size=3).map(lambda shape: gym.spaces.Box(-1.0, 1.0, tuple(shape), np.float32)),
)
_ACTIONS = st.one_of(
    hnp.arrays(_DTYPES, hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=4)),
    st.lists(st.one_of(st.floats(), st.integers(-(2**70), 2**70), st.booleans()), max_size=6),
    st.lists(st.lists(st.floats(-2, 2), max_size=3), max_size=4),
    st.one_of(st.none(), st.text(max_size=4), st.floats(), st.integers(-(2**70), 2**70)),
)


def _fitting(space: gym.Space[Any], k: int) -> st.SearchStrategy[np.ndarray]:
    """Arrays of the Step's shape [k, *shape] with axes of length one added or dropped."""
    dims = [n for n in (k, *space.shape) if n != 1]
    shapes = st.lists(st.booleans(), min_size=len(dims) + 1, max_size=len(dims) + 1).map(
        lambda ones: (
            tuple(x for i, n in enumerate(dims) for x in ([1] if ones[i] else []) + [n]) + ((1,) if ones[-1] else ())
        )
    )
    return hnp.arrays(_DTYPES, shapes)


@pytest.mark.fuzz
@given(space=_SPACES, k=st.integers(1, 4), data=st.data())
@fuzz_settings
def test_fuzz_actions_are_refused_with_a_value_error_or_sent_unchanged_in_order(space, k, data):
    """Whatever the agent passes: a ValueError, or the Step tensor [k, *shape] the wire takes, with
    the same values in the same order (only axes of length one differ)."""
    actions = data.draw(st.one_of(_ACTIONS, _fitting(space, k)))
    try:
        out = _action_array(space, actions, k)
    except ValueError as exc:
        refusal = str(exc)
    else:
        refusal = ""
    event("refused" if refusal else "sent")
    if refusal:
        assert f"of {space}" in refusal
        return
    shape = (k, *space.shape)
    assert out.shape == shape
    arr = np.asarray(actions)
    assert tuple(n for n in arr.shape if n != 1) == tuple(n for n in shape if n != 1)
    assert decode_tensor(encode_tensor(out), shape=shape).tobytes() == out.astype(out.dtype.newbyteorder("=")).tobytes()
    if isinstance(space, gym.spaces.Discrete):
        assert out.dtype == np.int64
        assert (out.ravel() == arr.ravel()).all()
    else:
        assert out.dtype in (np.float32, np.float64)
        np.testing.assert_array_equal(out.ravel(), arr.ravel().astype(out.dtype))


# --- SB3's checks --------------------------------------------------------------------------------------


def sb3_checker_warnings(env: gym.Env) -> set[str]:
    from stable_baselines3.common.env_checker import check_env

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env, warn=True)
    return {str(w.message) for w in caught}


@pytest.mark.parametrize("task_id", ["cartpole-balance", "pendulum-lqr"])
def test_sb3_check_env_accepts_remote_env(sb3, make_evaluator, task_id):
    ev = make_evaluator(task_id)
    remote = sb3_checker_warnings(RemoteEnv(ev.agent_address))
    # the task's own environment draws the same advice (if any); the remote one adds none
    assert remote <= sb3_checker_warnings(make_env(catalog.get_task(task_id))), remote


@pytest.mark.parametrize(("task_id", "num_envs"), [("cartpole-balance", 4), ("reacher-jacobian", 3)])
def test_the_adapter_steps_like_sb3s_dummy_vec_env_of_the_local_environments(sb3, make_evaluator, task_id, num_envs):
    """Same seeds, same actions: observations, rewards, dones and infos (terminal observations,
    TimeLimit.truncated) equal bit for bit to DummyVecEnv over the task's environments in this
    process, through episode ends by termination (CartPole) and by the time limit (Reacher, 50 steps)."""
    from stable_baselines3.common.vec_env import VecCheckNan

    ev = make_evaluator(task_id)
    remote = VecCheckNan(adapter(ev.agent_address, num_envs), raise_exception=True)
    local = local_vec_env(task_id, num_envs)
    assert remote.num_envs == local.num_envs == num_envs
    assert remote.observation_space == local.observation_space
    assert remote.action_space == local.action_space
    assert remote.seed(7) == local.seed(7) == [7 + i for i in range(num_envs)]
    obs, ref = remote.reset(), local.reset()
    assert obs.tobytes() == ref.tobytes()
    space = remote.action_space
    space.seed(1)
    ends = {"terminated": 0, "truncated": 0}
    for _ in range(120):
        actions = np.stack([space.sample() for _ in range(num_envs)])
        obs, rewards, dones, infos = remote.step(actions)
        ref_obs, ref_rewards, ref_dones, ref_infos = local.step(actions)
        assert obs.tobytes() == ref_obs.tobytes()
        assert rewards.dtype == ref_rewards.dtype
        assert rewards.tobytes() == ref_rewards.tobytes()
        assert dones.tolist() == ref_dones.tolist()
        for info, ref_info in zip(infos, ref_infos, strict=True):
            assert info["TimeLimit.truncated"] == ref_info["TimeLimit.truncated"]
            assert ("terminal_observation" in info) == ("terminal_observation" in ref_info)
            if "terminal_observation" in info:
                assert info["terminal_observation"].tobytes() == ref_info["terminal_observation"].tobytes()
                ends["truncated" if info["TimeLimit.truncated"] else "terminated"] += 1
            assert isinstance(info["cost"], int)
    assert ends["truncated" if task_id == "reacher-jacobian" else "terminated"] >= num_envs
    remote.close()
    local.close()


def test_the_adapter_under_sb3s_wrappers(sb3, evaluator):
    """VecMonitor (episode statistics and the spec's id), VecNormalize and VecFrameStack take the adapter."""
    from stable_baselines3.common.vec_env import VecFrameStack, VecMonitor, VecNormalize

    venv = VecFrameStack(VecNormalize(VecMonitor(adapter(evaluator.agent_address, 4))), n_stack=2)
    venv.seed(0)
    obs = venv.reset()
    assert obs.shape == (4, 8)
    episodes = []
    for _ in range(80):
        obs, _, dones, infos = venv.step(np.zeros(4, dtype=np.int64))  # always left: short episodes
        episodes += [info["episode"] for info, done in zip(infos, dones, strict=True) if done]
        assert all(info["terminal_observation"].shape == (8,) for info in infos if "terminal_observation" in info)
    assert len(episodes) >= 4
    assert all(e["r"] == e["l"] for e in episodes)  # CartPole pays 1 a step
    monitor = venv.venv.venv
    assert monitor.unwrapped.spec.id == "cartpole-balance"
    venv.close()


def test_the_adapters_attributes_methods_seeds_and_render_mode(sb3, evaluator):
    from stable_baselines3.common.monitor import Monitor

    venv = adapter(evaluator.agent_address, 3)
    assert venv.render_mode is None
    assert venv.metadata == {"render_modes": []}
    assert venv.get_attr("render_mode") == [None, None, None]
    assert venv.get_attr("spec", indices=[0, 2]) == [venv.spec, venv.spec]
    assert venv.get_attr("action_space", indices=1) == [gym.spaces.Discrete(2)]
    assert venv.has_attr("observation_space")
    assert not venv.has_attr("gravity")
    with pytest.raises(AttributeError, match="gravity"):
        venv.get_attr("gravity")
    with pytest.raises(IndexError, match="3 copies"):
        venv.get_attr("spec", indices=[3])
    with pytest.raises(AttributeError, match="cannot set 'gravity'"):
        venv.set_attr("gravity", 5.0)
    assert venv.env_method("get_wrapper_attr", "render_mode") == [None] * 3
    assert venv.env_method("has_wrapper_attr", "spec", indices=[0]) == [True]
    assert venv.env_method("render") == [None] * 3
    with pytest.raises(AttributeError, match=r"'reset'.*get_wrapper_attr"):
        venv.env_method("reset")
    assert venv.env_is_wrapped(Monitor) == [False, False, False]
    assert venv.env_is_wrapped(gym.Wrapper, indices=[1]) == [False]
    with pytest.warns(UserWarning, match="render_mode"):
        assert venv.render() is None
    assert venv.get_images() == [None, None, None]
    first = venv.reset()
    assert venv.seed(11) == [11, 12, 13]
    seeded = venv.reset()
    assert venv.seed(11) == [11, 12, 13]
    assert venv.reset().tobytes() == seeded.tobytes()  # a seed is used once, then each copy goes on
    assert venv.reset().tobytes() != seeded.tobytes()
    assert first.shape == (3, 4)
    venv.close()


def test_the_adapter_refuses_what_the_evaluator_cannot_do(sb3, evaluator):
    venv = adapter(evaluator.agent_address, 2)
    venv._seeds = [3, 9]  # not seed + i
    with pytest.raises(ValueError, match=r"seed \+ i"):
        venv.reset()
    venv._reset_seeds()
    venv.set_options({"low": -0.1})
    with pytest.raises(ValueError, match="no options"):
        venv.reset()
    venv._reset_options()
    venv.reset()
    with pytest.raises(RuntimeError, match="step_async"):
        venv.step_wait()
    with pytest.raises(ValueError, match=r"shape \(3,\).*2 copies"):
        venv.step(np.array([0, 1, 1]))
    obs, rewards, _, infos = venv.step(np.array([0, 1]))
    assert obs.shape == (2, 4)
    assert rewards.dtype == np.float32
    assert len(infos) == 2
    venv.close()
    venv.close()  # twice is fine


def test_nan_actions_on_a_box_task_are_refused_by_the_evaluator(sb3, make_evaluator):
    ev = make_evaluator("pendulum-lqr")
    venv = adapter(ev.agent_address, 2)
    venv.reset()
    with pytest.raises(AleEnvError) as info:
        venv.step(np.array([[np.nan], [0.0]], dtype=np.float32))
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    venv.close()


# --- training --------------------------------------------------------------------------------------------


def test_ppo_through_the_adapter_learns_cartpole_far_better_than_random(sb3, evaluator):
    """8 copies, 8192 steps: the trained policy's mean return on ten fixed seeds is several times
    a random policy's on the same seeds (about 22; a balanced pole scores up to 500)."""
    from stable_baselines3.common.vec_env import VecMonitor

    venv = VecMonitor(adapter(evaluator.agent_address, 8))
    model = sb3.PPO("MlpPolicy", venv, seed=0, n_steps=128, batch_size=256, device="cpu")
    model.learn(8192)
    assert model.num_timesteps == 8192
    assert len(model.ep_info_buffer) > 0  # VecMonitor's episodes reached SB3's logger
    env = RemoteEnv(evaluator.agent_address)
    env.action_space.seed(0)
    seeds = range(1000, 1010)
    trained = np.mean(episode_returns(env, lambda obs: int(model.predict(obs, deterministic=True)[0]), seeds))
    random = np.mean(episode_returns(env, lambda obs: env.action_space.sample(), seeds))
    assert random < 40
    assert trained > 3 * random, (trained, random)
    venv.close()
    env.close()


def test_ppo_trains_through_remote_env_wrapped_by_sb3_itself(sb3, evaluator):
    """A plain RemoteEnv: SB3 wraps it in its Monitor (which reads the spec's id) and a DummyVecEnv."""
    model = sb3.PPO("MlpPolicy", RemoteEnv(evaluator.agent_address), seed=0, n_steps=256, batch_size=64, device="cpu")
    model.learn(512)
    assert model.num_timesteps == 512
    assert model.get_env().get_attr("spec")[0].id == "cartpole-balance"
    model.get_env().close()


# --- the evaluator going away ----------------------------------------------------------------------------


class CuttingProxy:
    """A Unix-socket relay to the evaluator that can drop the connection while a reply is on its way:
    once ``cut`` is set, the first reply bytes after the next request bytes close both sides."""

    def __init__(self, upstream: str, folder: Path) -> None:
        self.upstream = upstream.removeprefix("unix:")
        self.path = folder / "proxy.sock"
        self.cut = threading.Event()
        self._request_sent = threading.Event()  # a request went up after ``cut`` was set
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(self.path))
        self.listener.listen(4)
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def address(self) -> str:
        return f"unix:{self.path}"

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            server.connect(self.upstream)
            self.conns += [client, server]
            threading.Thread(target=self._pump, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, True), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, replies: bool) -> None:
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            if not data or (replies and self._request_sent.is_set()):
                self.close_connections()
                return
            if not replies and self.cut.is_set():
                self._request_sent.set()
            try:
                dst.sendall(data)
            except OSError:
                return

    def close_connections(self) -> None:
        for conn in self.conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()

    def close(self) -> None:
        self.listener.close()
        self.close_connections()


@pytest.fixture
def proxy(evaluator, short_tmp) -> Iterator[CuttingProxy]:
    relay = CuttingProxy(evaluator.agent_address, short_tmp)
    yield relay
    relay.close()


def test_a_connection_lost_mid_step_fails_that_step_with_unavailable(sb3, proxy):
    venv = adapter(proxy.address, 4, client=AleEnvClient(proxy.address, timeout=20))
    venv.reset()
    venv.step(np.zeros(4, dtype=np.int64))
    proxy.cut.set()  # the next reply is dropped with the connection, the request already delivered
    with pytest.raises(AleEnvError) as info:
        venv.step(np.zeros(4, dtype=np.int64))
    assert info.value.method == "Step"
    assert info.value.code == grpc.StatusCode.UNAVAILABLE
    venv.close()


def test_training_stops_with_the_evaluators_error_when_it_shuts_down(sb3, evaluator):
    from stable_baselines3.common.callbacks import BaseCallback

    class StopEvaluator(BaseCallback):
        def _on_step(self) -> bool:
            if self.num_timesteps == 64:
                evaluator.running.stop(0)
            return True

    client = AleEnvClient(evaluator.agent_address, timeout=3)
    model = sb3.PPO("MlpPolicy", adapter(evaluator.agent_address, 4, client=client), n_steps=64, device="cpu")
    with pytest.raises(AleEnvError) as info:
        model.learn(1024, callback=StopEvaluator())
    assert info.value.method == "Step"
    assert info.value.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
    assert model.num_timesteps < 1024
    model.get_env().close()


# --- inside the agent's sandbox --------------------------------------------------------------------------


SANDBOX_TRAIN = r"""
import json, os, sys
try:
    from ale.client.sb3 import RemoteSB3VecEnv
except ModuleNotFoundError as exc:
    print("REPORT " + json.dumps({"missing": exc.name, "message": str(exc)}), flush=True)
    raise SystemExit(0)
import stable_baselines3, torch
torch.set_num_threads(1)
from stable_baselines3.common.vec_env import VecMonitor
venv = VecMonitor(RemoteSB3VecEnv(os.environ["ALE_EVALUATOR"], num_envs=4))
model = stable_baselines3.PPO("MlpPolicy", venv, seed=0, n_steps=64, batch_size=128, device="cpu")
model.learn(512)
print("REPORT " + json.dumps({
    "timesteps": model.num_timesteps, "episodes": len(model.ep_info_buffer),
    "sb3": stable_baselines3.__file__, "torch": torch.__file__, "client": sys.modules["ale.client"].__file__,
}), flush=True)
"""


def _bring(folder: Path, dists: list[Any]) -> None:
    """The distributions' files under ``folder`` (hard links where possible), as an agent's own."""
    from ale.runner import agent_env

    for dist in dists:
        for rel, host, _st in agent_env._dist_files(dist):
            target = folder / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(host, target)
            except OSError:
                shutil.copy2(host, target)
    for path in [folder, *folder.rglob("*")]:
        if path.is_dir():
            path.chmod(0o755)


def test_the_adapter_is_in_the_agents_environment_and_works_once_the_agent_brings_sb3(sb3, evaluator, box):
    """Real sandbox, real evaluator: without SB3 the adapter says what is missing; with SB3 and
    PyTorch on PYTHONPATH from a folder the sandbox shows (here the workspace), PPO trains."""
    import trio

    from ale.runner import agent_env, runtimes
    from ale.runner.runtime import SandboxSpec

    runtime = runtimes.make()
    runtime.check()
    env = agent_env.ensure()
    assert "ale.client.sb3" in env.modules
    assert not any(d.lower().startswith(("stable", "torch")) for d in env.distributions)
    bundled = {d.split("==")[0].lower() for d in env.distributions}
    brought = [d for d in agent_env.distribution_closure(["stable_baselines3"]) if d.name.lower() not in bundled]
    assert {d.name.lower() for d in brought} >= {"stable_baselines3", "torch"}
    vendor = box.workspace / "site"
    _bring(vendor, brought)
    socket_path = Path(evaluator.agent_address.removeprefix("unix:"))

    def run(extra: dict[str, str]) -> dict[str, Any]:
        spec = SandboxSpec(
            command=(agent_env.PYTHON, "-c", SANDBOX_TRAIN),
            workspace=box.workspace,
            workspace_writable=True,
            task_dir=box.task_dir,
            evaluator_socket=socket_path,
            env={"HOME": "/workspace", "PATH": f"{agent_env.MOUNT_POINT}/bin:/usr/bin:/bin", **extra},
            wall_time_s=240,
            agent_env=env,
        )
        from sandbox_box import Lines

        lines = Lines()
        result = trio.run(lambda: runtime.run_sandboxed(spec, lines))
        for line in lines.of("stdout"):
            if line.startswith("REPORT "):
                return dict(json.loads(line[7:]))
        pytest.fail(f"no report ({result}): {lines.of('stderr')[-30:]}")

    without = run({"ALE_EVALUATOR": "unix:/ale/evaluator.sock"})
    assert without["missing"] == "stable_baselines3"
    assert "docs/agent-contract.md" in without["message"]
    brought_run = run({"ALE_EVALUATOR": "unix:/ale/evaluator.sock", "PYTHONPATH": "/workspace/site"})
    assert brought_run["timesteps"] == 512
    assert brought_run["episodes"] > 0
    assert brought_run["sb3"].startswith("/workspace/site/")
    assert brought_run["torch"].startswith("/workspace/site/")
    assert brought_run["client"].startswith(f"{agent_env.MOUNT_POINT}/")


def test_ale_run_with_agent_package_stable_baselines3_trains_ppo_in_the_sandbox(sb3, tmp_path: Path) -> None:
    """The harness option is the way to bring SB3: ``ale run --agent-package stable-baselines3``
    puts it and PyTorch (from the harness's installation, with what they require) into the agent's
    environment; an agent trains PPO through the adapter with nothing of its own on PYTHONPATH."""
    import shlex
    import tempfile

    import verifier_helpers
    from sandbox_tools import need_bwrap

    from ale.core import bundle
    from ale.runner import agent_env

    need_bwrap()
    keys = verifier_helpers.keygen(tmp_path / "site")
    run_tmp = Path(tempfile.mkdtemp(prefix="ale-sb3-"))  # short: the run folder's socket paths
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ALE_", "OPENAI_", "ANTHROPIC_"))}
        cmd = [
            sys.executable, "-m", "ale.runner.cli", "run", "cartpole-balance", "--plain", "--out", "out",
            "--episodes", "1", "--agent-time", "300", "--agent-package", "stable-baselines3",
            "--agent-cmd", f"python3 -c {shlex.quote(SANDBOX_TRAIN)}", "--recipient", keys.recipient,
        ]  # fmt: skip
        proc = subprocess.run(
            cmd, cwd=tmp_path, env={**env, "TMPDIR": str(run_tmp)}, capture_output=True, text=True, timeout=900
        )
    finally:
        shutil.rmtree(run_tmp, ignore_errors=True)
    assert proc.returncode in (0, 1), proc.stderr  # the agent leaves no policy: the task is not completed
    (path,) = (tmp_path / "out").glob("*.ale")
    files = bundle.unpack(path.read_bytes(), keys.identity)
    events = verifier_helpers.read_events(files)
    (started,) = [e for e in events if e["kind"] == "run_started"]
    assert started["data"]["agent"]["packages"] == ["stable-baselines3"]
    texts = [e["data"]["text"] for e in events if e["producer"] == "untrusted_agent" and e["kind"] == "stdout"]
    reports = [json.loads(t[7:]) for t in texts if t.startswith("REPORT ")]
    assert reports, [e for e in events if e["producer"] == "untrusted_agent"][-10:]
    (report,) = reports
    assert report.get("timesteps") == 512, report
    assert report["episodes"] > 0
    for module in ("sb3", "torch", "client"):
        assert report[module].startswith(f"{agent_env.MOUNT_POINT}/"), report
