#!/usr/bin/env python
"""Evaluator throughput benchmark: remote (gRPC over Unix sockets) against in-process, side by side.

For each task it measures, in one run and interleaved over several rounds:

1. single env, in-process: ``make_env(task)`` (``gymnasium.make(gym_id, disable_env_checker=True)``);
2. single env, remote: ``ale.client.RemoteEnv`` against ``python -m ale_evaluator serve`` running in a
   separate process (Step latency p50/p99 and steps/s); ``AleEnvClient.step`` as a diagnostic;
3. vectorised K=64: ``RemoteVectorEnv`` against ``gymnasium.vector.SyncVectorEnv`` of 64 ``make_env``
   copies with SAME_STEP autoreset (env-steps/s = K x calls/s);
4. batch evaluation: ``SubmitBatchEval`` (non-official, agent endpoint) of a linear policy, waited for with
   ``GetBatchEvalStatus(wait_ms)`` (or polled, ``--poll-interval``) until DONE, against the same policy rolled
   out in-process on the same seeds;
5. the floor: a raw AF_UNIX ping-pong between two Python processes with Step-sized messages.

Run ``python bench/evaluator_bench.py`` (about 2 minutes) or ``--quick`` (a smoke run, under 20 s).
The table goes to stdout, progress to stderr, every figure to the JSON file given by ``--out``.
See bench/README.md for how to read it.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import functools
import json
import os
import platform
import select
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

perf = time.perf_counter

DEFAULT_TASKS = ("cartpole-balance", "hopper-hop", "pendulum-lqr")
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "evaluator.json"
VEC_K = 64
BATCH_SEED = 1000
# The goals: remote / in-process.
GOAL_VEC_CLASSIC = 0.5
GOAL_VEC_MUJOCO = 0.8
GOAL_BATCH = 0.9
# Ping-pong message sizes (request bytes, response bytes): a K=1 Step and a K=64 Step.
PINGPONG_SIZES = ((128, 512), (1024, 12288))


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# -- statistics ---------------------------------------------------------------------------------


def median(xs: list[float]) -> float:
    return float(statistics.median(xs)) if xs else float("nan")


def pct_us(latencies: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(latencies), q) * 1e6) if latencies else float("nan")


def ratio(remote: float, local: float) -> float:
    return remote / local if local > 0 else float("nan")


def paired(remote: list[dict[str, Any]], local: list[dict[str, Any]], key: str) -> list[float]:
    """Per-round ratios remote / in-process of ``key``."""
    return [ratio(a[key], b[key]) for a, b in zip(remote, local, strict=True)]


# -- processes ----------------------------------------------------------------------------------

CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def proc_cpu_seconds(pid: int) -> float | None:
    """utime + stime of a process (all threads), from /proc; None where unavailable."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw.rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def _wait_line(proc: subprocess.Popen[bytes], timeout: float, what: str) -> bytes:
    """The first stdout line of ``proc``, or RuntimeError after ``timeout`` seconds."""
    assert proc.stdout is not None
    deadline = perf() + timeout
    while True:
        left = deadline - perf()
        if left <= 0:
            raise RuntimeError(f"{what}: no ready line within {timeout:.0f} s")
        ready, _, _ = select.select([proc.stdout], [], [], min(left, 0.5))
        if ready:
            line = proc.stdout.readline()
            if not line:
                raise RuntimeError(f"{what}: exited before it was ready (status {proc.wait()})")
            return line
        if proc.poll() is not None:
            raise RuntimeError(f"{what}: exited before it was ready (status {proc.returncode})")


def _stop(proc: subprocess.Popen[bytes] | None) -> None:
    """Terminate one child we started, by its own handle; kill it if it lingers."""
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.terminate()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait(timeout=5)


class Evaluator:
    """``python -m ale_evaluator serve`` for one task, on Unix sockets in ``tmp``."""

    def __init__(self, task_id: str, tmp: Path, index: int, extra: list[str] | None = None) -> None:
        self.task_id = task_id
        self.extra = extra or []
        self.agent_socket = tmp / f"a{index}.sock"
        self.harness_socket = tmp / f"h{index}.sock"
        self.stderr_path = tmp / f"evaluator{index}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.ready: dict[str, Any] = {}
        self.startup_s = float("nan")

    def spawn(self) -> None:
        self._started = perf()
        with open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "ale_evaluator",
                    "serve",
                    "--task",
                    self.task_id,
                    "--agent-socket",
                    str(self.agent_socket),
                    "--harness-socket",
                    str(self.harness_socket),
                    # A bench steps far past any task's budget; the steps are still counted.
                    "--env-step-budget",
                    "none",
                    *self.extra,
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=err,
                start_new_session=True,  # Ctrl-C reaches only us; the finally below stops it
            )

    def wait_ready(self, timeout: float = 90.0) -> None:
        assert self.proc is not None
        try:
            line = _wait_line(self.proc, timeout, f"evaluator for {self.task_id}")
            self.ready = json.loads(line)
        except (RuntimeError, json.JSONDecodeError):
            sys.stderr.write(self.stderr_path.read_text(errors="replace")[-4000:])
            raise
        if self.ready.get("event") != "ready":
            raise RuntimeError(f"evaluator for {self.task_id}: unexpected first line {line!r}")
        self.startup_s = perf() - self._started

    @property
    def target(self) -> str:
        return str(self.ready["agent"])

    def cpu_seconds(self) -> float | None:
        return proc_cpu_seconds(self.proc.pid) if self.proc is not None else None

    def stop(self) -> None:
        _stop(self.proc)


