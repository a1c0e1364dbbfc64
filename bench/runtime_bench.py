"""Runtime benchmark: the OCI runtimes (podman, docker) against the local runtime, side by side in one run.

Run (as root, with podman, skopeo and runc; docker: the docker CLI and DOCKER_HOST at an engine such
as ``podman system service``, else it is left out):

    .venv/bin/python bench/runtime_bench.py [--quick] [--out bench/results/runtime.json]

1. Image build: ``ale images build`` of each image into a fresh folder from the warm download cache
   (what a rebuild costs once the pinned downloads are there), and the image sizes (the layers'
   uncompressed bytes, as the layout holds them).
2. Sandbox start and teardown: ``run_sandboxed`` of ``/bin/true`` (everything a sandbox gets: the
   container or bubblewrap, the cgroup, /tmp, the filter, the removal after), median of N.
3. A whole ``ale run cartpole-balance`` with an agent that writes its policy and exits at once, per
   runtime: wall time, and the harness's overhead as bench/harness_bench.py measures it (wall time -
   agent phase - official evaluation, both read back from the trajectory) with where it goes. Each
   OCI runtime's figures are also given as ratios to the local runtime's. The goal: a podman run's
   harness overhead at most 1.5 times the local runtime's.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from harness_bench import bench_overhead, sandbox_starts  # noqa: E402

IMAGES = ("agent-base", "evaluator")


def build_images(out: Path) -> dict[str, Any]:
    """Build both images into ``out`` (warm cache), lock them, and measure each image's size."""
    from ale.images import attest, definition, layout
    from ale.images.build import build_image
    from ale.images.fetch import default_cache

    result: dict[str, Any] = {}
    defs = [definition.load(ROOT / "images" / f"{name}.toml") for name in IMAGES]
    for d in defs:
        started = time.perf_counter()
        built = build_image(d, ROOT, out / d.name, default_cache(), log=lambda _line: None)
        seconds = time.perf_counter() - started
        _digest, manifest = layout.read_manifest(out / d.name)
        layers = [int(x["size"]) for x in manifest["layers"]]
        result[d.name] = {
            "digest": built.digest,
            "build_s": seconds,
            "layers": len(layers),
            "size_bytes": sum(layers),
        }
    attest.write_lock(out / "images.lock.json", attest.read_lock_entries(out, defs))
    return result


def _runtime(name: str) -> Any:
    from ale.runner import runtimes

    runtime = runtimes.make(name)
    runtime.check()
    return runtime


async def _starts(name: str, n: int) -> dict[str, Any]:
    """run_sandboxed(/bin/true) n times on the named runtime (harness_bench's measure)."""
    r = await sandbox_starts(n, name)
    return {"runs": n, "check_s": r["check_s"], "median_s": r["start_and_teardown_median_s"],
            "min_s": r["start_and_teardown_min_s"]}  # fmt: skip


def bench_run(name: str, runs: int, episodes: int, env: dict[str, str]) -> dict[str, Any]:
    """``ale run cartpole-balance --runtime NAME`` with the instant agent, ``runs`` times (as
    bench/harness_bench.py measures the local runtime's overhead)."""
    return bench_overhead(runs, episodes, runtime=name, env=env)


def _docker_reachable() -> str | None:
    if shutil.which("docker") is None:
        return "no docker CLI"
    probe = subprocess.run(["docker", "version", "--format", "{{.Server.Version}}"], capture_output=True, text=True)
    return None if probe.returncode == 0 else "DOCKER_HOST reaches no engine"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    parser.add_argument("--out", default=str(ROOT / "bench/results/runtime.json"))
    args = parser.parse_args()
    starts_n, runs = (3, 1) if args.quick else (15, 5)
    if os.geteuid() != 0:
        raise SystemExit("the OCI runtimes run a rootful engine: run this as root")
    os.environ.setdefault("CONTAINERS_CONF", str(ROOT / ".ci" / "containers.conf"))
    layouts = Path(tempfile.mkdtemp(prefix="ale-rb-images-"))
    try:
        images = build_images(layouts)
        os.environ["ALE_IMAGES_DIR"], os.environ["ALE_IMAGES_LOCK"] = str(layouts), str(layouts / "images.lock.json")
        names = ["local", "podman"]
        skipped = {}
        if (why := _docker_reachable()) is None:
            names.append("docker")
        else:
            skipped["docker"] = why
        for name in names[1:]:  # load the images into the engines' storage before anything is timed
            _runtime(name).close()
        starts = {name: trio.run(_starts, name, starts_n) for name in names}
        whole = {name: bench_run(name, runs, 5, dict(os.environ)) for name in names}
    finally:
        shutil.rmtree(layouts, ignore_errors=True)
    local_start, local_run = starts["local"]["median_s"], whole["local"]["median"]
    ratios = {
        name: {
            "sandbox_start": starts[name]["median_s"] / local_start,
            "overhead": whole[name]["median"]["overhead_s"] / local_run["overhead_s"],
            "wall": whole[name]["median"]["wall_s"] / local_run["wall_s"],
        }
        for name in names[1:]
    }
    print("images (built from the warm download cache, uncompressed layer bytes):")
    for name, i in images.items():
        print(f"  {name:<11} {i['size_bytes'] / 2**20:7.1f} MiB in {i['layers']} layers, built in {i['build_s']:.1f} s")
    print(f"sandbox start + teardown (/bin/true, median of {starts_n}):")
    for name in names:
        s = starts[name]
        ratio = f"  ({ratios[name]['sandbox_start']:.1f}x local)" if name in ratios else ""
        times = f"{s['median_s'] * 1000:7.0f} ms (min {s['min_s'] * 1000:.0f} ms)"
        print(f"  {name:<7} {times}, check() {s['check_s'] * 1000:.0f} ms{ratio}")
    print(f"ale run cartpole-balance, instant agent, 5 episodes (median of {runs}):")
    header = "  runtime   wall    agent   official  overhead (start-up, evaluator start, task end, bundle+exit)"
    print(header)
    for name in names:
        m = whole[name]["median"]
        parts = (
            f"{m['startup_s']:.2f}, {m['evaluator_start_s']:.2f}, {m['task_end_s']:.2f}, {m['bundle_and_exit_s']:.2f}"
        )
        print(
            f"  {name:<7} {m['wall_s']:6.2f} s {m['agent_s']:6.2f} s {m['official_s']:7.2f} s {m['overhead_s']:7.2f} s"
            f"  ({parts})"
        )
    for name, r in ratios.items():
        verdict = "meets" if r["overhead"] <= 1.5 else "misses"
        print(
            f"  ratio {name}/local: overhead {r['overhead']:.2f} ({verdict} the 1.5 goal), wall {r['wall']:.2f}, "
            f"sandbox start {r['sandbox_start']:.1f}"
        )
    for name, why in skipped.items():
        print(f"  ({name} left out: {why})")
    result = {
        "benchmark": "runtime",
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"nproc": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "quick": args.quick,
        "images": images,
        "sandbox_start": starts,
        "run": whole,
        "ratios_to_local": ratios,
        "goal": {"overhead_ratio_podman_at_most": 1.5, "met": ratios["podman"]["overhead"] <= 1.5},
        "left_out": skipped,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
