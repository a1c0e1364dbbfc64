"""The agent's client: gymnasium environments over the evaluator's agent endpoint.

Importable inside the sandbox (it needs grpcio, numpy and gymnasium only)::

    from ale.client import RemoteEnv, RemoteVectorEnv
    env = RemoteEnv("unix:/ale/evaluator.sock")            # one copy, autoreset disabled
    venv = RemoteVectorEnv("unix:/ale/evaluator.sock", num_envs=64)   # SAME_STEP autoreset

An interactive-mode policy is handed an eval-session handle instead
(``ALE_ENV_ID``) and attaches to it with ``RemoteEnv(target, env_id=handle)``.
``env.spec`` is the task's gymnasium ``EnvSpec`` (its id and step limit as the
evaluator reports them). Stable-Baselines3's ``VecEnv`` over K copies is
``ale.client.sb3.RemoteSB3VecEnv``, a module of its own: ``import ale.client``
never imports SB3 or PyTorch. docs/client.md describes it all.
"""

from typing import TYPE_CHECKING, Any

from ale.client._rpc import AleEnvClient, AleEnvError

if TYPE_CHECKING:
    from ale.client._remote import RemoteEnv, RemoteVectorEnv, run_policy

__all__ = ["AleEnvClient", "AleEnvError", "RemoteEnv", "RemoteVectorEnv", "run_policy"]

_GYMNASIUM = frozenset({"RemoteEnv", "RemoteVectorEnv", "run_policy"})


def __getattr__(name: str) -> Any:
    """The gymnasium environments load gymnasium on first use, so that ``AleEnvClient`` (the
    harness's connection) does not."""
    if name in _GYMNASIUM:
        from ale.client import _remote

        return getattr(_remote, name)
    raise AttributeError(f"module 'ale.client' has no attribute {name!r}")