# -- the floor: raw AF_UNIX ping-pong -----------------------------------------------------------

ECHO_SERVER = r"""
import socket, struct, sys
srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
srv.bind(sys.argv[1])
srv.listen(4)
print("ready", flush=True)
buf = bytearray(1 << 20)
view = memoryview(buf)
while True:
    conn, _ = srv.accept()
    def recv_exact(n):
        got = 0
        while got < n:
            k = conn.recv_into(view[got:n])
            if not k:
                return False
            got += k
        return True
    if not recv_exact(8):
        conn.close()
        continue
    req, resp = struct.unpack_from("<II", buf)
    reply = bytes(resp)
    while recv_exact(req):
        conn.sendall(reply)
    conn.close()
"""


class PingPong:
    """One connection to the echo server: fixed-size request, fixed-size response."""

    def __init__(self, path: Path, request: int, response: int) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(str(path))
        self.sock.sendall(struct.pack("<II", request, response))
        self.payload = bytes(request)
        self.response = response
        self.view = memoryview(bytearray(response))

    def round_trip(self) -> None:
        self.sock.sendall(self.payload)
        got, n, view, recv = 0, self.response, self.view, self.sock.recv_into
        while got < n:
            k = recv(view[got:])
            if not k:
                raise ConnectionError("the echo server closed the connection")
            got += k

    def close(self) -> None:
        self.sock.close()


# -- measurement loops --------------------------------------------------------------------------


def run_window(
    call: Callable[[], Any], duration: float, *, latency: bool, chunk: int = 32, server: Evaluator | None = None
) -> dict[str, Any]:
    """Call ``call`` for about ``duration`` seconds; count calls, optionally time each one.

    The clock is read once per ``chunk`` calls when latencies are not wanted, so the timing
    itself costs next to nothing even for a 6 us CartPole step.
    """
    lat: list[float] = []
    cpu0, srv0 = time.process_time(), server.cpu_seconds() if server else None
    calls = 0
    t0 = perf()
    deadline = t0 + duration
    if latency:
        append = lat.append
        while True:
            for _ in range(chunk):
                s = perf()
                call()
                append(perf() - s)
            calls += chunk
            if perf() >= deadline:
                break
    else:
        while True:
            for _ in range(chunk):
                call()
            calls += chunk
            if perf() >= deadline:
                break
    elapsed = perf() - t0
    out: dict[str, Any] = {
        "calls": calls,
        "elapsed_s": elapsed,
        "calls_per_s": calls / elapsed,
        "client_cpu_us_per_call": (time.process_time() - cpu0) / calls * 1e6,
    }
    if server is not None and srv0 is not None:
        srv1 = server.cpu_seconds()
        if srv1 is not None:
            out["server_cpu_us_per_call"] = (srv1 - srv0) / calls * 1e6
    if latency:
        out["latencies"] = lat
    return out


def merge_windows(windows: list[dict[str, Any]]) -> dict[str, Any]:
    """One window from several slices: totals, call-weighted CPU, concatenated latencies."""
    calls = sum(w["calls"] for w in windows)
    elapsed = sum(w["elapsed_s"] for w in windows)
    out: dict[str, Any] = {"calls": calls, "elapsed_s": elapsed, "calls_per_s": calls / elapsed, "slices": len(windows)}
    for key in ("client_cpu_us_per_call", "server_cpu_us_per_call"):
        if all(key in w for w in windows):
            out[key] = sum(w[key] * w["calls"] for w in windows) / calls
    if any("latencies" in w for w in windows):
        out["latencies"] = [x for w in windows for x in w.get("latencies", [])]
    return out


class SingleDriver:
    """Steps one gymnasium env with pre-drawn actions; resets when an episode ends."""

    def __init__(self, env: Any, actions: list[Any]) -> None:
        self.env, self.actions, self.i, self.resets = env, actions, 0, 0
        env.reset(seed=0)

    def __call__(self) -> None:
        a = self.actions[self.i % len(self.actions)]
        self.i += 1
        _, _, terminated, truncated, _ = self.env.step(a)
        if terminated or truncated:
            self.env.reset()
            self.resets += 1


