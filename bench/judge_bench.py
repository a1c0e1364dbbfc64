"""Judge-input benchmark: what rebuilding the judge input costs a verifier (and the bundle writer).

Run: .venv/bin/python bench/judge_bench.py [--lines N] [--out bench/results/judge.json]

A trajectory of N canonical lines (a real chain, built with ale.core.trajectory.ChainBuilder): one
reproduction task whose agent writes N stdout lines and event-channel calls, with a snapshot of
three code files, then an open task of the same size. Timed, median of five:

1. ``task_windows`` of the reproduction task over the whole stream (the open task's lines are
   skipped without parsing);
2. ``build_input`` of that window (the selection, the cuts, the document, its SHA-256).

Prints seconds and microseconds per line and writes JSON with ``--out``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from ale import catalog
from ale.core.judge_input import FileEntry, build_input, snapshot_events, task_windows
from ale.core.trajectory import ChainBuilder

REPRO, OPEN = "pendulum-lqr@1.0.0", "cartpole-balance@1.0.0"


def trajectory(lines: int) -> bytes:
    chain = ChainBuilder()
    out = []
    t = 0.0

    def emit(producer: str, kind: str, data: dict) -> None:
        nonlocal t
        t += 0.001
        out.append(chain.append(producer, kind, data, wall_time=1.8e9 + t, monotonic=t)[1])

    emit("trusted_harness", "run_started", {"tasks": [REPRO, OPEN], "run_id": "run-bench", "nonce": None})
    for ref in (REPRO, OPEN):
        emit("trusted_harness", "task_started", {"task": ref, "digest": "0" * 64, "mode": "interactive"})
        emit("trusted_harness", "agent_started", {"task": ref, "command": ["python", "agent.py"]})
        for i in range(lines // 4):
            emit("untrusted_agent", "tool_call", {"tool": "shell", "input": f"python step_{i}.py --seed {i}"})
            emit("untrusted_agent", "stdout", {"text": f"step {i}: reward 1.0 observation [0.01, -0.02, 0.03]"})
        emit("trusted_harness", "agent_finished", {"task": ref, "exit_status": 0})
        if ref == REPRO:
            code = ("import numpy as np\n" * 200).encode()
            entries = [FileEntry(f"src/m{i}.py", "file", len(code), False, code) for i in range(3)]
            for n, data in enumerate(snapshot_events(ref, entries, 0)):
                emit("trusted_harness", "artifact_file" if n else "artifact_snapshot", data)
        emit("trusted_harness", "task_finished", {"task": ref, "status": "completed", "reason": ""})
    emit("trusted_harness", "run_finished", {"tasks": {REPRO: "completed", OPEN: "completed"}})
    return b"".join(out)


def _median(call: object, repeat: int = 5) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        call()  # type: ignore[operator]
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--lines", type=int, default=100_000)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    raw = trajectory(args.lines)
    count = raw.count(b"\n")
    context = catalog.judge_context(catalog.get_task("pendulum-lqr"))
    window = task_windows(raw, [REPRO])[REPRO]
    windows_s = _median(lambda: task_windows(raw, [REPRO]))
    build_s = _median(lambda: build_input(window, context, "run-bench"))
    result = {
        "lines": count,
        "bytes": len(raw),
        "window_events": len(window),
        "task_windows_s": round(windows_s, 4),
        "task_windows_us_per_line": round(windows_s / count * 1e6, 3),
        "build_input_s": round(build_s, 4),
        "build_input_us_per_window_event": round(build_s / len(window) * 1e6, 3),
        "input_bytes": len(build_input(window, context, "run-bench").text),
    }
    for key, value in result.items():
        print(f"{key}: {value}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
