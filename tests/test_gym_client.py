"""The agent's gym client: RemoteEnv and RemoteVectorEnv behave as gymnasium environments."""

from __future__ import annotations

import warnings

import grpc
import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from ale import catalog
from ale.client import AleEnvError, RemoteEnv, RemoteVectorEnv
from ale.env.v1 import env_pb2 as pb
from ale_evaluator.envs import make_env
from ale_evaluator.seeds import hidden_seed


def local_env(task_id: str) -> gym.Env:
    return make_env(catalog.get_task(task_id))


def checker_warnings(env: gym.Env) -> set[str]:
    """Run gymnasium's check_env; return the messages of the warnings it raised."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env, skip_render_check=True)
    return {str(w.message) for w in caught}


@pytest.mark.parametrize("task_id", ["cartpole-balance", "pendulum-lqr"])
def test_remote_env_passes_gymnasiums_env_checker(make_evaluator, task_id):
    ev = make_evaluator(task_id)
    remote = checker_warnings(RemoteEnv(ev.agent_address))
    # The task's own environment draws some advice from the checker (e.g. unbounded
    # observations); the remote one must not add any warning of its own.
    local = checker_warnings(local_env(task_id).unwrapped)
    assert remote <= local, remote - local


@pytest.mark.parametrize("task_id", ["cartpole-balance", "pendulum-lqr"])
def test_remote_env_reproduces_the_local_environment(make_evaluator, task_id):
    ev = make_evaluator(task_id)
    env, local = RemoteEnv(ev.agent_address), local_env(task_id)
    assert env.observation_space == local.observation_space
    assert env.action_space == local.action_space
    obs, info = env.reset(seed=11)
    expected, _ = local.reset(seed=11)
    assert info == {}
    assert obs.dtype == expected.dtype
    assert obs.tobytes() == expected.tobytes()
    env.action_space.seed(0)
    for _ in range(20):
        action = env.action_space.sample()
        obs, reward, terminated, truncated, info = env.step(action)
        exp_obs, exp_reward, exp_term, exp_trunc, _ = local.step(action)
        assert obs.tobytes() == exp_obs.tobytes()
        assert (reward, terminated, truncated) == (exp_reward, exp_term, exp_trunc)
        assert isinstance(reward, float)
        assert isinstance(terminated, bool)
        assert isinstance(info["cost"], int)
        assert env.observation_space.contains(obs) or terminated
        if terminated or truncated:
            break
    env.close()
    local.close()


def test_remote_env_accepts_plain_python_and_numpy_actions(make_evaluator):
    ev = make_evaluator("pendulum-lqr")
    env = RemoteEnv(ev.agent_address)
    env.reset(seed=0)
    for action in ([0.1], np.array([0.1]), np.array([0.1], dtype=np.float32), (0.2,)):
        obs, *_ = env.step(action)
        assert obs.shape == (4,)
    env.close()


def test_remote_vector_env_rollout_follows_gymnasium_same_step_semantics(evaluator):
    k = 4
    venv = RemoteVectorEnv(evaluator.agent_address, num_envs=k)
    assert venv.num_envs == k
    assert venv.single_observation_space == local_env("cartpole-balance").observation_space
    assert venv.single_action_space == gym.spaces.Discrete(2)
    assert venv.observation_space.shape == (k, 4)
    assert venv.action_space.shape == (k,)
    obs, infos = venv.reset(seed=40)
    assert venv.observation_space.contains(obs)
    locals_ = [local_env("cartpole-balance") for _ in range(k)]
    for i, env in enumerate(locals_):
        first, _ = env.reset(seed=40 + i)
        assert obs[i].tobytes() == first.tobytes()
    venv.action_space.seed(3)
    ended = 0
    for _ in range(60):
        actions = venv.action_space.sample()
        obs, rewards, terminated, truncated, infos = venv.step(actions)
        assert obs.shape == (k, 4)
        assert rewards.shape == terminated.shape == truncated.shape == (k,)
        assert infos["cost"].shape == (k,)
        assert infos["_cost"].all()
        done = terminated | truncated
        assert ("final_obs" in infos) == bool(done.any())
        for i, env in enumerate(locals_):
            o, r, term, trunc, _ = env.step(int(actions[i]))
            assert (rewards[i], terminated[i], truncated[i]) == (r, term, trunc)
            if term or trunc:
                ended += 1
                assert infos["_final_obs"][i]
                assert infos["final_obs"][i].tobytes() == o.tobytes()
                o, _ = env.reset()
            elif "final_obs" in infos:
                assert not infos["_final_obs"][i]
            assert obs[i].tobytes() == o.tobytes()
        assert venv.single_observation_space.contains(obs[0].astype(np.float32))
    assert ended >= 2
    venv.close()
    for env in locals_:
        env.close()


def test_remote_vector_env_refuses_a_list_of_seeds(evaluator):
    venv = RemoteVectorEnv(evaluator.agent_address, num_envs=2)
    with pytest.raises(ValueError, match="seed"):
        venv.reset(seed=[1, 2])
    venv.close()


def test_remote_env_refuses_a_vector_env_id(evaluator):
    env_id = evaluator.agent.create_env(num_envs=3).env_id
    with pytest.raises(ValueError, match="RemoteVectorEnv"):
        RemoteEnv(evaluator.agent_address, env_id=env_id)


def test_remote_env_reports_refusals_as_ale_env_errors(evaluator):
    env = RemoteEnv(evaluator.agent_address)
    with pytest.raises(AleEnvError) as info:
        env.step(1)
    assert info.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert info.value.method == "Step"
    with pytest.raises(AleEnvError) as info:
        RemoteEnv(evaluator.agent_address, task_id="hopper-hop")
    assert info.value.code == grpc.StatusCode.NOT_FOUND
    env.close()


def test_policy_attaches_to_an_eval_session_handle_until_finalize(make_evaluator):
    ev, n = make_evaluator(mode="interactive"), 2
    official = ev.harness.create_env(official=True)
    session = ev.harness.start_eval_session(official.env_id, num_episodes=n)
    env = RemoteEnv(ev.agent_address, env_id=session.env_id)
    assert env.env_id == session.env_id
    assert env.spec_message.official
    local = local_env("cartpole-balance")
    for i in range(n):
        obs, info = env.reset(seed=1234)  # ignored: hidden seeds
        assert info["eval"] == {"episode_index": i, "num_episodes": n}
        expected, _ = local.reset(seed=hidden_seed(ev.config, "cartpole-balance", i))
        assert obs.tobytes() == expected.tobytes()
        done = False
        while not done:
            obs, _, terminated, truncated, _ = env.step(int(obs[2] > 0))
            done = terminated or truncated
    result = ev.harness.get_eval_result(session.session_id, finalize=True)
    assert result.complete
    assert result.passed_episodes == n
    with pytest.raises(AleEnvError) as info:
        env.reset()
    assert info.value.code in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.NOT_FOUND)
    with pytest.raises(AleEnvError) as info:
        env.step(0)
    assert info.value.code in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.NOT_FOUND)
    env.close()
    local.close()


def test_an_official_env_handle_without_a_session_is_denied_to_the_client(make_evaluator):
    ev = make_evaluator(mode="interactive")
    official = ev.harness.create_env(official=True)
    with pytest.raises(AleEnvError) as info:
        RemoteEnv(ev.agent_address, env_id=official.env_id)
    assert info.value.code == grpc.StatusCode.PERMISSION_DENIED


def test_remote_vector_env_on_the_harness_has_no_official_flag(evaluator):
    venv = RemoteVectorEnv(evaluator.running.harness_address, num_envs=2)
    assert evaluator.harness.get_spec(venv.env_id).autoreset_mode == pb.AUTORESET_MODE_SAME_STEP
    assert not evaluator.harness.get_spec(venv.env_id).official
    venv.close()