class ClientDriver:
    """``AleEnvClient.step`` on a K=1 env, with no decoding: the lower bound of RemoteEnv."""

    def __init__(self, client: Any, env_id: str, actions: list[np.ndarray]) -> None:
        self.client, self.env_id, self.actions, self.i = client, env_id, actions, 0
        client.reset(env_id, 0)

    def __call__(self) -> None:
        a = self.actions[self.i % len(self.actions)]
        self.i += 1
        reply = self.client.step(self.env_id, a)
        if reply.terminated.data != b"\x00" or reply.truncated.data != b"\x00":
            self.client.reset(self.env_id)


class VectorDriver:
    def __init__(self, env: Any, actions: np.ndarray) -> None:
        self.env, self.actions, self.i = env, actions, 0
        env.reset(seed=0)

    def __call__(self) -> None:
        self.env.step(self.actions[self.i % len(self.actions)])
        self.i += 1


def draw_actions(space: Any, n: int, rng: np.random.Generator, k: int | None = None) -> Any:
    """``n`` uniformly random actions (or ``n`` batches of ``k``) of a Box or Discrete space."""
    import gymnasium as gym

    shape = (n,) if k is None else (n, k)
    if isinstance(space, gym.spaces.Discrete):
        a = rng.integers(int(space.start), int(space.start + space.n), size=shape, dtype=np.int64)
        return [int(x) for x in a] if k is None else a
    a = rng.uniform(space.low, space.high, size=(*shape, *space.shape)).astype(space.dtype)
    return list(a) if k is None else a


# -- batch evaluation ---------------------------------------------------------------------------


def bench_policy(task: Any) -> tuple[bytes, str]:
    """A linear policy artifact that runs long episodes on the task (a trained policy would)."""
    from ale.policy import linear_policy
    from ale_evaluator.envs import make_env

    env = make_env(task)
    obs_dim, space = int(env.observation_space.shape[0]), env.action_space
    env.close()
    gym_id = task.spec.gym_id
    if gym_id.startswith("CartPole"):  # push towards the falling side: balances for 500 steps
        return linear_policy(np.array([[0, 0, 0, 0], [0, 0, 1, 1]], float), output="discrete"), "pd-balance"
    if gym_id.startswith("Hopper"):  # PD hold of the three hinge joints: stands for 1000 steps
        w = np.zeros((3, obs_dim))
        for j in range(3):
            w[j, 2 + j], w[j, 8 + j] = -5.0, -0.5
        return linear_policy(w, output="clip"), "pd-stand"
    if gym_id.startswith("InvertedPendulum"):  # state feedback: balances for 1000 steps
        return linear_policy(np.array([[1.0, 5.0, 0.3, 0.5]]), output="clip"), "state-feedback"
    if hasattr(space, "n"):
        return linear_policy(np.zeros((int(space.n), obs_dim)), output="discrete"), "zeros"
    return linear_policy(np.zeros((int(np.prod(space.shape)), obs_dim)), output="clip"), "zeros"


def batch_in_process(task: Any, raw: bytes, episodes: int, seed: int, *, meter: bool) -> dict[str, Any]:
    """The same policy rolled out in-process on the same seeds (optionally with the domain meter)."""
    import gymnasium as gym

    from ale.policy import load_policy
    from ale_evaluator.domains import DOMAINS
    from ale_evaluator.envs import make_env

    t0 = perf()
    policy = load_policy(raw)
    env = make_env(task)
    domain = DOMAINS[task.spec.domain]
    space = env.action_space
    discrete = isinstance(space, gym.spaces.Discrete)
    low = None if discrete else space.low.astype(np.float64)
    high = None if discrete else space.high.astype(np.float64)
    start = int(space.start) if discrete else 0
    returns, steps = [], 0
    for index in range(episodes):
        obs, _ = env.reset(seed=seed + index)
        m = domain.meter(env) if meter else None
        total, done = 0.0, False
        while not done:
            action = policy.act(obs[None, :], low, high, start)[0]
            obs, reward, terminated, truncated, _ = env.step(int(action) if discrete else action.astype(space.dtype))
            total += float(reward)
            steps += 1
            done = terminated or truncated
            if m is not None:
                m.record_step(env, float(reward), terminated, truncated)
        if m is not None:
            m.outcome(env)
        returns.append(total)
    env.close()
    elapsed = perf() - t0
    return {
        "elapsed_s": elapsed,
        "episodes_per_s": episodes / elapsed,
        "steps": steps,
        "steps_per_s": steps / elapsed,
        "returns": returns,
    }


#: wait_ms of a long-polling GetBatchEvalStatus: the protocol's limit.
WAIT_MS = 10_000


