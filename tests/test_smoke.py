import numpy as np

from ale.client import RemoteEnv


def test_practice_episode_over_the_agent_endpoint(evaluator):
    env = RemoteEnv(evaluator.agent_address)
    obs, _ = env.reset(seed=3)
    assert obs.shape == (4,)
    obs, reward, _, _, info = env.step(np.int64(1))
    assert reward == 1.0
    assert info["cost"] in (0, 1)
    env.close()
