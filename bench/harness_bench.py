"""Harness benchmark: trajectory recording throughput and the harness's own overhead in `ale run`.

Run: .venv/bin/python bench/harness_bench.py [--quick] [--out bench/results/harness.json]

1. Trajectory recording: events/s through the real Recorder (caps, grammar, RFC 8785 canonical JSON, SHA-256
   chain, writer thread), side by side with the floor of writing the same events as plain
   ``json.dumps`` lines, in one run. Ratio = chained / plain.
2. Harness overhead: ``ale run cartpole-balance`` with an agent that writes its policy and exits
   at once; overhead = run wall time - agent phase - official evaluation (both read back from
   the trajectory's harness events). Median of several runs.
3. Sandbox start and teardown: the local runtime running ``/bin/true`` with all the isolation the
   machine provides (cgroup, tmpfs /tmp, seccomp, per-run uid), and the cost of its ``check()``.
4. The agent's Python environment (ale/runner/agent_env.py): its first build on a machine
   (a fresh cache folder: once per machine and content) and the per-run cost once it is cached
   (the digest and a lookup), which is part of the overhead above.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parents[1]


def _payload(i: int) -> dict:
    return {"text": f"step {i}: reward 1.0 observation [0.01, -0.02, 0.03, 0.04]", "i": i}


TASK = "cartpole-balance@1.0.0"


async def _recorder_rate(n: int, path: Path) -> float:
    """A whole one-task run (the grammar's order) of ``n`` events, nearly all agent stdout lines."""
    from ale.runner.recorder import open_recorder

    started = time.perf_counter()
    async with open_recorder(path) as rec:
        rec.emit("trusted_harness", "run_started", {"nonce": None, "run_id": "bench", "tasks": [TASK]})
        for kind in ("task_started", "evaluator_started", "agent_started"):
            rec.emit("trusted_harness", kind, {"task": TASK})
        for i in range(n - 9):
            rec.emit("untrusted_agent", "stdout", _payload(i))
            if i % 1000 == 0:
                await trio.lowlevel.checkpoint()
        for kind in ("agent_finished", "official_evaluation_started", "official_evaluation_skipped", "task_finished"):
            rec.emit("trusted_harness", kind, {"task": TASK})
        rec.emit("trusted_harness", "run_finished", {"tasks": {TASK: "not_completed"}})
    return n / (time.perf_counter() - started)


def _plain_rate(n: int, path: Path) -> float:
    started = time.perf_counter()
    with open(path, "w") as fh:
        for i in range(n):
            fh.write(json.dumps({"producer": "untrusted_agent", "kind": "stdout", "data": _payload(i)}) + "\n")
    return n / (time.perf_counter() - started)


def bench_recording(n: int, rounds: int) -> dict:
    chained, plain = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            p1, p2 = Path(tmp) / f"c{r}.jsonl", Path(tmp) / f"p{r}.jsonl"
            chained.append(trio.run(_recorder_rate, n, p1))
            plain.append(_plain_rate(n, p2))
        from ale.core.trajectory import verify_chain

        verify_started = time.perf_counter()
        summary = verify_chain((Path(tmp) / "c0.jsonl").read_bytes())
        verify_rate = summary.events / (time.perf_counter() - verify_started)
    c, p = statistics.median(chained), statistics.median(plain)
    return {
        "events": n,
        "chained_events_per_s": c,
        "plain_json_events_per_s": p,
        "ratio_chained_to_plain": c / p,
        "verify_events_per_s": verify_rate,
    }


AGENT = (
    "import os, numpy as np; from ale.policy import linear_policy; "
    "open(os.environ['ALE_WORKSPACE'] + '/policy.safetensors', 'wb').write("
    "linear_policy(np.array([[0, 0, 0, 0], [0, 0.5, 10, 2.0]]), output='discrete'))"
)


def _events(bundle: Path, key: Path) -> list[dict]:
    from ale.core.bundle import unpack
    from ale.runner.inspect import read_identity

    files = unpack(bundle.read_bytes(), read_identity(key))
    import zstandard

    lines = zstandard.ZstdDecompressor().decompressobj().decompress(files["events.jsonl.zst"]).splitlines()
    return [json.loads(line) for line in lines]


def _span(events: list[dict], start: str, end: str) -> float:
    t = {e["kind"]: e["monotonic"] for e in events if e["producer"] == "trusted_harness" and e["kind"] in (start, end)}
    return t[end] - t[start]


def _wall_times(events: list[dict]) -> dict[str, float]:
    """The harness's events' wall times (seconds since the epoch), by kind (the first of each)."""
    out: dict[str, float] = {}
    for e in events:
        if e["producer"] == "trusted_harness" and e["kind"] not in out:
            out[e["kind"]] = datetime.datetime.fromisoformat(e["wall_time"].replace("Z", "+00:00")).timestamp()
    return out


def bench_overhead(runs: int, episodes: int, *, runtime: str = "local", env: dict[str, str] | None = None) -> dict:
    """``ale run cartpole-balance --runtime RUNTIME`` with the instant agent, ``runs`` times: wall
    time, the agent's and the official evaluation's spans, and the harness's overhead (the rest),
    split into where it goes. bench/runtime_bench.py runs the same for each runtime."""
    samples = []
    from ale.runner.agent_env import PYTHON as python  # the sandbox's own interpreter

    for _ in range(runs):
        with tempfile.TemporaryDirectory() as out:
            started, started_wall = time.perf_counter(), time.time()
            proc = subprocess.run(
                [sys.executable, "-m", "ale.runner.cli", "run", "cartpole-balance", "--plain", "--out", out,
                 "--runtime", runtime, "--episodes", str(episodes), "--agent-cmd", f"{python} -c \"{AGENT}\""],
                capture_output=True, text=True, cwd=out, env=env,
            )  # fmt: skip
            wall, ended_wall = time.perf_counter() - started, time.time()
            if proc.returncode != 0:
                raise SystemExit(f"ale run --runtime {runtime} failed:\n{proc.stderr}")
            bundle = Path(proc.stdout.strip().splitlines()[-1])
            events = _events(bundle, next(Path(out).glob("*.key")))
            agent = _span(events, "agent_started", "agent_finished")
            official = _span(events, "official_evaluation_started", "official_evaluation_finished")
            at = _wall_times(events)
            samples.append(
                {"wall_s": wall, "agent_s": agent, "official_s": official, "overhead_s": wall - agent - official,
                 # where the overhead goes: start-up (interpreter, code, checks) until run_started, the
                 # evaluator's start, the task's end, and the bundle plus the exit after run_finished
                 "startup_s": at["run_started"] - started_wall,
                 "evaluator_start_s": at["evaluator_started"] - at["task_started"],
                 "task_end_s": at["task_finished"] - at["official_evaluation_finished"],
                 "bundle_and_exit_s": ended_wall - at["run_finished"]}
            )  # fmt: skip
    med = {k: statistics.median(s[k] for s in samples) for k in samples[0]}
    return {"runs": runs, "episodes": episodes, "median": med, "samples": samples,
            "overhead_fraction_of_wall": med["overhead_s"] / med["wall_s"]}  # fmt: skip


def bench_agent_env(builds: int, lookups: int) -> dict:
    """The agent environment's first build (into a fresh cache folder) and its warm per-run cost."""
    import shutil

    from ale.runner import agent_env

    cold = []
    for _ in range(builds):
        cache = Path(tempfile.mkdtemp(prefix="ale-bench-env-"))
        try:
            started = time.perf_counter()
            env = agent_env.ensure(cache_dir=cache / "agent-env")
            cold.append(time.perf_counter() - started)
        finally:
            shutil.rmtree(cache, ignore_errors=True)
    agent_env.ensure()  # the default cache, as `ale run` uses it
    warm = []
    for _ in range(lookups):
        started = time.perf_counter()
        agent_env.ensure()
        warm.append(time.perf_counter() - started)
    return {
        "first_build_median_s": statistics.median(cold),
        "warm_ensure_median_s": statistics.median(warm),
        "warm_ensure_min_s": min(warm),
        "files": len(agent_env.plan().dist_files),
        "distributions": list(env.distributions),
    }


def _sandbox_folder() -> Path:
    folder = Path(tempfile.mkdtemp(prefix="ale-bench-"))
    (folder / "ws").mkdir()
    (folder / "task").mkdir()
    folder.chmod(0o755)
    return folder


async def sandbox_starts(n: int, runtime_name: str = "local") -> dict:
    """Start and tear down a sandbox running /bin/true n times on the named runtime (cgroup, /tmp,
    seccomp, bwrap or the container, cleanup). bench/runtime_bench.py runs it for each runtime."""
    import shutil
    import socket

    from ale.runner import agent_env, runtimes
    from ale.runner.runtime import SandboxSpec

    check_started = time.perf_counter()
    runtime = runtimes.make(runtime_name)
    runtime.check()
    check_s = time.perf_counter() - check_started
    folder = _sandbox_folder()
    listener = socket.socket(socket.AF_UNIX)
    try:
        listener.bind(str(folder / "e.sock"))
        spec = SandboxSpec(
            command=("/bin/true",), workspace=folder / "ws", workspace_writable=True, task_dir=folder / "task",
            evaluator_socket=folder / "e.sock", env={"PATH": "/usr/bin:/bin"},
            agent_env=agent_env.ensure(),  # built once, as the harness does; measured on its own below
        )  # fmt: skip
        times = []
        for _ in range(n):
            started = time.perf_counter()
            result = await runtime.run_sandboxed(spec, lambda _s, _l: None)
            times.append(time.perf_counter() - started)
            if result.exit_status != 0:
                raise SystemExit(f"{runtime_name}: the sandbox did not run /bin/true: {result}")
        isolation = runtime.attestation()["isolation"]
    finally:
        listener.close()
        runtime.close()
        shutil.rmtree(folder, ignore_errors=True)
    return {
        "runs": n,
        "check_s": check_s,
        "start_and_teardown_median_s": statistics.median(times),
        "start_and_teardown_min_s": min(times),
        "isolation": isolation,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    parser.add_argument("--out", default=str(ROOT / "bench/results/harness.json"))
    args = parser.parse_args()
    n, rounds, runs = (5_000, 1, 1) if args.quick else (50_000, 3, 3)
    recording = bench_recording(n, rounds)
    overhead = bench_overhead(runs, episodes=5)
    env = bench_agent_env(1 if args.quick else 3, 5 if args.quick else 20)
    starts = trio.run(sandbox_starts, 5 if args.quick else 30)
    print(f"trajectory recording ({n} events, median of {rounds}):")
    print(f"  chained (RFC 8785 + SHA-256 chain + writer thread): {recording['chained_events_per_s']:,.0f} events/s")
    print(f"  plain json.dumps lines (floor):                     {recording['plain_json_events_per_s']:,.0f} events/s")
    print(f"  ratio chained/plain: {recording['ratio_chained_to_plain']:.2f}")
    print(f"  chain verification: {recording['verify_events_per_s']:,.0f} events/s")
    m = overhead["median"]
    print(f"ale run cartpole-balance, instant agent, 5 episodes (median of {runs}):")
    share = overhead["overhead_fraction_of_wall"]
    print(f"  wall {m['wall_s']:.2f} s = agent {m['agent_s']:.2f} s + official evaluation {m['official_s']:.2f} s")
    print(f"  + harness overhead {m['overhead_s']:.2f} s ({share:.0%} of wall): start-up {m['startup_s']:.2f} s, "
          f"evaluator start {m['evaluator_start_s']:.2f} s, task end {m['task_end_s']:.2f} s, "
          f"bundle and exit {m['bundle_and_exit_s']:.2f} s")  # fmt: skip
    print(f"  ratio overhead/wall: {share:.2f}")
    in_force = [k for k, v in starts["isolation"].items() if v["in_force"]]
    print(f"sandbox start + teardown (/bin/true, median of {starts['runs']}; isolation: {', '.join(in_force)}):")
    med, low = starts["start_and_teardown_median_s"], starts["start_and_teardown_min_s"]
    print(f"  {med * 1000:.1f} ms (min {low * 1000:.1f} ms)")
    print(f"  runtime check() (probes, seccomp compile): {starts['check_s'] * 1000:.0f} ms")
    print(f"agent environment ({env['files']} distribution files, {len(env['distributions'])} distributions):")
    print(f"  first build on a machine: {env['first_build_median_s']:.2f} s (median of {1 if args.quick else 3})")
    warm, ratio = env["warm_ensure_median_s"], env["warm_ensure_median_s"] / m["overhead_s"]
    print(f"  per run once cached: {warm * 1000:.0f} ms ({ratio:.0%} of the harness overhead)")
    result = {
        "benchmark": "harness",
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"nproc": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "quick": args.quick,
        "recording": recording,
        "overhead": overhead,
        "agent_env": env,
        "sandbox_start": starts,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