def batch_remote(client: Any, raw: bytes, episodes: int, seed: int, poll: float, server: Evaluator) -> dict[str, Any]:
    """SubmitBatchEval, then GetBatchEvalStatus until DONE.

    With ``poll`` 0 each status call carries ``wait_ms``, so the evaluator answers the moment the
    job finishes (the protocol's way to wait); with ``poll`` > 0 it is polled every ``poll`` seconds
    without ``wait_ms`` instead.
    """
    from ale.env.v1 import env_pb2 as pb

    srv0 = server.cpu_seconds()
    t0 = perf()
    submitted = client.submit_batch_eval(raw, num_episodes=episodes, seed=seed)
    polls = 0
    while True:
        status = client.get_batch_eval_status(submitted.batch_id, wait_ms=0 if poll else WAIT_MS)
        polls += 1
        if status.state == pb.BATCH_STATE_DONE:
            break
        if status.state == pb.BATCH_STATE_FAILED:
            raise RuntimeError(f"batch evaluation failed: {status.error}")
        time.sleep(poll)
    elapsed = perf() - t0
    srv1 = server.cpu_seconds()
    returns = [e.episode_return for e in sorted(status.result.episodes, key=lambda e: e.index)]
    steps = sum(e.length for e in status.result.episodes)
    out = {
        "elapsed_s": elapsed,
        "episodes_per_s": episodes / elapsed,
        "steps": steps,
        "steps_per_s": steps / elapsed,
        "polls": polls,
        "returns": returns,
    }
    if srv0 is not None and srv1 is not None:
        out["server_cpu_s"] = srv1 - srv0
    return out


# -- one task -----------------------------------------------------------------------------------


