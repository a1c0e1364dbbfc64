"""The static-site export's CPU work counted in instructions (callgrind), side by side with another checkout's.

Run: .venv/bin/python bench/site_instructions.py [--submissions 1000] [--jobs 1] [--against DIR]
                                                  [--database DB] [--out bench/results/site_instructions.json]

``bench/site_bench.py`` times the export; on a virtual machine whose speed changes from one minute
to the next (the 2-core development machines: the same export took 3.4 s and 4.6 s within the
hour) a change of a few percent is lost in that noise. This counts what the export executes
instead, under valgrind's callgrind: the instructions of ``export_site`` alone (collection is
switched on around the call, by callgrind's client requests from a small C library built here with
gcc), in the exporting process and, with ``--jobs 2``, in every worker it forks (each counts from
its own start). The count is deterministic to ~0.1% (``PYTHONHASHSEED=0``), so two runs of the same
code agree and a 2% change shows. Printed and written for each checkout: the instructions, and the
instructions without SHA-256 (OpenSSL's; under valgrind it cannot use the CPU's SHA extensions, so
its share is several times what it costs natively), and their ratio this / ``--against``.

An instruction is not a nanosecond: memory traffic, system calls (the files' creation) and how two
busy cores slow each other are not in the count. It measures the CPU work the code asks for; the
time on a given machine is site_bench's. Each run of 1,000 submissions takes about a minute per
checkout (callgrind runs Python some 50 times slower). Needs valgrind (with its headers, Debian's
``valgrind``) and gcc.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

#: the client requests around the export (valgrind/callgrind.h): counting on, then off and dumped
_TOGGLE_C = r"""
#include <valgrind/callgrind.h>
void ale_count_start(void) { CALLGRIND_ZERO_STATS; CALLGRIND_START_INSTRUMENTATION; CALLGRIND_TOGGLE_COLLECT; }
void ale_count_stop(void) { CALLGRIND_TOGGLE_COLLECT; CALLGRIND_DUMP_STATS; CALLGRIND_STOP_INSTRUMENTATION; }
void ale_count_zero(void) { CALLGRIND_ZERO_STATS; }
"""

#: run under valgrind by the checkout's own interpreter: its exporter, counted around the call;
#: a forked worker (a shard or a page worker) zeroes its counts at its start, so that each
#: process's dump holds its own work only
_DRIVER = r"""
import concurrent.futures.process as pool, ctypes, functools, inspect, shutil, sys
from pathlib import Path
root, library, database, out = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4])
jobs = int(sys.argv[5])
sys.path[:0] = [str(root / "import-roots"), str(root)]
from ale_verify import export
count = ctypes.CDLL(library)
def fresh(function):
    @functools.wraps(function)
    def counted(*args, **kwargs):
        count.ale_count_zero()
        return function(*args, **kwargs)
    return counted
if hasattr(export, "_shard_main"):
    export._shard_main = fresh(export._shard_main)
