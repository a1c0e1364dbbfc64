#!/usr/bin/env python
"""Stable-Baselines3 PPO through the evaluator against PPO on in-process gymnasium, side by side.

Four ways of training the same PPO (``MlpPolicy``, same hyperparameters, seed 0) on one task, in one
run and interleaved over several rounds:

1. in-process, 1 copy: the task's own environment (``ale_evaluator.envs.make_env``), which SB3 wraps
   in its ``Monitor`` and ``DummyVecEnv`` itself;
2. ``ale.client.RemoteEnv``, 1 copy, wrapped by SB3 the same way (one Step RPC per env-step);
3. in-process, 8 copies: SB3's ``DummyVecEnv`` of 8 ``make_env`` copies;
4. ``ale.client.sb3.RemoteSB3VecEnv``, 8 copies (one Step RPC per vector step);
5. a hand-written minimal ``VecEnv`` over ``RemoteVectorEnv``, 8 copies (:class:`MinimalVecEnv`, the
   kind of ~35-line adapter issue 12 measured at 1.20x): the baseline that the shipped adapter, which
   checks its inputs and keeps SB3's conventions, is compared with on this machine in the same run.

The evaluator is ``python -m ale_evaluator serve`` in a separate process on Unix sockets (as in
bench/evaluator_bench.py). Reported per way: PPO env-steps per second of ``model.learn`` (model
construction excluded), split into rollout collection and gradient updates, and the ratios
remote / in-process at the same number of copies (1.0: the boundary is free) with their inverse,
the slowdown. ``--quick`` is a smoke run. See bench/README.md ("Stable-Baselines3 benchmark").
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from evaluator_bench import Evaluator, _interruptible, _json_safe, log, machine_info

perf = time.perf_counter
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "sb3.json"
VEC_COPIES = 8
#: (key, copies, remote, label), in the order of the table.
WAYS = (
    ("in_process_1", 1, False, "in-process gymnasium"),
    ("remote_env_1", 1, True, "RemoteEnv (1 RPC per env-step)"),
    ("in_process_8", VEC_COPIES, False, "in-process DummyVecEnv"),
    ("adapter_8", VEC_COPIES, True, "RemoteSB3VecEnv (1 RPC per step)"),
    ("minimal_8", VEC_COPIES, True, "hand-written minimal VecEnv"),
)
PAIRS = (("remote_env_1", "in_process_1"), ("adapter_8", "in_process_8"), ("minimal_8", "in_process_8"))


def minimal_vec_env(target: str, num_envs: int, task_id: str) -> Any:
    """The shortest SB3 ``VecEnv`` over ``RemoteVectorEnv`` that PPO trains with: no input checks,
    no ``get_attr`` beyond what PPO asks. A baseline for the bench, not for use."""
    import numpy as np
    from stable_baselines3.common.vec_env.base_vec_env import VecEnv

    from ale.client import RemoteVectorEnv

    class MinimalVecEnv(VecEnv):
        def __init__(self) -> None:
            self.remote = RemoteVectorEnv(target, num_envs, task_id=task_id)
            super().__init__(num_envs, self.remote.single_observation_space, self.remote.single_action_space)

        def reset(self) -> Any:
            return self.remote.reset(seed=self._seeds[0])[0]

        def step_async(self, actions: Any) -> None:
            self._actions = actions

        def step_wait(self) -> Any:
            obs, rew, term, trunc, extra = self.remote.step(self._actions)
            dones = term | trunc
            infos: list[dict[str, Any]] = [{} for _ in range(num_envs)]
            for i in np.flatnonzero(dones):
                infos[i]["terminal_observation"] = extra["final_obs"][i]
                infos[i]["TimeLimit.truncated"] = bool(trunc[i] and not term[i])
            return obs, rew.astype(np.float32), dones, infos

        def close(self) -> None:
            self.remote.close()

        def get_attr(self, name: str, indices: Any = None) -> list[Any]:
            return [None] * num_envs

        def set_attr(self, name: str, value: Any, indices: Any = None) -> None:
            pass

        def env_method(self, name: str, *args: Any, indices: Any = None, **kw: Any) -> list[Any]:
            return [None] * num_envs

        def env_is_wrapped(self, wrapper_class: Any, indices: Any = None) -> list[bool]:
            return [False] * num_envs

    return MinimalVecEnv()


def make_env_for(key: str, task_id: str, target: str) -> Any:
    from stable_baselines3.common.vec_env import DummyVecEnv

    from ale import catalog
    from ale.client import RemoteEnv
    from ale.client.sb3 import RemoteSB3VecEnv
    from ale_evaluator.envs import make_env

    task = catalog.get_task(task_id)
    if key == "in_process_1":
        return make_env(task)
    if key == "remote_env_1":
        return RemoteEnv(target, task_id=task_id)
    if key == "in_process_8":
        return DummyVecEnv([lambda: make_env(task) for _ in range(VEC_COPIES)])
    if key == "minimal_8":
        return minimal_vec_env(target, VEC_COPIES, task_id)
    return RemoteSB3VecEnv(target, VEC_COPIES, task_id=task_id)


def train_window(key: str, copies: int, ev: Evaluator, args: argparse.Namespace) -> dict[str, Any]:
    """One timed ``model.learn(args.steps)`` of a fresh PPO on a fresh environment of way ``key``."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback

    class Clock(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.collect_s, self.rollouts, self._t0 = 0.0, 0, 0.0

        def _on_rollout_start(self) -> None:
            self._t0 = perf()

        def _on_rollout_end(self) -> None:
            self.collect_s += perf() - self._t0
            self.rollouts += 1

        def _on_step(self) -> bool:
            return True

    env = make_env_for(key, args.task, ev.target)
    model = PPO(
        "MlpPolicy",
        env,
        n_steps=args.rollout // copies,
        batch_size=args.batch_size,
        n_epochs=args.epochs,
        seed=0,
        device="cpu",
    )
    clock = Clock()
    cpu0, srv0 = time.process_time(), ev.cpu_seconds()
    t0 = perf()
    model.learn(args.steps, callback=clock)
    wall = perf() - t0
    cpu, srv1 = time.process_time() - cpu0, ev.cpu_seconds()
    model.get_env().close()
    episodes = list(model.ep_info_buffer)
    return {
        "steps": model.num_timesteps,
        "wall_s": wall,
        "steps_per_s": model.num_timesteps / wall,
        "collect_s": clock.collect_s,
        "train_s": wall - clock.collect_s,
        "rollouts": clock.rollouts,
        "client_cpu_s": cpu,
        "evaluator_cpu_s": (srv1 - srv0) if srv0 is not None and srv1 is not None else None,
        "mean_episode_return_last_100": statistics.fmean(e["r"] for e in episodes) if episodes else None,
    }


def summarise(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    med = {k: statistics.median(r[k] for r in rounds) for k in ("steps_per_s", "wall_s", "collect_s", "train_s")}
    return {**med, "rounds": rounds}


def bench(ev: Evaluator, args: argparse.Namespace) -> dict[str, Any]:
    rounds: dict[str, list[dict[str, Any]]] = {key: [] for key, *_ in WAYS}
    for r in range(args.rounds):
        order = list(WAYS) if r % 2 == 0 else list(reversed(WAYS))  # alternate who goes first
        for key, copies, _remote, label in order:
            log(f"round {r + 1}/{args.rounds}: {label}, {copies} cop{'y' if copies == 1 else 'ies'}")
            rounds[key].append(train_window(key, copies, ev, args))
    ways = {
        key: {"copies": copies, "remote": remote, "label": label, **summarise(rounds[key])}
        for key, copies, remote, label in WAYS
    }
    ratios = {}
    for remote, local in PAIRS:
        per_round = [a["steps_per_s"] / b["steps_per_s"] for a, b in zip(rounds[remote], rounds[local], strict=True)]
        ratio = statistics.median(per_round)
        collect = [b["collect_s"] / a["collect_s"] for a, b in zip(rounds[remote], rounds[local], strict=True)]
        ratios[f"{remote}/{local}"] = {
            "ratio": ratio,
            "slowdown": 1 / ratio,
            "ratio_per_round": per_round,
            "ratio_of_medians": ways[remote]["steps_per_s"] / ways[local]["steps_per_s"],
            # rollout collection alone (where the boundary is): in-process time / remote time
            "collect_ratio": statistics.median(collect),
            "collect_ratio_per_round": collect,
        }
    return {"ways": ways, "ratios": ratios}


def fmt(x: float | None, digits: int = 0) -> str:
    return "-" if x is None or x != x else f"{x:,.{digits}f}"


def render(report: dict[str, Any]) -> str:
    cfg, res = report["config"], report["results"]
    ways, ratios = res["ways"], res["ratios"]
    lines = [
        f"PPO (MlpPolicy, seed 0) on {cfg['task']}: {cfg['steps']} env-steps a window, rollout {cfg['rollout']} "
        f"env-steps, {cfg['epochs']} epochs of minibatches of {cfg['batch_size']}; median of {cfg['rounds']} round(s)",
        f"torch {report['machine'].get('torch')} ({cfg['torch_threads']} thread), "
        f"stable-baselines3 {report['machine'].get('stable_baselines3')}, evaluator in its own process",
        "",
        f"  {'copies':<8}{'way':<36}{'steps/s':>10}{'collect s':>11}{'train s':>9}"
        f"{'remote/in-proc':>16}{'slowdown':>10}{'collect only':>14}",
    ]
    ratio_of = {pair.split("/")[0]: r for pair, r in ratios.items()}
    for key, way in ways.items():
        r = ratio_of.get(key)
        lines.append(
            f"  {way['copies']:<8}{way['label']:<36}{fmt(way['steps_per_s']):>10}{fmt(way['collect_s'], 2):>11}"
            f"{fmt(way['train_s'], 2):>9}{fmt(r['ratio'], 2) if r else '':>16}"
            f"{(fmt(r['slowdown'], 2) + 'x') if r else '':>10}{fmt(r['collect_ratio'], 2) if r else '':>14}"
        )
    adapter, single = ways["adapter_8"]["steps_per_s"], ways["in_process_1"]["steps_per_s"]
    vs_minimal = statistics.median(
        a["steps_per_s"] / b["steps_per_s"]
        for a, b in zip(ways["adapter_8"]["rounds"], ways["minimal_8"]["rounds"], strict=True)
    )
    lines += [
        "",
        f"  8 copies through the adapter train at {adapter / single:.2f}x the steps/s of 1 in-process copy,",
        f"  and at {vs_minimal:.2f}x the steps/s of the hand-written minimal VecEnv (1.0: the checks cost nothing).",
        "  ratio: median of the per-round ratios (both ways of a round run back to back); slowdown = 1 / ratio;",
        "  collect only: the same ratio of the rollout collection time alone (the updates do not cross the boundary).",
    ]
    load = report["machine"].get("loadavg_start")
    if load and load[0] > 0.5 * (os.cpu_count() or 1):
        lines.append(
            f"  WARNING: load average {load[0]:.2f} at the start: the CPUs were busy, the ratios are unreliable."
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--task", default="cartpole-balance", help="task id (default cartpole-balance)")
    p.add_argument("--steps", type=int, help="env-steps per timed learn() (default 8192; 2048 with --quick)")
    p.add_argument(
        "--rollout", type=int, help="env-steps per rollout, all copies together (default 2048; 1024 --quick)"
    )
    p.add_argument("--batch-size", type=int, default=64, help="PPO minibatch size (default 64, SB3's)")
    p.add_argument("--epochs", type=int, default=10, help="PPO epochs per rollout (default 10, SB3's)")
    p.add_argument("--rounds", type=int, help="interleaved rounds (default 3; 1 with --quick)")
    p.add_argument("--torch-threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON results (default {DEFAULT_OUT})")
    p.add_argument("--quick", action="store_true", help="a smoke run: small windows, one round")
    args = p.parse_args(argv)
    args.steps = args.steps or (2048 if args.quick else 8192)
    args.rollout = args.rollout or (1024 if args.quick else 2048)
    args.rounds = args.rounds or (1 if args.quick else 3)
    if args.rollout % VEC_COPIES or args.steps < args.rollout:
        p.error(f"--rollout must be a multiple of {VEC_COPIES}, and --steps at least --rollout")
    return args


def _versions(info: dict[str, Any]) -> None:
    import stable_baselines3
    import torch

    info["torch"] = torch.__version__
    info["stable_baselines3"] = stable_baselines3.__version__


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        import torch
    except ImportError as exc:
        print(f"sb3_bench needs the sb3 extra ({exc}): pip install 'torch==2.13.0' -e '.[sb3]'", file=sys.stderr)
        return 2
    torch.set_num_threads(args.torch_threads)
    started_at = dt.datetime.now(dt.UTC)
    t_start = perf()
    tmp = Path(tempfile.mkdtemp(prefix="ale-b-"))  # short: Unix socket paths are limited to ~100 bytes
    ev = Evaluator(args.task, tmp, 0)
    try:
        with _interruptible():
            ev.spawn()
            machine = machine_info()
            _versions(machine)
            ev.wait_ready()
            log(f"evaluator for {args.task} ready on {ev.target}")
            results = bench(ev, args)
    finally:
        ev.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    machine["loadavg_end"] = os.getloadavg() if hasattr(os, "getloadavg") else None
    report = {
        "schema": "ale-bench-sb3/v1",
        "started_at": started_at.isoformat(timespec="seconds"),
        "finished_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "wall_s": perf() - t_start,
        "machine": machine,
        "config": {
            "task": args.task,
            "steps": args.steps,
            "rollout": args.rollout,
            "batch_size": args.batch_size,
            "epochs": args.epochs,
            "rounds": args.rounds,
            "torch_threads": args.torch_threads,
            "vec_copies": VEC_COPIES,
            "quick": args.quick,
            "argv": sys.argv[1:] if argv is None else argv,
        },
        "results": results,
    }
    print(render(report))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(_json_safe(report), indent=2) + "\n")
    log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