def summarise(rounds: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """Median over rounds of ``key`` (and of CPU figures); pooled latency percentiles."""
    out: dict[str, Any] = {key: median([r[key] for r in rounds])}
    lat = [x for r in rounds for x in r.get("latencies", [])]
    if lat:
        out["p50_us"], out["p99_us"] = pct_us(lat, 50), pct_us(lat, 99)
        out["mean_us"] = float(np.mean(lat) * 1e6)
    for extra in ("client_cpu_us_per_call", "server_cpu_us_per_call", "polls", "server_cpu_s", "steps_per_s"):
        vals = [r[extra] for r in rounds if extra in r]
        if vals and extra != key:
            out[extra] = median(vals)
    out["rounds"] = [{k: v for k, v in r.items() if k not in ("latencies", "returns")} for r in rounds]
    return out


def bench_task(task_id: str, ev: Evaluator, args: argparse.Namespace) -> dict[str, Any]:
    import gymnasium as gym
    from gymnasium.envs.mujoco.mujoco_env import MujocoEnv
    from gymnasium.vector import AutoresetMode, SyncVectorEnv

    from ale import catalog
    from ale.client import AleEnvClient, RemoteEnv, RemoteVectorEnv
    from ale_evaluator.envs import make_env

    task = catalog.get_task(task_id)
    rng = np.random.default_rng(12345)
    dur, warm, rounds = args.duration, args.warmup, args.rounds

    local = make_env(task)
    mujoco = isinstance(local.unwrapped, MujocoEnv)
    space = local.action_space
    actions = draw_actions(space, 4096, rng)
    vec_actions = draw_actions(space, 256, rng, VEC_K)
    client_actions = [
        np.asarray([a], dtype=np.int64) if isinstance(space, gym.spaces.Discrete) else a[None, :] for a in actions
    ]

    remote = RemoteEnv(ev.target, task_id=task_id)
    client = AleEnvClient(ev.target)
    created = client.create_env(task_id=task_id, num_envs=1)
    t = perf()
    local_vec = SyncVectorEnv([functools.partial(make_env, task)] * VEC_K, autoreset_mode=AutoresetMode.SAME_STEP)
    local_vec_build = perf() - t
    t = perf()
    remote_vec = RemoteVectorEnv(ev.target, VEC_K, task_id=task_id)
    remote_vec_build = perf() - t

    # Message sizes on the wire (protobuf payload, before gRPC/HTTP2 framing).
    client.reset(created.env_id, 0)
    reply1 = client.step(created.env_id, client_actions[0])
    client.reset(created.env_id, 0)
    from ale.env.v1 import env_pb2 as pb
    from ale.protocol import encode_tensor

    req1 = pb.StepRequest(env_id=created.env_id)
    encode_tensor(client_actions[0], req1.action)
    reqk = pb.StepRequest(env_id=remote_vec.env_id)
    encode_tensor(np.asarray(vec_actions[0]), reqk.action)
    remote_vec.reset(seed=0)
    replyk = client.step(remote_vec.env_id, np.asarray(vec_actions[0]))
    sizes = {
        "step_request_k1": req1.ByteSize(),
        "step_response_k1": reply1.ByteSize(),
        f"step_request_k{VEC_K}": reqk.ByteSize(),
        f"step_response_k{VEC_K}": replyk.ByteSize(),
    }

    drivers: dict[str, tuple[Callable[[], Any], bool, Evaluator | None, int]] = {
        "single_in_process": (SingleDriver(local, actions), False, None, 256),
        "single_remote": (SingleDriver(remote, actions), True, ev, 16),
        "single_remote_client": (ClientDriver(client, created.env_id, client_actions), True, ev, 16),
        "vector_in_process": (VectorDriver(local_vec, vec_actions), False, None, 4),
        "vector_remote": (VectorDriver(remote_vec, vec_actions), False, ev, 4),
    }
    pairs = [("single_in_process", "single_remote", "single_remote_client"), ("vector_in_process", "vector_remote")]
    raw, policy_name = bench_policy(task)
    episodes = args.batch_episodes or task.spec.official_episodes
    if args.quick and not args.batch_episodes:
        episodes = min(episodes, 3)

    results: dict[str, list[dict[str, Any]]] = {name: [] for name in drivers}
    batch_runs: dict[str, list[dict[str, Any]]] = {"in_process": [], "in_process_with_meter": [], "remote": []}
    try:
        log(f"{task_id}: warm-up")
        for call, lat, server, chunk in drivers.values():
            run_window(call, warm, latency=lat, chunk=chunk, server=server)
        batch_in_process(task, raw, 1, BATCH_SEED, meter=False)
        batch_remote(client, raw, 1, BATCH_SEED, args.poll_interval, ev)
        for r in range(rounds):
            log(f"{task_id}: round {r + 1}/{rounds}")
            flip = r % 2 == 1  # alternate the order so drift does not favour one side
            for group in pairs:
                # Both sides alternate in short slices, so a round's two figures share the same load.
                order = list(reversed(group)) if flip else list(group)
                windows: dict[str, list[dict[str, Any]]] = {name: [] for name in group}
                for sl in range(args.slices):
                    for name in order if sl % 2 == 0 else reversed(order):
                        call, lat, server, chunk = drivers[name]
                        windows[name].append(
                            run_window(call, dur / args.slices, latency=lat, chunk=chunk, server=server)
                        )
                for name in group:
                    results[name].append(merge_windows(windows[name]))
            order = (
                ["remote", "in_process", "in_process_with_meter"]
                if flip
                else ["in_process", "in_process_with_meter", "remote"]
            )
            for kind in order:
                if kind == "remote":
                    batch_runs[kind].append(batch_remote(client, raw, episodes, BATCH_SEED, args.poll_interval, ev))
                else:
                    batch_runs[kind].append(
                        batch_in_process(task, raw, episodes, BATCH_SEED, meter=kind == "in_process_with_meter")
                    )
    finally:
        for closer in (remote.close, remote_vec.close, client.close, local.close, local_vec.close):
            with contextlib.suppress(Exception):
                closer()

    single_local = summarise(results["single_in_process"], "calls_per_s")
    single_remote = summarise(results["single_remote"], "calls_per_s")
    single_client = summarise(results["single_remote_client"], "calls_per_s")
    vec_local = summarise(results["vector_in_process"], "calls_per_s")
    vec_remote = summarise(results["vector_remote"], "calls_per_s")
    for s in (vec_local, vec_remote):
        s["env_steps_per_s"] = s["calls_per_s"] * VEC_K
    batch = {k: summarise(v, "episodes_per_s") for k, v in batch_runs.items()}
    vec_goal = GOAL_VEC_MUJOCO if mujoco else GOAL_VEC_CLASSIC
    # Each round measures both sides back to back, so a round's ratio shares that moment's load:
    # the reported ratio is the median of the per-round ratios (the ratio of medians is kept too).
    single_rr = paired(results["single_remote"], results["single_in_process"], "calls_per_s")
    vec_rr = paired(results["vector_remote"], results["vector_in_process"], "calls_per_s")
    batch_rr = paired(batch_runs["remote"], batch_runs["in_process"], "episodes_per_s")
    meter_rr = paired(batch_runs["remote"], batch_runs["in_process_with_meter"], "episodes_per_s")
    single_ratio, vec_ratio, batch_ratio = median(single_rr), median(vec_rr), median(batch_rr)
    ref, got = batch_runs["in_process"][-1]["returns"], batch_runs["remote"][-1]["returns"]
    return {
        "task_id": task_id,
        "gym_id": task.spec.gym_id,
        "mujoco": mujoco,
        "evaluator_startup_s": ev.startup_s,
        "evaluator_step_threads": ev.ready.get("step_threads"),
        "evaluator_rpc_cpu": ev.ready.get("rpc_cpu"),
        "message_bytes": sizes,
        "single": {
            "in_process": {"steps_per_s": single_local["calls_per_s"], **single_local},
            "remote": {"steps_per_s": single_remote["calls_per_s"], "via": "ale.client.RemoteEnv", **single_remote},
            "remote_client": {
                "steps_per_s": single_client["calls_per_s"],
                "via": "ale.client.AleEnvClient.step (no decoding)",
                **single_client,
            },
            "ratio": single_ratio,
            "ratio_per_round": single_rr,
            "ratio_of_medians": ratio(single_remote["calls_per_s"], single_local["calls_per_s"]),
        },
        "vector": {
            "k": VEC_K,
            "build_s": {"in_process": local_vec_build, "remote": remote_vec_build},
            "in_process": {"via": "gymnasium.vector.SyncVectorEnv(SAME_STEP)", **vec_local},
            "remote": {"via": "ale.client.RemoteVectorEnv", **vec_remote},
            "ratio": vec_ratio,
            "ratio_per_round": vec_rr,
            "ratio_of_medians": ratio(vec_remote["calls_per_s"], vec_local["calls_per_s"]),
            "goal": {"min_ratio": vec_goal, "met": bool(vec_ratio >= vec_goal)},
        },
        "batch": {
            "episodes": episodes,
            "seed": BATCH_SEED,
            "policy": policy_name,
            "poll_interval_s": args.poll_interval,
            **batch,
            "ratio": batch_ratio,
            "ratio_per_round": batch_rr,
            "ratio_of_medians": ratio(batch["remote"]["episodes_per_s"], batch["in_process"]["episodes_per_s"]),
            "ratio_with_meter_reference": median(meter_rr),
            "returns_match": bool(len(ref) == len(got) and np.allclose(ref, got, rtol=1e-9, atol=1e-9)),
            "goal": {"min_ratio": GOAL_BATCH, "met": bool(batch_ratio >= GOAL_BATCH)},
        },
    }


def bench_floor(tmp: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    path = tmp / "echo.sock"
    proc: subprocess.Popen[bytes] | None = None
    out = []
    try:
        proc = subprocess.Popen(
            [sys.executable, "-c", ECHO_SERVER, str(path)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            start_new_session=True,
        )
        _wait_line(proc, 30, "echo server")
        for request, response in PINGPONG_SIZES:
            pp = PingPong(path, request, response)
            try:
                run_window(pp.round_trip, args.warmup, latency=True, chunk=64)
                rounds = [run_window(pp.round_trip, args.duration, latency=True, chunk=64) for _ in range(args.rounds)]
            finally:
                pp.close()
            s = summarise(rounds, "calls_per_s")
            out.append(
                {"request_bytes": request, "response_bytes": response, "round_trips_per_s": s.pop("calls_per_s"), **s}
            )
    finally:
        _stop(proc)
    return out


# -- report -------------------------------------------------------------------------------------


def machine_info() -> dict[str, Any]:
    import grpc
    import gymnasium

    info: dict[str, Any] = {
        "nproc": os.cpu_count(),
        "affinity_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "grpcio": grpc.__version__,
        "gymnasium": gymnasium.__version__,
        "numpy": np.__version__,
        "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE"),
        "loadavg_start": os.getloadavg() if hasattr(os, "getloadavg") else None,
    }
    with contextlib.suppress(Exception):
        import mujoco

        info["mujoco"] = mujoco.__version__
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu_model"] = line.split(":", 1)[1].strip()
                break
    return info


NAN = float("nan")


def fmt(x: float, digits: int = 0) -> str:
    if x != x:  # NaN
        return "-"
    return f"{x:,.{digits}f}"


def _row(label: str, local: str = "", remote: str = "", rat: str = "", note: str = "") -> str:
    return f"  {label:<34}{local:>14}{remote:>18}{rat:>8}   {note}".rstrip()


def _waiting(poll: float) -> str:
    return f"poll {poll * 1000:.0f} ms" if poll else "wait_ms"


def _goal(g: dict[str, Any]) -> str:
    return f">= {g['min_ratio']}: {'MET' if g['met'] else 'NOT MET'}"


def render(report: dict[str, Any]) -> str:
    m, cfg = report["machine"], report["config"]
    quick = ", QUICK" if cfg["quick"] else ""
    lines = [
        "",
        f"ALE evaluator benchmark  {report['started_at']}  ({report['wall_s']:.0f} s{quick})",
        f"machine: {m['nproc']} CPUs ({m.get('cpu_model', '?')}), Python {m['python']}, grpcio {m['grpcio']}, "
        f"gymnasium {m['gymnasium']}, mujoco {m.get('mujoco', '-')}",
        f"{cfg['rounds']} round(s) of {cfg['duration_s']} s per measure, in-process and remote alternating in "
        f"{cfg['slices']} slice(s): figures are medians, ratios the median of per-round ratios, latencies pooled",
    ]
    load = [x for x in (m.get("loadavg_start"), m.get("loadavg_end")) if x]
    if load and max(x[0] for x in load) > 0.5 * (m["nproc"] or 1):
        lines.append(
            f"WARNING: the machine was busy (1-min load {', '.join(f'{x[0]:.1f}' for x in load)} on "
            f"{m['nproc']} CPUs): absolute figures are low and ratios noisy"
        )
    lines += ["", "floor: raw AF_UNIX ping-pong between two Python processes"]
    for f in report["floor"]:
        lines.append(
            f"  {f['request_bytes']:>5} B -> {f['response_bytes']:>5} B   {fmt(f['round_trips_per_s']):>9} rt/s   "
            f"p50 {fmt(f['p50_us'], 1):>6} us   p99 {fmt(f['p99_us'], 1):>6} us"
        )
    for t in report["tasks"].values():
        s, v, b = t["single"], t["vector"], t["batch"]
        mb, k = t["message_bytes"], v["k"]
        sr, sc, vr = s["remote"], s["remote_client"], v["remote"]
        lines += [
            "",
            f"{t['task_id']} ({t['gym_id']}{', MuJoCo' if t['mujoco'] else ''}); Step bytes req/resp: "
            f"K=1 {mb['step_request_k1']}/{mb['step_response_k1']}, "
            f"K={k} {mb[f'step_request_k{k}']}/{mb[f'step_response_k{k}']}; evaluator step threads "
            f"{t.get('evaluator_step_threads', '?')}",
            _row("measure", "in-process", "remote", "ratio", "goal"),
            _row(
                "single env steps/s (RemoteEnv)",
                fmt(s["in_process"]["steps_per_s"]),
                fmt(sr["steps_per_s"]),
                fmt(s["ratio"], 3),
                "-",
            ),
            _row("  Step latency p50 / p99 (us)", "", f"{fmt(sr['p50_us'])} / {fmt(sr['p99_us'])}"),
            _row(
                "  CPU us/step client | server",
                fmt(s["in_process"]["client_cpu_us_per_call"]),
                f"{fmt(sr['client_cpu_us_per_call'])} | {fmt(sr.get('server_cpu_us_per_call', NAN))}",
            ),
            _row(
                "  AleEnvClient.step steps/s",
                "",
                fmt(sc["steps_per_s"]),
                fmt(ratio(sc["steps_per_s"], s["in_process"]["steps_per_s"]), 3),
                f"p50 {fmt(sc['p50_us'])} us, p99 {fmt(sc['p99_us'])} us",
            ),
            _row(
                f"vectorised K={k} env-steps/s",
                fmt(v["in_process"]["env_steps_per_s"]),
                fmt(vr["env_steps_per_s"]),
                fmt(v["ratio"], 3),
                _goal(v["goal"]),
            ),
            _row(
                "  CPU us/call client | server",
                fmt(v["in_process"]["client_cpu_us_per_call"]),
                f"{fmt(vr['client_cpu_us_per_call'])} | {fmt(vr.get('server_cpu_us_per_call', NAN))}",
            ),
            *(
                [
                    f"    (the evaluator steps MuJoCo copies on {t['evaluator_step_threads']} threads; in-process is"
                    " one: compare the CPU per call)"
                ]
                if t["mujoco"] and (t.get("evaluator_step_threads") or 1) > 1
                else []
            ),
            _row(
                f"batch episodes/s ({b['episodes']} ep, {_waiting(b['poll_interval_s'])})",
                fmt(b["in_process"]["episodes_per_s"], 2),
                fmt(b["remote"]["episodes_per_s"], 2),
                fmt(b["ratio"], 3),
                _goal(b["goal"]),
            ),
            _row(
                "  in-process + domain meter",
                fmt(b["in_process_with_meter"]["episodes_per_s"], 2),
                "",
                fmt(b["ratio_with_meter_reference"], 3),
                "(remote vs this reference)",
            ),
            _row(
                "  env-steps/s",
                fmt(b["in_process"]["steps_per_s"]),
                fmt(b["remote"]["steps_per_s"]),
                "",
                f"returns match: {'yes' if b['returns_match'] else 'NO'}",
            ),
        ]
    lines += ["", "goals (remote / in-process):"]
    for g in report["goals"]:
        lines.append(f"  {g['task_id']:<18} {g['measure']:<7} ratio {fmt(g['ratio'], 3):>6} {_goal(g)}")
    return "\n".join(lines) + "\n"


# -- main ---------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smoke run: short windows, one round, few episodes")
    p.add_argument(
        "--tasks",
        nargs="+",
        default=None,
        help=f"task ids, space- or comma-separated (default {','.join(DEFAULT_TASKS)})",
    )
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON results (default {DEFAULT_OUT})")
    p.add_argument(
        "--duration", type=float, default=None, help="seconds per measurement window (default 1.0; 0.15 with --quick)"
    )
    p.add_argument("--rounds", type=int, default=None, help="interleaved rounds; medians reported (default 3; 1)")
    p.add_argument(
        "--slices",
        type=int,
        default=None,
        help="alternating in-process/remote slices per window and round (default 4; 1 with --quick)",
    )
    p.add_argument(
        "--batch-episodes",
        type=int,
        default=0,
        help="episodes per batch evaluation (default: the task's official count; 3 with --quick)",
    )
    p.add_argument(
        "--poll-interval",
        type=float,
        default=None,
        help="poll GetBatchEvalStatus every this many seconds instead of waiting with wait_ms (default 0: wait)",
    )
    p.add_argument(
        "--step-threads",
        default="auto",
        help="the evaluator's --step-threads (default auto; 1 measures stepping MuJoCo copies in turn)",
    )
    args = p.parse_args(argv)
    names = [n for chunk in (args.tasks or DEFAULT_TASKS) for n in chunk.split(",") if n]
    args.tasks = list(dict.fromkeys(names))
    if args.duration is None:
        args.duration = 0.15 if args.quick else 1.0
    if args.rounds is None:
        args.rounds = 1 if args.quick else 3
    if args.poll_interval is None:
        args.poll_interval = 0.0
    if args.slices is None:
        args.slices = 1 if args.quick else 4
    args.warmup = 0.05 if args.quick else min(0.3, args.duration)
    if args.step_threads != "auto" and not (args.step_threads.isdigit() and 1 <= int(args.step_threads) <= 8):
        p.error("--step-threads must be 'auto' or a number from 1 to 8")
    if args.duration <= 0 or args.rounds < 1 or args.slices < 1 or args.poll_interval < 0:
        p.error("--duration must be positive, --rounds and --slices at least 1, --poll-interval not negative")
    return args


def _json_safe(x: Any) -> Any:
    """NaN and infinities become null: the file stays strict JSON."""
    if isinstance(x, float):
        return x if x == x and abs(x) != float("inf") else None
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_json_safe(v) for v in x]
    return x


@contextlib.contextmanager
def _interruptible() -> Iterator[None]:
    """SIGTERM raises SystemExit and SIGINT KeyboardInterrupt, so the finally blocks stop the evaluators.

    SIGINT is set explicitly because a shell starts background jobs with it ignored.
    """

    def on_term(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    previous = {
        signal.SIGTERM: signal.signal(signal.SIGTERM, on_term),
        signal.SIGINT: signal.signal(signal.SIGINT, signal.default_int_handler),
    }
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from ale import catalog

    for task_id in args.tasks:
        catalog.get_task(task_id)  # fail fast on a typo
    started_at = dt.datetime.now(dt.UTC)
    t_start = perf()
    tmp = Path(tempfile.mkdtemp(prefix="ale-b-"))  # short: Unix socket paths are limited to ~100 bytes
    evaluators: list[Evaluator] = []
    try:
        with _interruptible():
            for i, task_id in enumerate(args.tasks):  # start them all at once; they idle until used
                ev = Evaluator(task_id, tmp, i, ["--step-threads", args.step_threads])
                evaluators.append(ev)
                ev.spawn()
            machine = machine_info()
            for ev in evaluators:
                ev.wait_ready()
                log(f"evaluator for {ev.task_id} ready on {ev.target} (pid {ev.proc.pid if ev.proc else '?'})")
            log("floor: AF_UNIX ping-pong")
            floor = bench_floor(tmp, args)
            tasks = {}
            for ev in evaluators:
                tasks[ev.task_id] = bench_task(ev.task_id, ev, args)
                ev.stop()  # its CPU is no longer needed
    finally:
        for ev in evaluators:
            ev.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    finished_at = dt.datetime.now(dt.UTC)
    machine["loadavg_end"] = os.getloadavg() if hasattr(os, "getloadavg") else None
    goals = []
    for t in tasks.values():
        for measure in ("vector", "batch"):
            g = t[measure]
            goals.append(
                {
                    "task_id": t["task_id"],
                    "measure": measure,
                    "ratio": g["ratio"],
                    "min_ratio": g["goal"]["min_ratio"],
                    "met": g["goal"]["met"],
                }
            )
    report = {
        "schema": "ale-bench-evaluator/v1",
        "started_at": started_at.isoformat(timespec="seconds"),
        "finished_at": finished_at.isoformat(timespec="seconds"),
        "wall_s": perf() - t_start,
        "machine": machine,
        "config": {
            "quick": args.quick,
            "tasks": args.tasks,
            "duration_s": args.duration,
            "rounds": args.rounds,
            "slices": args.slices,
            "warmup_s": args.warmup,
            "vec_k": VEC_K,
            "poll_interval_s": args.poll_interval,
            "batch_episodes": args.batch_episodes or "official",
            "step_threads": args.step_threads,
            "argv": sys.argv[1:] if argv is None else argv,
        },
        "floor": floor,
        "tasks": tasks,
        "goals": goals,
        "all_goals_met": all(g["met"] for g in goals),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(_json_safe(report), indent=2, allow_nan=False) + "\n")
    sys.stdout.write(render(report))
    print(f"\nJSON: {args.out}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("interrupted; evaluators stopped", file=sys.stderr)
        sys.exit(130)
