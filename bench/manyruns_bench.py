"""Many-runs benchmark: ``ale run --all`` with ``--jobs 1`` and ``--jobs 2`` side by side.

Run: .venv/bin/python bench/manyruns_bench.py [--quick] [--repeats N] [--out bench/results/manyruns.json]

Two workloads, each run with --jobs 1 and --jobs 2 in alternation (so that the machine's load, which
others share, falls on both alike), the bundle of every run checked with ``ale inspect``:

1. ``demo``: ``ale run --all --episodes 2`` with the bundled demo agent: the release's four tasks as
   a user runs them. Its speed-up is bounded by its longest task (hopper-hop's agent trains).
2. ``sleep``: the four tasks with an agent that sleeps a fixed time and leaves no policy: equal
   tasks, so the ideal speed-up of two at a time is 2 and what falls short of it is the harness's
   (its start-up, the tasks' set-up, placing the spools, the bundle).

Printed and written: each run's wall time, the medians, the ratio (jobs 1 / jobs 2: the speed-up),
how many tasks the admission rule let run at once, the machine's CPUs and load average.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ALE = [sys.executable, "-m", "ale.runner.cli"]


def _run(args: list[str], jobs: int, workdir: Path) -> dict[str, Any]:
    out = Path(tempfile.mkdtemp(prefix="out-", dir=workdir))
    env = {k: v for k, v in os.environ.items() if k not in ("ALE_RECIPIENT",)} | {"TMPDIR": str(workdir)}
    started = time.perf_counter()
    proc = subprocess.run(
        [*ALE, "run", *args, "--jobs", str(jobs), "--plain", "--out", str(out)],
        cwd=workdir, env=env, capture_output=True, text=True, timeout=3600,
    )  # fmt: skip
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"ale run --jobs {jobs} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    (bundle,) = out.glob("*.ale")
    (key,) = out.glob("*.key")
    inspected = subprocess.run([*ALE, "inspect", str(bundle), "--identity", str(key)], capture_output=True,
                               text=True, timeout=600, env=env)  # fmt: skip
    if inspected.returncode != 0:
        raise SystemExit(f"the bundle of ale run --jobs {jobs} does not verify:\n{inspected.stderr[-4000:]}")
    at_once = re.search(r"running up to (\d+) of (\d+) tasks at once", proc.stderr)
    return {"jobs": jobs, "wall_s": round(wall, 3), "at_once": int(at_once.group(1)) if at_once else 1}


def _workload(name: str, args: list[str], repeats: int, workdir: Path) -> dict[str, Any]:
    runs: list[dict[str, Any]] = []
    for i in range(repeats):
        for jobs in (1, 2) if i % 2 == 0 else (2, 1):
            run = _run(args, jobs, workdir)
            runs.append(run)
            print(f"  {name}: --jobs {jobs}: {run['wall_s']:.1f} s ({run['at_once']} at once)", flush=True)
    one = statistics.median(r["wall_s"] for r in runs if r["jobs"] == 1)
    two = statistics.median(r["wall_s"] for r in runs if r["jobs"] == 2)
    return {
        "args": args,
        "runs": runs,
        "median_wall_s": {"jobs_1": one, "jobs_2": two},
        "speedup": round(one / two, 3),
        "at_once": max(r["at_once"] for r in runs if r["jobs"] == 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the sleep workload once, 3 s a task")
    parser.add_argument("--repeats", type=int, default=None, help="runs of each --jobs per workload")
    parser.add_argument("--sleep", type=float, default=10.0, help="seconds the sleep workload's agent sleeps")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "manyruns.json"))
    args = parser.parse_args()
    from ale.runner import agent_env

    sleep_s = 3.0 if args.quick else args.sleep
    sleeper = f"{agent_env.PYTHON} -c 'import time; time.sleep({sleep_s})'"
    workloads = {"sleep": ["--all", "--episodes", "1", "--agent-cmd", sleeper]}
    if not args.quick:
        workloads = {"demo": ["--all", "--episodes", "2"], **workloads}
    repeats = args.repeats or (1 if args.quick else 2)
    load = os.getloadavg()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="ale-mrb-") as folder:  # short: run folders hold Unix sockets
        for name, run_args in workloads.items():
            results[name] = _workload(name, run_args, repeats if name == "sleep" else 1, Path(folder))
    document = {
        "bench": "manyruns",
        "when": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": {
            "cpus": len(os.sched_getaffinity(0)),
            "load_average_at_start": [round(x, 2) for x in load],
            "python": platform.python_version(),
        },
        "workloads": results,
    }
    for name, r in results.items():
        m = r["median_wall_s"]
        print(f"{name}: --jobs 1 {m['jobs_1']:.1f} s, --jobs 2 {m['jobs_2']:.1f} s: {r['speedup']:.2f}x "
              f"({r['at_once']} tasks at once)")  # fmt: skip
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(document, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
