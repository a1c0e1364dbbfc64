"""Trajectory viewer benchmark: ``ale view`` on a bundle of 100,000 events.

Run: .venv/bin/python bench/view_bench.py [--events 100000] [--rounds 3] [--browser] [--out bench/results/view.json]

One real run (``ale run cartpole-balance --episodes 5``) is re-chained with extra events in its agent
phase (tests/view_fixtures.py: stdout and stderr lines, shell commands, messages, tool calls and
results, notes, evaluator RPCs, in turn) until the trajectory holds ``--events`` events, and packed
to the run's key: a bundle every offline check passes. Then ``--rounds`` times, each step of ``ale
view BUNDLE --identity KEY --out FILE`` is timed: decryption and the offline checks (``ale
inspect``'s, :func:`ale.runner.view.load`), parsing the trajectory and building the page's model
(:func:`ale.runner.view.view_of`), rendering the HTML, writing the file. The median of each and of
their sum are reported, with the page's size. With ``--browser`` (needs chromium, chromedriver and
selenium), headless Chromium opens the file and the page's own work is timed: until its lists are
built, a text search over every event, a producer filter, the last page, opening an event's data.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import view_fixtures as vf  # noqa: E402  (the test suite's fixture module)

from ale import __version__  # noqa: E402
from ale.runner import view  # noqa: E402


def _git_commit() -> str | None:
    proc = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False)
    return proc.stdout.strip() or None


def make_bundle(folder: Path, events: int) -> tuple[vf.RealRun, Path, dict[str, Any]]:
    run = vf.real_run(folder / "run")
    grower = vf.Grower(run.files())
    extra = max(0, events - len(grower.events))
    started = time.perf_counter()
    files = grower.build(vf.ordinary(extra), level=10)
    path = vf.write_bundle(run, files, folder / "big.ale")
    info = {
        "events": len(grower.events) + extra,
        "extra_events": extra,
        "ciphertext_bytes": path.stat().st_size,
        "events_zst_bytes": len(files["events.jsonl.zst"]),
        "build_s": round(time.perf_counter() - started, 3),
    }
    return run, path, info


def time_once(bundle: Path, key: Path, out: Path) -> dict[str, float]:
    """Each step's wall time (``*_s``) and this process's CPU time (``*_cpu_s``: the machine may be shared)."""
    times: dict[str, float] = {}
    state: dict[str, Any] = {}
    steps = (
        ("decrypt_and_check", lambda: state.update(report=view.load(bundle, key))),
        ("parse_and_model", lambda: state.update(model=view.view_of(state["report"]))),
        ("render", lambda: state.update(page=view.render(state["model"], source=bundle.name))),
        ("write", lambda: view.write_private(out, state["page"])),
    )
    for name, step in steps:
        wall, cpu = time.perf_counter(), time.process_time()
        step()
        times[f"{name}_s"] = time.perf_counter() - wall
        times[f"{name}_cpu_s"] = time.process_time() - cpu
    times["total_s"] = sum(times[f"{name}_s"] for name, _ in steps)
    times["total_cpu_s"] = sum(times[f"{name}_cpu_s"] for name, _ in steps)
    times["view_only_s"] = times["total_s"] - times["decrypt_and_check_s"]
    times["view_only_cpu_s"] = times["total_cpu_s"] - times["decrypt_and_check_cpu_s"]
    return times


_BROWSER_JS = {
    "search": """
        const t0 = performance.now(); const f = document.getElementById('tl-find');
        f.value = arguments[0]; f.dispatchEvent(new KeyboardEvent('keydown', {key: 'Enter'}));
        return [performance.now() - t0, document.getElementById('tl-count').dataset.matching];""",
    "producer": """
        const t0 = performance.now(); const box = document.querySelector('input.tl-producer[value="3"]');
        box.click(); const n = document.getElementById('tl-count').dataset.matching; box.click();
        return [performance.now() - t0, n];""",
    "last_page": """
        const t0 = performance.now(); document.querySelector('#tl-pager button[data-go=last]').click();
        return [performance.now() - t0, document.querySelectorAll('#tl-table tbody tr').length];""",
    "open_event": """
        const t0 = performance.now(); document.querySelector('#tl-table button.open').click();
        return [performance.now() - t0, document.querySelectorAll('#tl-table tr.detail').length];""",
}


def browser_once(page: Path) -> dict[str, Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = os.environ.get("ALE_CHROMIUM", "/usr/bin/chromium")
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1366,900",
    ):
        options.add_argument(flag)
    profile = tempfile.mkdtemp(prefix="ale-view-bench-")
    options.add_argument(f"--user-data-dir={profile}")
    driver = webdriver.Chrome(
        service=Service(os.environ.get("ALE_CHROMEDRIVER", "/usr/bin/chromedriver")), options=options
    )
    try:
        driver.set_page_load_timeout(120)
        started = time.perf_counter()
        driver.get(page.as_uri())
        while driver.execute_script("return document.documentElement.dataset.ready") != "true":
            time.sleep(0.01)
        result: dict[str, Any] = {"load_until_ready_s": round(time.perf_counter() - started, 3)}
        result["navigation_ms"] = driver.execute_script(
            "const n = performance.getEntriesByType('navigation')[0]; return n ? n.loadEventEnd : null;"
        )
        driver.execute_script(_BROWSER_JS["search"], "loss 0.0000")  # the first search makes the index
        for name, script in _BROWSER_JS.items():
            args = ["step 9"] if name == "search" else []
            elapsed, value = driver.execute_script(script, *args)
            result[f"{name}_ms"] = round(elapsed, 1)
            result[f"{name}_result"] = value
        result["heap_mb"] = driver.execute_script(
            "return performance.memory ? performance.memory.usedJSHeapSize / 1048576 : null;"
        )
        return result
    finally:
        driver.quit()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--browser", action="store_true", help="also time the page in headless Chromium")
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/view.json")
    args = parser.parse_args(argv)
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="ale-view-bench-") as tmp:
        folder = Path(tmp)
        run, bundle, info = make_bundle(folder, args.events)
        page = folder / "big.html"
        rounds = [time_once(bundle, run.key, page) for _ in range(args.rounds)]
        medians = {name: round(statistics.median(r[name] for r in rounds), 3) for name in rounds[0]}
        browser = browser_once(page) if args.browser else None
        result = {
            "benchmark": "ale view",
            "ale": __version__,
            "commit": _git_commit(),
            "python": platform.python_version(),
            "machine": {
                "nproc": os.cpu_count(),
                "platform": platform.platform(),
                "loadavg_start": [round(x, 2) for x in load_start],
                "loadavg_end": [round(x, 2) for x in os.getloadavg()],
            },
            "config": {"events": args.events, "rounds": args.rounds},
            "bundle": info,
            "page_bytes": page.stat().st_size,
            "median": medians,
            "rounds": [{k: round(v, 4) for k, v in r.items()} for r in rounds],
            "per_event_us": round(medians["view_only_s"] * 1e6 / info["events"], 2),
            "per_event_cpu_us": round(medians["view_only_cpu_s"] * 1e6 / info["events"], 2),
            "browser": browser,
        }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"ale view on {info['events']:,} events ({info['ciphertext_bytes'] / 1048576:.2f} MiB bundle), "
          f"median of {args.rounds}:")  # fmt: skip
    for name in ("decrypt_and_check", "parse_and_model", "render", "write", "total", "view_only"):
        print(f"  {name:<18} {medians[name + '_s']:7.3f} s wall, {medians[name + '_cpu_s']:7.3f} s CPU")
    print(f"  page {result['page_bytes'] / 1048576:.1f} MiB; the viewer's own work (after the checks) "
          f"{result['per_event_cpu_us']} us of CPU per event")  # fmt: skip
    if browser:
        print(f"  Chromium: ready after {browser['load_until_ready_s']} s; search {browser['search_ms']} ms, "
              f"producer filter {browser['producer_ms']} ms, last page {browser['last_page_ms']} ms, "
              f"open {browser['open_event_ms']} ms")  # fmt: skip
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
