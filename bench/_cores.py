"""How fast each usable core runs when every one of them is busy, against one alone.

A goal that compares work spread over two cores with a floor run on one (``verifier_bench.py``'s
1.2x, ``site_bench.py``'s workers) assumes that a core is as fast with its neighbour busy as with
it idle. On a virtual machine that need not hold: two virtual CPUs may be the two hardware threads
of one physical core on the host (the guest's ``lscpu`` cannot tell: KVM shows each as a core of
its own), or share its memory bandwidth and caches with other guests. Then the same work costs
more CPU time on two busy cores than on one, and a pipeline's two-core figure against a one-core
floor says as much about the host as about the code.

:func:`core_scaling` measures it beside the benchmark, in the same run: a fixed piece of work on
one core with the others idle, then the same piece on every usable core at once (one process
pinned to each, started together), ``rounds`` times each. Three kinds of work, each like a part of
what the benchmarks run: Python bytecode (an integer loop), SHA-256 over a buffer that stays in the
cache, and memory streaming (copying a 64 MiB buffer, which no cache holds). The figure of each is
the median over the rounds of (its time alone) / (the slowest core's time with all busy). For
Python and SHA-256, 1.0 when the cores do not slow each other down, about 0.6 for two hardware
threads of one physical core (or less with other guests on it). For memory, the share of the
bandwidth one core had alone that each keeps when all stream at once: 0.5 when one core alone
already takes all of it (the verifier's and the exporter's work streams far less than that).
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import statistics
import time
from multiprocessing.connection import Connection
from typing import Any

KINDS = ("python", "sha256", "memory")
_BUFFER = 1 << 20  # SHA-256's input: stays in the L2 cache
_STREAM = 64 << 20  # memory's: no cache holds it


def _work(kind: str) -> float:
    """Wall seconds of one fixed piece of ``kind`` of work."""
    if kind == "python":
        started = time.perf_counter()
        x = 0
        for i in range(1_500_000):
            x ^= i * 7
        return time.perf_counter() - started
    if kind == "sha256":
        data = b"\x5a" * _BUFFER
        started = time.perf_counter()
        for _ in range(48):
            hashlib.sha256(data).digest()
        return time.perf_counter() - started
    if kind == "memory":
        source = bytearray(_STREAM)
        target = bytearray(_STREAM)
        target[:] = source  # the pages touched once before the timing
        started = time.perf_counter()
        for _ in range(4):
            target[:] = source
        return time.perf_counter() - started
    raise ValueError(f"no such kind of work: {kind}")


def _child(core: int, kind: str, start: Any, conn: Connection) -> None:
    try:
        os.sched_setaffinity(0, {core})
        _work(kind)  # warmed up: the code and the buffers
        start.wait()
        conn.send(_work(kind))
    finally:
        conn.close()


def _run(cores: list[int], kind: str) -> float:
    """The slowest of ``cores`` running ``kind`` at once (one process pinned to each), in seconds."""
    context = multiprocessing.get_context("fork")
    start = context.Barrier(len(cores))
    procs, conns = [], []
    for core in cores:
        ours, theirs = context.Pipe(duplex=False)
        proc = context.Process(target=_child, args=(core, kind, start, theirs), daemon=True)
        proc.start()
        theirs.close()
        procs.append(proc)
        conns.append(ours)
    try:
        return max(conn.recv() for conn in conns)
    finally:
        for proc in procs:
            proc.join()
        for conn in conns:
            conn.close()


def core_scaling(rounds: int = 5) -> dict[str, Any]:
    """Per kind of work: each core's speed with every usable core busy, as a share of its speed
    alone (median over ``rounds``), and the cores it ran on. Empty figures on one usable core."""
    cores = sorted(os.sched_getaffinity(0))
    result: dict[str, Any] = {"cores": len(cores), "rounds": rounds}
    for kind in KINDS:
        if len(cores) < 2:
            result[kind] = None
            continue
        ratios = []
        for _ in range(rounds):
            alone = _run(cores[:1], kind)
            together = _run(cores, kind)
            ratios.append(alone / together)
        result[kind] = round(statistics.median(ratios), 3)
    return result


def describe(scaling: dict[str, Any]) -> str:
    """One line for a benchmark's output."""
    if scaling["cores"] < 2:
        return "one usable core: no figure of the cores' speed together"
    parts = ", ".join(f"{kind} {scaling[kind]:.2f}" for kind in KINDS)
    return (
        f"each of the {scaling['cores']} cores with all busy, as a share of its speed alone: {parts}"
        " (python, sha256: 1.0 if they do not slow each other down, ~0.6 if they are hardware threads of"
        " one core; memory: the bandwidth each keeps, 0.5 if one core alone takes all of it)"
    )