pool._process_worker = fresh(pool._process_worker)
shutil.rmtree(out, ignore_errors=True)
count.ale_count_start()
options = {"jobs": jobs} if "jobs" in inspect.signature(export.export_site).parameters else {}  # (an older exporter)
export.export_site(database, out, docs_dir=root / "docs", page_size=100, **options)
count.ale_count_stop()
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--submissions", type=int, default=1000)
    parser.add_argument("--jobs", type=int, default=1, help="the exporter's worker processes (1: one process)")
    parser.add_argument("--against", type=Path, default=None, help="another checkout (with .venv) to count beside")
    parser.add_argument("--database", type=Path, default=None, help="a verifier database to export (else filled)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/site_instructions.json")
    args = parser.parse_args(argv)
    for tool in ("valgrind", "callgrind_annotate", "gcc"):
        if shutil.which(tool) is None:
            print(f"site_instructions: needs {tool} (apt-get install valgrind gcc)", file=sys.stderr)
            return 2
    with tempfile.TemporaryDirectory(prefix="ale-site-instructions-") as tmp:
        work = Path(tmp)
        library = work / "libalecount.so"
        (work / "count.c").write_text(_TOGGLE_C)
        built = subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", str(library), str(work / "count.c")],
                               capture_output=True, text=True)  # fmt: skip
        if built.returncode != 0:
            print(f"site_instructions: cannot build the counting library: {built.stderr.strip()}", file=sys.stderr)
            return 2
        database = args.database
        if database is None:
            import site_fixtures  # the test suite's fixture module

            database = work / "verifier.sqlite3"
            site_fixtures.fill_many(database, args.submissions)
        (work / "driver.py").write_text(_DRIVER)
        sides = {"this": ROOT, **({"against": args.against.resolve()} if args.against else {})}
        counts = {name: _count(root, work, library, database, args.jobs) for name, root in sides.items()}
    result: dict[str, Any] = {
        "benchmark": "static-site export, instructions (callgrind)",
        "python": platform.python_version(),
        "config": {"submissions": args.submissions if args.database is None else None, "jobs": args.jobs,
                   "database": str(args.database) if args.database else None},
        "checkouts": {name: {"root": str(root), **counts[name]} for name, root in sides.items()},
    }  # fmt: skip
    for name, row in counts.items():
        processes = ", ".join(f"{p['instructions'] / 1e9:.3f}" for p in row["processes"])
        print(f"{name} ({sides[name]}): {row['instructions'] / 1e9:.3f} G instructions, without SHA-256 "
              f"{row['without_sha256'] / 1e9:.3f} G ({len(row['processes'])} processes: {processes} G)")  # fmt: skip
    if "against" in counts:
        ratio = counts["this"]["without_sha256"] / counts["against"]["without_sha256"]
        whole = counts["this"]["instructions"] / counts["against"]["instructions"]
        result["ratio"] = {"without_sha256": round(ratio, 4), "instructions": round(whole, 4)}
        print(f"this / against: {ratio:.3f} without SHA-256 ({whole:.3f} with it)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"written {args.out}")
    return 0


def _count(root: Path, work: Path, library: Path, database: Path, jobs: int) -> dict[str, Any]:
    """The instructions of one export by ``root``'s exporter: each process's, and their sums."""
    dumps = work / f"dumps-{abs(hash(root))}"
    dumps.mkdir()
    python = root / ".venv/bin/python"
    command = [
        "valgrind", "--tool=callgrind", "--collect-atstart=no", "--instr-atstart=no",
        f"--callgrind-out-file={dumps}/callgrind.%p.%n",
        str(python if python.exists() else sys.executable), str(work / "driver.py"),
        str(root), str(library), str(database), str(work / f"site-{dumps.name}"), str(jobs),
    ]  # fmt: skip
    ran = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "PYTHONHASHSEED": "0"})
    if ran.returncode != 0:
        raise SystemExit(f"site_instructions: the export by {root} failed under valgrind:\n{ran.stderr[-2000:]}")
    processes = []
    for dump in sorted(dumps.iterdir()):
        text = dump.read_text(errors="replace")
        found = re.search(r"^summary: (\d+)", text, re.M)
        total = int(found.group(1)) if found else 0
        if total == 0 or total >= 1 << 63:  # a dump at a process's end, after its counted part was dumped
            continue
        processes.append({"instructions": total, "sha256": _sha256(dump)})
    if not processes:
        raise SystemExit(f"site_instructions: no counts from {root}'s export")
    return {
        "instructions": sum(p["instructions"] for p in processes),
        "without_sha256": sum(p["instructions"] - p["sha256"] for p in processes),
        "processes": processes,
    }


def _sha256(dump: Path) -> int:
    """The instructions under hashlib's SHA-256 in one process's dump (inclusive)."""
    annotated = subprocess.run(["callgrind_annotate", "--inclusive=yes", str(dump)], capture_output=True, text=True)
    found = re.search(r"^\s*([\d,]+) .*_hashopenssl\.c:_hashlib_openssl_sha256\b", annotated.stdout, re.M)
    return int(found.group(1).replace(",", "")) if found else 0


if __name__ == "__main__":
    sys.exit(main())
