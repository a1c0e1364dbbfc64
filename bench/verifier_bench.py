"""Verifier benchmark: server-side verification of a 20 MB bundle against its floor, and uploads under load.

Run: .venv/bin/python bench/verifier_bench.py [--quick] [--out bench/results/verifier.json]

1. A ~20 MB bundle from a real run: ``ale run cartpole-balance`` encrypted to a fresh site key, then
   its trajectory grown with valid chained ``untrusted_agent`` ``stdout`` events (random hex text)
   until the ciphertext is ~19.5 MiB (the upload cap is 20 MiB), manifest and integrity updated,
   re-packed with ``ale.core.bundle.pack``. It must be accepted.
2. Floor vs pipeline, on the same bytes in the same run: the floor is age decrypt + zstd
   decompress of the outer frame and of the inner ``events.jsonl.zst`` + SHA-256 of the ciphertext,
   the tar and the trajectory, one after another, each step the fastest way known (decryption by
   pyrage or by ``ale.core.age``, each frame by zstd's one-shot decoder, its streaming one, or its
   streaming one into a buffer reused from round to round, as the upload workers decompress the
   trajectory: all timed every round, the least counted; the floor with pyrage's decryption is
   printed too); the
   pipeline is the upload as ``ale-verify serve`` checks it: on an ``ale_verify.workers.UploadPool``
   of the usable cores' worker processes (from the upload's file to its stored verdict), and,
   beside it, ``ale_verify.pipeline.process_upload`` in this process.
   Median of the rounds, ratio, goal <= 1.2x. Also the CPU seconds of both (robust on a loaded
   machine, where wall times are not), the trajectory's chunk checks in CPU seconds (the bulk path
   of ``check_chunk`` against its exact loop alone), a per-step breakdown (the pipeline's steps
   called one by one) and a cProfile of one in-process run.
3. Load: ``ale-verify serve --workers 1`` and then ``--workers 2`` on 127.0.0.1 as a subprocess,
   50 concurrent clients (in this process: lean keep-alive HTTP/1.1 connections, so that the
   clients take little of the cores the server is measured on; ``--load-client httpx`` for httpx)
   each uploading a small real bundle (~300 KB) again and again for a fixed time: uploads/s side
   by side (and their ratio), p50/p99 latency, errors (any response but 201 accepted), the
   server's processes' CPU, the clients' CPU, how busy the machine's cores were and what other
   processes took of them, the load average. ``--load-rounds N`` runs the servers in turn N times
   and reports each round's ratio and their median (on a shared machine the other work changes
   less within a round than across a whole run). The databases are in the
   work dir (default: the system's temp dir, a real disk with real fsyncs; ``--work-dir /dev/shm``
   takes the disk out of the figures).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import datetime as dt
import hashlib
import io
import json
import os
import platform
import pstats
import random
import shutil
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.parse
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import _cores  # noqa: E402  (bench/_cores.py: the cores' speed together)

MIB = 1024 * 1024
GOAL_RATIO = 1.2
BENCH_USER = "bench"


# -- helpers --------------------------------------------------------------------------------------


def _percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (q in [0, 100])."""
    if not values:
        return float("nan")
    xs = sorted(values)
    k = (len(xs) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def _verify_cmd() -> list[str]:
    script = Path(sys.executable).parent / "ale-verify"
    return [str(script)] if script.exists() else [sys.executable, "-m", "ale_verify.cli"]


def _machine() -> dict[str, Any]:
    import importlib.metadata as md

    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem = ""
    with contextlib.suppress(OSError):
        mem = Path("/proc/meminfo").read_text().splitlines()[0].split(":", 1)[1].strip()
    versions = {}
    for name in ("pyrage", "zstandard", "httpx", "hypercorn", "quart", "jsonschema", "rfc8785"):
        with contextlib.suppress(md.PackageNotFoundError):
            versions[name] = md.version(name)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout)
    return {
        "nproc": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "cpu_model": model,
        "memory": mem,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "packages": versions,
        "git_commit": commit,
        "git_dirty": dirty,
    }


def _proc_cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _self_cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


# -- 1. the bundles --------------------------------------------------------------------------------


def keygen(data: Path) -> str:
    env = {**os.environ, "ALE_VERIFY_DATA": str(data)}
    proc = subprocess.run([*_verify_cmd(), "keygen"], env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"ale-verify keygen failed:\n{proc.stderr}")
    return proc.stdout.strip().splitlines()[-1]


def real_run(out: Path, recipient: str) -> Path:
    cmd = [sys.executable, "-m", "ale.runner.cli", "run", "cartpole-balance", "--plain", "--out", str(out),
           "--episodes", "2", "--agent-time", "30", "--recipient", recipient]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=out.parent, timeout=300, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"ale run failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    found = sorted(out.glob("*.ale"))
    if not found:
        raise SystemExit(f"ale run wrote no bundle:\n{proc.stdout}")
    return found[-1]


def _epoch(wall_time: str) -> float:
    moment = dt.datetime.strptime(wall_time, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=dt.UTC)
    micros = (moment - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // dt.timedelta(microseconds=1)
    return micros / 1_000_000


def _canonical_file(doc: Any) -> bytes:
    from ale.core.canonical import canonical_json

    return canonical_json(doc) + b"\n"


def _compress_events(stream: bytes) -> bytes:
    import zstandard

    # What the harness writes (ale/runner/bundle_writer.py): level 10 with a checksum.
    return zstandard.ZstdCompressor(level=10, write_checksum=True).compress(stream)


class Grower:
    """Re-builds a real run's trajectory with extra ``untrusted_agent`` ``stdout`` events."""

    def __init__(self, files: dict[str, bytes], line_hex: int, seed: int) -> None:
        import zstandard

        from ale.core.trajectory import iter_events

        self.files = dict(files)
        raw = zstandard.ZstdDecompressor().decompressobj().decompress(files["events.jsonl.zst"])
        self.original = raw
        self.events = [e for _, e in iter_events(raw)]
        agent = [i for i, e in enumerate(self.events) if e["producer"] == "untrusted_agent"]
        # Insert after the agent's last own event (its clocks stay monotonic); else before agent_finished.
        finished = next(i for i, e in enumerate(self.events) if e["kind"] == "agent_finished")
        self.insert_at = (agent[-1] + 1) if agent else finished
        anchor = self.events[self.insert_at - 1]
        self.anchor_wall, self.anchor_mono = _epoch(anchor["wall_time"]), float(anchor["monotonic"])
        self.line_hex, self.seed = line_hex, seed
        # The re-build without extra events must reproduce the real stream byte for byte.
        rebuilt = self.stream(0)[0]
        if rebuilt != raw:
            raise SystemExit("re-building the real trajectory did not reproduce it byte for byte")
        self.compressed_per_event = 0.0

    def stream(self, extra: int) -> tuple[bytes, str, int]:
        from ale.core.trajectory import ChainBuilder

        rng = random.Random(self.seed)
        chain = ChainBuilder()
        out = bytearray()

        def add(e: dict[str, Any]) -> None:
            _, line = chain.append(e["producer"], e["kind"], e["data"], wall_time=_epoch(e["wall_time"]),
                                   monotonic=e["monotonic"])  # fmt: skip
            out.extend(line)

        for e in self.events[: self.insert_at]:
            add(e)
        half = self.line_hex // 2
        for i in range(extra):
            text = f"train step {i}: {rng.randbytes(half).hex()}"
            _, line = chain.append("untrusted_agent", "stdout", {"text": text}, wall_time=self.anchor_wall,
                                   monotonic=self.anchor_mono)  # fmt: skip
            out.extend(line)
        for e in self.events[self.insert_at :]:
            add(e)
        return bytes(out), chain.head, chain.seq

    def estimate(self, sample: int = 2000) -> float:
        """Compressed bytes per extra event, from a sample."""
        small = len(_compress_events(self.stream(0)[0]))
        big = len(_compress_events(self.stream(sample)[0]))
        self.compressed_per_event = (big - small) / sample
        return self.compressed_per_event

    def build(self, extra: int, recipient: str) -> tuple[bytes, dict[str, Any]]:
        from ale.core import bundle
        from ale.core.merkle import files_root

        stream, head, count = self.stream(extra)
        files = dict(self.files)
        files["events.jsonl.zst"] = _compress_events(stream)
        manifest = json.loads(files["manifest.json"])
        manifest["trajectory"]["events"] = count
        manifest["trajectory"]["chain_head"] = head
        files["manifest.json"] = _canonical_file(manifest)
        integrity = json.loads(files["integrity.json"])
        digests = {name: hashlib.sha256(data).hexdigest() for name, data in files.items() if name != "integrity.json"}
        integrity["files"] = digests
        integrity["merkle_root"] = files_root(digests)
        integrity["chain_head"] = head
        files["integrity.json"] = _canonical_file(integrity)
        ciphertext = bundle.pack(files, [recipient])
        info = {
            "ciphertext_bytes": len(ciphertext),
            "tar_bytes": len(bundle.build_tar(files)),
            "events_zst_bytes": len(files["events.jsonl.zst"]),
            "events_plain_bytes": len(stream),
            "events": count,
            "extra_stdout_events": extra,
            "extra_event_text_hex_chars": self.line_hex,
        }
        return ciphertext, info


def grow_to(grower: Grower, target: int, cap: int, recipient: str) -> tuple[bytes, dict[str, Any]]:
    """Extra events so that the ciphertext is about ``target`` bytes (never above ``cap``)."""
    fixed = sum(len(v) for k, v in grower.files.items() if k != "events.jsonl.zst") + 8 * 1024 + 1024
    per_event = grower.compressed_per_event or grower.estimate()
    extra = max(0, int((target - fixed) / per_event))
    for _ in range(4):
        ciphertext, info = grower.build(extra, recipient)
        if len(ciphertext) <= cap and abs(len(ciphertext) - target) <= max(0.02 * target, 32 * 1024):
            return ciphertext, info
        extra = max(0, int(extra * (target - fixed) / max(1, len(ciphertext) - fixed) * 0.995))
    if len(ciphertext) > cap:
        raise SystemExit(f"could not grow the bundle under the cap: {len(ciphertext)} > {cap}")
    return ciphertext, info


# -- 2. floor, pipeline, steps, profile ------------------------------------------------------------


def _events_member(tar: bytes) -> tuple[int, int]:
    """(offset, size) of events.jsonl.zst inside the tar (located once, outside the timed floor)."""
    with tarfile.open(fileobj=io.BytesIO(tar), mode="r:") as tf:
        for m in tf:
            if m.name == "events.jsonl.zst":
                return m.offset_data, m.size
    raise SystemExit("events.jsonl.zst not in the bundle")


def _timed(fn: Any) -> tuple[float, Any]:
    started = time.perf_counter()
    out = fn()
    return time.perf_counter() - started, out


def _zstd_stream(data: bytes | memoryview) -> bytes:
    import zstandard

    out = []
    with zstandard.ZstdDecompressor().stream_reader(data, read_across_frames=False) as reader:
        while chunk := reader.read(MIB):
            out.append(chunk)
    return b"".join(out)


#: the floor's reused output buffers, one a frame (anonymous mappings: a page costs once, when
#: first written, as in the upload workers' memory files)
_INTO: dict[str, Any] = {}


def _zstd_into(data: bytes | memoryview, which: str, size: int) -> memoryview:
    """The frame decompressed by zstd's streaming decoder straight into a buffer reused from
    round to round (no block allocated or copied: how the upload workers decompress the
    trajectory, into their memory file's mapping)."""
    import mmap

    import zstandard

    buffer = _INTO.get(which)
    if buffer is None or len(buffer) < size:
        buffer = _INTO[which] = mmap.mmap(-1, size)
    view, at = memoryview(buffer), 0
    with zstandard.ZstdDecompressor().stream_reader(data, read_across_frames=False) as reader:
        while length := reader.readinto(view[at : at + MIB]):
            at += length
    return view[:at]


def floor_once(ciphertext: bytes, identity: str, member: tuple[int, int]) -> dict[str, float]:
    """The floor: the least that reading the bundle costs, one step after another on one core,
    each step done the fastest way known here (its time the least of them, each measured):
    decryption by pyrage or by the verifier's own ale.core.age (OpenSSL's ChaCha20-Poly1305);
    each zstd frame by zstd's one-shot decoder, its streaming one, or its streaming one into a
    reused buffer; SHA-256 of the ciphertext, the tar and the trajectory."""
    import pyrage
    import zstandard as zstd

    from ale.core import bundle

    cpu0 = time.process_time()
    key = pyrage.x25519.Identity.from_str(identity)
    pyrage_s, plain = _timed(lambda: pyrage.decrypt(ciphertext, [key]))
    del plain
    ours_s, plain = _timed(lambda: bundle.decrypt(ciphertext, identity, bundle.Limits()))
    outer_one_s, tar = _timed(lambda: zstd.ZstdDecompressor().decompress(plain))
    del tar
    outer_into_s, _ = _timed(lambda: _zstd_into(plain, "outer", 64 * MIB))
    outer_stream_s, tar = _timed(lambda: _zstd_stream(plain))
    off, size = member
    inner = memoryview(tar)[off : off + size]
    inner_one_s, events = _timed(lambda: zstd.ZstdDecompressor().decompress(inner))
    del events
    inner_into_s, _ = _timed(lambda: _zstd_into(inner, "inner", 256 * MIB))
    inner_stream_s, events = _timed(lambda: _zstd_stream(inner))
    sha_s, _ = _timed(
        lambda: (hashlib.sha256(ciphertext).digest(), hashlib.sha256(tar).digest(), hashlib.sha256(events).digest())
    )
    cpu = time.process_time() - cpu0
    steps = {"decrypt_s": min(pyrage_s, ours_s),
             "outer_decompress_s": min(outer_one_s, outer_stream_s, outer_into_s),
             "inner_decompress_s": min(inner_one_s, inner_stream_s, inner_into_s), "sha256_s": sha_s}  # fmt: skip
    total = sum(steps.values())
    # every way of each step measured, the floor's own and the slower ones
    alternatives = (pyrage_s, ours_s, outer_one_s, outer_stream_s, outer_into_s, inner_one_s, inner_stream_s,
                    inner_into_s)  # fmt: skip
    return {**steps, "total_s": total, "plain_bytes": len(tar) + len(events),
            "decrypt_pyrage_s": pyrage_s, "decrypt_ale_age_s": ours_s,
            "outer_one_shot_s": outer_one_s, "outer_streaming_s": outer_stream_s,
            "outer_into_s": outer_into_s,
            "inner_one_shot_s": inner_one_s, "inner_streaming_s": inner_stream_s,
            "inner_into_s": inner_into_s,
            # the floor's CPU: its share of the CPU of all the alternatives measured
            "cpu_s": cpu * total / (sum(alternatives) + sha_s),
            "total_with_pyrage_s": total - steps["decrypt_s"] + pyrage_s}  # fmt: skip


class Site:
    """Settings for in-process pipeline runs: the site's keys, a fresh database per call of ``fresh``."""

    def __init__(self, data: Path, work: Path) -> None:
        from ale_verify.config import Settings

        self.data, self.work = data, work
        self.signing_key = (data / "signing-key.bin").read_bytes()
        self.base = Settings.from_env({"ALE_VERIFY_DATA": str(data), "ALE_VERIFY_UPLOADS_PER_HOUR": str(10**9)})
        self.n = 0

    def fresh(self) -> Any:
        import attrs

        from ale_verify import db

        self.n += 1
        settings = attrs.evolve(self.base, database=self.work / f"round-{self.n}.sqlite3", tmp_dir=self.work / "tmp")
        db.migrate(settings.database)
        db.upsert_user(settings.database, BENCH_USER, BENCH_USER, "local")
        settings.tmp_dir.mkdir(parents=True, exist_ok=True)
        return settings

    def copy(self, ciphertext: bytes, settings: Any) -> Path:
        fd, name = tempfile.mkstemp(prefix="upload-", suffix=".ale", dir=settings.tmp_dir)
        with open(fd, "wb") as fh:
            fh.write(ciphertext)
        return Path(name)


def _cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds of processes (this one and the pool's workers) from /proc."""
    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError):
            total += _proc_cpu_seconds(pid)
    return total


def _tree(pid: int) -> list[int]:
    """A process and all its descendants (the server, its fork server and its chain workers)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        todo.extend(children.get(current, []))
    return out


def pipeline_once(site: Site, ciphertext: bytes) -> tuple[float, Any, float]:
    """In this process: (wall seconds, outcome, CPU seconds)."""
    from ale_verify.pipeline import process_upload

    settings = site.fresh()
    path = site.copy(ciphertext, settings)
    cpu0 = _self_cpu_seconds()
    started = time.perf_counter()
    outcome = process_upload(path, settings, site.signing_key, user_id=BENCH_USER)
    wall = time.perf_counter() - started
    return wall, outcome, _self_cpu_seconds() - cpu0


class Served:
    """The pipeline as the server runs it: an UploadPool of ``workers`` processes on one database."""

    def __init__(self, site: Site, workers: int) -> None:
        from ale_verify.workers import UploadPool

        self.site, self.settings = site, site.fresh()
        self.pool = UploadPool(self.settings, site.signing_key, workers)
        deadline = time.monotonic() + 120
        while len(self.pool.pids()) < workers:
            if time.monotonic() > deadline:
                raise SystemExit("the upload workers did not start in 120 s")
            time.sleep(0.05)

    def once(self, ciphertext: bytes) -> tuple[float, Any, float]:
        """(wall seconds from the file to the stored verdict, outcome, CPU seconds of every worker)."""
        path = self.site.copy(ciphertext, self.settings)
        pids = self.pool.pids()
        cpu0 = _cpu_s(pids)
        started = time.perf_counter()
        outcome = self.pool.submit(path, user_id=BENCH_USER, now=time.time()).result(timeout=600)
        wall = time.perf_counter() - started
        return wall, outcome, _cpu_s(pids) - cpu0

    def close(self) -> None:
        self.pool.close()


def steps_once(site: Site, ciphertext: bytes) -> dict[str, float]:
    """The pipeline's steps called one by one, in process_upload's order, each timed."""
    from ale import catalog
    from ale.core import verify as v
    from ale.runner.inspect import installed_releases
    from ale_verify import pipeline as p

    settings = site.fresh()
    path = site.copy(ciphertext, settings)
    times: dict[str, float] = {}
    clock = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        times[name] = now - clock
        clock = now

    data = path.read_bytes()
    lap("read_file")
    digest = hashlib.sha256(data).hexdigest()
    lap("sha256_ciphertext")
    plain = p.step_decrypt(data, settings)
    lap("decrypt")
    tar = p.step_decompress(plain, settings)
    lap("decompress_outer")
    files = p.step_inspect_tar(tar, settings)
    lap("inspect_tar")
    p.step_allowlist(files)
    lap("allowlist")
    v.decompress_events(files["events.jsonl.zst"])  # what parse_documents does inside, timed alone (diagnostic)
    lap("(diag) decompress_events_alone")
    docs = p.step_schemas(files)
    lap("schemas_incl_events_decompress")
    chain = v.check_chain(docs)
    lap("check_chain")
    root = v.check_integrity(files, docs, chain)
    lap("check_integrity")
    p.step_signature(docs, root, p.LocalSite(settings))
    releases = installed_releases()
    known = {t.spec.ref: (t.spec, t.digest) for t in catalog.tasks().values()}
    release = v.check_versions(docs, release_for=lambda s: (releases[s], s) if s in releases else None,
                               known_tasks=known)  # fmt: skip
    lap("versions")
    recomputed = v.recompute_scores(docs, release)
    lap("recompute_scores")
    summary = p.audit_summary(docs, recomputed, challenge=None, runner=None, ciphertext_sha256=digest, root=root,
                              events=chain.events)  # fmt: skip
    level, notes = p.assign_level(summary)
    outcome = p.Outcome("sub_bench", "accepted", level, None, notes, summary)
    lap("audit_summary")
    p._persist(outcome, settings, user_id=BENCH_USER, now=time.time(), challenge=None, replayed=None)
    lap("persist")
    path.unlink(missing_ok=True)
    times["total_s"] = sum(t for k, t in times.items() if not k.startswith("(diag)"))
    return times


def profile_once(site: Site, ciphertext: bytes, top: int = 10) -> tuple[str, list[dict[str, Any]], list[dict]]:
    from ale_verify.pipeline import process_upload

    settings = site.fresh()
    path = site.copy(ciphertext, settings)
    prof = cProfile.Profile()
    prof.enable()
    process_upload(path, settings, site.signing_key, user_id=BENCH_USER)
    prof.disable()  # (in this process: the workers' own steps are the same functions)
    buf = io.StringIO()
    stats = pstats.Stats(prof, stream=buf)
    stats.sort_stats("cumulative").print_stats(top)

    def rows(key: int) -> list[dict[str, Any]]:
        entries = sorted(stats.stats.items(), key=lambda kv: kv[1][key], reverse=True)[:top]  # type: ignore[attr-defined]
        return [{"function": f"{Path(f).name}:{line}({name})", "ncalls": nc, "tottime_s": tt, "cumtime_s": ct}
                for (f, line, name), (_cc, nc, tt, ct, _callers) in entries]  # fmt: skip

    return buf.getvalue(), rows(3), rows(2)


def chain_check_cpu(events: bytes, rounds: int) -> dict[str, Any]:
    """The trajectory's chunk checks as the chain workers make them (chunks of CHUNK_BYTES), in
    this process's CPU seconds (robust on a loaded machine): ``check_chunk``'s bulk path against
    its exact loop alone (``bulk=False``), and, where the C line hasher is in use, the bulk path
    with its Python reference instead; rounds interleaved, best of each."""
    from ale.core import trajectory
    from ale.core.trajectory import check_chunk, split_chunks
    from ale_verify.chain_workers import CHUNK_BYTES

    chunks = split_chunks(events, max(1, len(events) // CHUNK_BYTES))
    loaded = trajectory.body_digests
    hashers = {"bulk": loaded, "exact": loaded}
    if loaded is not trajectory.body_digests_reference:
        hashers["bulk_reference"] = trajectory.body_digests_reference
    times: dict[str, list[float]] = {name: [] for name in hashers}
    try:
        for _ in range(rounds):
            for name, hasher in hashers.items():
                trajectory.body_digests = hasher
                cpu = time.process_time()
                reports = [check_chunk(chunk, line, bulk=name != "exact") for chunk, line in chunks]
                times[name].append(time.process_time() - cpu)
                if any(r.fault for r in reports):
                    raise SystemExit(f"the trajectory's chain check ({name}) found a fault")
    finally:
        trajectory.body_digests = loaded
    lines = events.count(b"\n")
    best = {name: min(values) for name, values in times.items()}
    return {
        "chunks": len(chunks),
        "lines": lines,
        "linehash": trajectory.LINEHASH,
        "bulk_cpu_s": best["bulk"],
        "exact_cpu_s": best["exact"],
        "bulk_reference_cpu_s": best.get("bulk_reference"),
        "bulk_us_per_line": best["bulk"] / lines * 1e6,
        "exact_us_per_line": best["exact"] / lines * 1e6,
    }


def bench_verification(site: Site, ciphertext: bytes, identity: str, rounds: int, served: Served) -> dict[str, Any]:
    from ale.core import bundle
    from ale.core.verify import decompress_events

    tar = bundle.decompress(bundle.decrypt(ciphertext, identity, bundle.Limits()), bundle.Limits())
    member = _events_member(tar)
    chain_cpu = chain_check_cpu(decompress_events(tar[member[0] : member[0] + member[1]]), max(3, rounds))
    del tar
    # Warm-up (imports, task catalog, JSON Schema validators, the workers' first upload), reported apart.
    cold_s, outcome, _ = served.once(ciphertext)
    if outcome.status != "accepted":
        raise SystemExit(f"the bundle was rejected: {outcome.reason}: {outcome.reasons}")
    if pipeline_once(site, ciphertext)[1].status != "accepted":
        raise SystemExit("the bundle was rejected in-process")
    floor_once(ciphertext, identity, member)
    floors: list[dict[str, float]] = []
    pipes: list[float] = []
    pipes_cpu: list[float] = []
    inproc: list[float] = []
    loads: list[float] = []

    def on_workers() -> None:
        wall, _, cpu = served.once(ciphertext)
        pipes.append(wall)
        pipes_cpu.append(cpu)

    runs = [
        lambda: floors.append(floor_once(ciphertext, identity, member)),
        lambda: inproc.append(pipeline_once(site, ciphertext)[0]),
        on_workers,
    ]
    steal0 = _steal_ticks()
    for r in range(rounds):  # rotate the order between rounds
        loads.append(os.getloadavg()[0])
        for i in range(3):
            runs[(i + r) % 3]()
    steal = _steal_percent(steal0, _steal_ticks())
    scaling = _cores.core_scaling()  # right after the rounds: the host as they found it
    floor_med = statistics.median(f["total_s"] for f in floors)
    pipe_med = statistics.median(pipes)
    inproc_med = statistics.median(inproc)
    steps = steps_once(site, ciphertext)
    text, by_cum, by_tot = profile_once(site, ciphertext)
    return {
        "outcome": {
            "status": outcome.status,
            "level": outcome.level,
            "reason": outcome.reason,
            "notes": [n["reason"] for n in outcome.reasons],
        },
        "rounds": rounds,
        "loadavg_1min_per_round": loads,
        "steal_percent": steal,
        "core_scaling": scaling,
        "floor_s": floor_med,
        "floor_breakdown_median": {k: statistics.median(f[k] for f in floors) for k in floors[0]},
        "pipeline_s": pipe_med,
        "pipeline_workers": served.pool.processes,
        "pipeline_cpu_s": statistics.median(pipes_cpu),
        "floor_cpu_s": statistics.median(f["cpu_s"] for f in floors),
        "ratio_cpu": statistics.median(pipes_cpu) / statistics.median(f["cpu_s"] for f in floors),
        "chain_check_cpu": chain_cpu,
        "pipeline_in_process_s": inproc_med,
        "ratio_in_process": inproc_med / floor_med,
        "pipeline_cold_s": cold_s,
        "ratio": pipe_med / floor_med,
        "ratio_paired_median": statistics.median(pp / f["total_s"] for pp, f in zip(pipes, floors, strict=True)),
        "ratio_best": min(pipes) / min(f["total_s"] for f in floors),
        "goal_ratio": GOAL_RATIO,
        "meets_goal": pipe_med / floor_med <= GOAL_RATIO,
        "ciphertext_mb_per_s": len(ciphertext) / 1e6 / pipe_med,
        "floor_samples_s": [f["total_s"] for f in floors],
        "pipeline_samples_s": pipes,
        "pipeline_in_process_samples_s": inproc,
        "steps_s": steps,
        "profile_text": text,
        "profile_top_cumulative": by_cum,
        "profile_top_tottime": by_tot,
    }


def bench_small(site: Site, ciphertext: bytes, n: int) -> dict[str, Any]:
    """The load test's bundle through the pipeline in-process: the server's CPU cost per upload."""
    pipeline_once(site, ciphertext)
    times = [pipeline_once(site, ciphertext)[0] for _ in range(n)]
    steps = [steps_once(site, ciphertext) for _ in range(n)]
    return {
        "runs": n,
        "pipeline_s": statistics.median(times),
        "steps_s_median": {k: statistics.median(st[k] for st in steps) for k in steps[0]},
    }


# -- 3. load -----------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Http:
    """A lean HTTP/1.1 client for the load: one keep-alive connection, the request's bytes made
    once, the reply's status line, headers and ``Content-Length`` body read in full. httpx costs
    the benchmark's process about 3.5 ms of CPU an upload, taken from the cores the server is
    measured on; this costs a fraction of it (``--load-client httpx`` measures with httpx)."""

    def __init__(self, url: str, token: str, body: bytes) -> None:
        parts = urllib.parse.urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.request = (
            f"POST /api/v1/submissions HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            f"Authorization: Bearer {token}\r\nContent-Type: application/octet-stream\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode() + body
        self.streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def post(self) -> tuple[int, bytes]:
        """One upload: the reply's status and body (a new connection when the last one closed)."""
        if self.streams is None:
            self.streams = await asyncio.open_connection(self.host, self.port)
        reader, writer = self.streams
        try:
            writer.write(self.request)
            await writer.drain()
            status = int((await reader.readline()).split(b" ", 2)[1])
            length, keep = None, True
            while (line := await reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.partition(b":")
                name = name.strip().lower()
                if name == b"content-length":
                    length = int(value)
                elif name == b"connection":
                    keep = value.strip().lower() != b"close"
                elif name == b"transfer-encoding":
                    raise ValueError(f"the bench's client reads no Transfer-Encoding ({value.strip()!r})")
            if length is None:
                raise ValueError("a reply without Content-Length")
            reply = await reader.readexactly(length)
        except BaseException:
            await self.close()
            raise
        if not keep:
            await self.close()
        return status, reply

    async def close(self) -> None:
        if self.streams is not None:
            writer = self.streams[1]
            self.streams = None
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


async def _client(url: str, token: str, body: bytes, deadline: float, max_uploads: int, out: dict[str, Any]) -> None:
    if out.get("client") == "httpx":
        await _httpx_client(url, token, body, deadline, max_uploads, out)
        return
    from ale.core.parse import ParseError, parse_json

    http = _Http(url, token, body)
    try:
        for _ in range(max_uploads):
            if time.perf_counter() >= deadline:
                break
            started = time.perf_counter()
            try:
                status, reply = await http.post()
            except (OSError, ValueError, IndexError, asyncio.IncompleteReadError) as exc:
                out["errors"].append(f"{type(exc).__name__}: {exc}")
                continue
            elapsed = time.perf_counter() - started
            try:
                verdict = parse_json(reply, what="the reply")
            except ParseError:
                verdict = None
            if status == 201 and isinstance(verdict, dict) and verdict.get("status") == "accepted":
                out["latencies"].append(elapsed)
            else:
                out["errors"].append(f"HTTP {status}: {reply[:200]!r}")
    finally:
        await http.close()


async def _httpx_client(
    url: str, token: str, body: bytes, deadline: float, max_uploads: int, out: dict[str, Any]
) -> None:
    import httpx

    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/octet-stream"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=120.0) as client:
        for _ in range(max_uploads):
            if time.perf_counter() >= deadline:
                break
            started = time.perf_counter()
            try:
                reply = await client.post("/api/v1/submissions", content=body)
            except httpx.HTTPError as exc:
                out["errors"].append(f"{type(exc).__name__}: {exc}")
                continue
            elapsed = time.perf_counter() - started
            ok = reply.status_code == 201 and reply.json().get("status") == "accepted"
            if ok:
                out["latencies"].append(elapsed)
            else:
                out["errors"].append(f"HTTP {reply.status_code}: {reply.text[:200]}")


async def _load(url: str, token: str, body: bytes, clients: int, duration: float, client: str) -> dict[str, Any]:
    out: dict[str, Any] = {"latencies": [], "errors": [], "client": client}
    started = time.perf_counter()
    deadline = started + duration
    await asyncio.gather(*(_client(url, token, body, deadline, 100_000, out) for _ in range(clients)))
    out["elapsed_s"] = time.perf_counter() - started
    return out


async def _sequential(url: str, token: str, body: bytes, n: int, client: str) -> dict[str, Any]:
    out: dict[str, Any] = {"latencies": [], "errors": [], "client": client}
    started = time.perf_counter()
    await _client(url, token, body, time.perf_counter() + 600, n, out)
    out["elapsed_s"] = time.perf_counter() - started
    return out


def _cpu_ticks() -> list[int]:
    """The whole machine's clock ticks so far, from /proc/stat's first line: user, nice, system,
    idle, iowait, irq, softirq and (where the kernel counts it) steal."""
    return [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]


def _steal_ticks() -> tuple[int, int]:
    """(steal, all) clock ticks of the whole machine so far (:func:`_cpu_ticks`): the time the
    hypervisor gave this virtual machine's CPUs to others (0 on bare metal); (0, 0) where the
    kernel does not count it."""
    try:
        fields = _cpu_ticks()
    except (OSError, ValueError, IndexError):
        return 0, 0
    return (fields[7], sum(fields)) if len(fields) == 8 else (0, 0)


def _steal_percent(before: tuple[int, int], after: tuple[int, int]) -> float | None:
    """The share of every CPU's time between two :func:`_steal_ticks` that the hypervisor took."""
    ticks = after[1] - before[1]
    return 100 * (after[0] - before[0]) / ticks if ticks > 0 else None


def _machine_cpu() -> tuple[float, float]:
    """(busy, all) CPU seconds of the whole machine so far, steal aside (:func:`_cpu_ticks`; idle and
    iowait are not busy)."""
    fields = _cpu_ticks()[:7]
    tck = os.sysconf("SC_CLK_TCK")
    return (sum(fields) - fields[3] - fields[4]) / tck, sum(fields) / tck


def bench_load(
    data: Path, body: bytes, clients: int, duration: float, sequential: int, workers: int, client: str = "lean"
) -> dict[str, Any]:
    """``ale-verify serve --workers N`` (its own database) under ``clients`` concurrent uploaders."""
    import httpx

    database = data / f"verifier-{workers}-workers.sqlite3"
    for old in (database, database.with_name(database.name + "-wal"), database.with_name(database.name + "-shm")):
        old.unlink(missing_ok=True)  # (a round before this one's)
    env = {**os.environ, "ALE_VERIFY_DATA": str(data), "ALE_VERIFY_UPLOADS_PER_HOUR": str(10**9),
           "ALE_VERIFY_DATABASE": str(database)}  # fmt: skip
    for name in ("KEEP_SUBMISSION_BUNDLES", "ALE_VERIFY_WORKERS", "ALE_VERIFY_CHECK_PROCESSES", "DATABASE_URL"):
        env.pop(name, None)
    token_proc = subprocess.run([*_verify_cmd(), "create-token", "--user", BENCH_USER], env=env,
                                capture_output=True, text=True, check=False)  # fmt: skip
    if token_proc.returncode != 0:
        raise SystemExit(f"ale-verify create-token failed:\n{token_proc.stderr}")
    token = token_proc.stdout.strip().splitlines()[-1]
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = data / f"serve-{workers}.log"
    log = open(log_path, "wb")  # noqa: SIM115 - closed in finally
    proc = subprocess.Popen([*_verify_cmd(), "serve", "--bind", f"127.0.0.1:{port}", "--workers", str(workers)],
                            env=env, stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        ready_by = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"ale-verify serve exited ({proc.returncode}):\n{log_path.read_text()[-2000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/healthz", timeout=1.0).status_code == 200:
                    break
            if time.monotonic() > ready_by:
                raise SystemExit("ale-verify serve did not become ready in 60 s")
            time.sleep(0.1)

        async def warm_up() -> dict[str, Any]:  # every worker's first uploads, apart
            done = await asyncio.gather(*(_sequential(url, token, body, 3, client) for _ in range(workers)))
            return {"errors": [e for d in done for e in d["errors"]]}

        warm = asyncio.run(warm_up())
        if warm["errors"]:
            raise SystemExit(f"warm-up uploads failed: {warm['errors'][:3]}")
        seq = asyncio.run(_sequential(url, token, body, sequential, client))
        tree = _tree(proc.pid)  # the server, its fork server and its upload workers
        cpu0, self0, load0 = _proc_cpu_seconds(proc.pid), _self_cpu_seconds(), os.getloadavg()
        tree0, machine0, steal0 = _cpu_s(tree), _machine_cpu(), _steal_ticks()
        res = asyncio.run(_load(url, token, body, clients, duration, client))
        cpu1, self1, tree1, machine1 = _proc_cpu_seconds(proc.pid), _self_cpu_seconds(), _cpu_s(tree), _machine_cpu()
        steal = _steal_percent(steal0, _steal_ticks())
        threads = int(Path(f"/proc/{proc.pid}/status").read_text().split("Threads:")[1].split()[0])
        with contextlib.closing(sqlite3.connect(database)) as conn:
            stored = conn.execute("SELECT status, COUNT(*) FROM submissions GROUP BY status").fetchall()
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        log.close()
    lat = res["latencies"]
    n_ok, n_err = len(lat), len(res["errors"])
    machine_s = machine1[1] - machine0[1]  # every core's time over the load (/proc/stat)
    others = (machine1[0] - machine0[0]) - (tree1 - tree0) - (self1 - self0)
    return {
        "workers": workers,
        "clients": clients,
        "duration_s": duration,
        "elapsed_s": res["elapsed_s"],
        "upload_bytes": len(body),
        "uploads_ok": n_ok,
        "errors": n_err,
        "error_samples": res["errors"][:5],
        "uploads_per_s": n_ok / res["elapsed_s"],
        "latency_p50_s": _percentile(lat, 50),
        "latency_p90_s": _percentile(lat, 90),
        "latency_p99_s": _percentile(lat, 99),
        "latency_max_s": max(lat) if lat else float("nan"),
        "server_cpu_s": cpu1 - cpu0,
        "server_cpu_percent_of_one_core": 100 * (cpu1 - cpu0) / res["elapsed_s"],
        "server_processes": len(tree),
        "server_tree_cpu_percent_of_one_core": 100 * (tree1 - tree0) / res["elapsed_s"],
        "server_threads_at_end": threads,
        "client": client,
        "client_cpu_percent_of_one_core": 100 * (self1 - self0) / res["elapsed_s"],
        # the machine's cores during the load: busy (all processes) and what other processes took
        "machine_busy_percent": 100 * (machine1[0] - machine0[0]) / (machine1[1] - machine0[1]),
        "machine_others_percent_of_one_core": 100 * others / res["elapsed_s"],
        # of every CPU's time, what the hypervisor gave to other machines (None: not counted)
        "steal_percent": steal,
        # of the cores' time the other processes left, what the server and its clients used: near
        # 100% with 2 workers means nothing serialises them (the CPU is what bounds them)
        "percent_of_the_cpu_left_used": 100 * ((tree1 - tree0) + (self1 - self0)) / (machine_s - others),
        "loadavg_before": list(load0),
        "loadavg_after": list(os.getloadavg()),
        "db_submissions_by_status": dict(stored),
        "sequential": {
            "uploads": len(seq["latencies"]),
            "errors": len(seq["errors"]),
            "latency_p50_s": _percentile(seq["latencies"], 50),
            "uploads_per_s": len(seq["latencies"]) / seq["elapsed_s"],
        },
    }


def _print_loads(loads: dict[int, dict[str, Any]]) -> None:
    for n, load in loads.items():
        steal = "" if load["steal_percent"] is None else f"; steal {load['steal_percent']:.1f}%"
        print(f"  --workers {n}: {load['uploads_ok']} accepted, {load['errors']} errors,"
              f" {load['uploads_per_s']:.1f} uploads/s; latency p50 {load['latency_p50_s'] * 1000:.0f} ms,"
              f" p99 {load['latency_p99_s'] * 1000:.0f} ms; server CPU"
              f" {load['server_tree_cpu_percent_of_one_core']:.0f}% of one core in its {load['server_processes']}"
              f" processes (the server process alone {load['server_cpu_percent_of_one_core']:.0f}%); client CPU"
              f" {load['client_cpu_percent_of_one_core']:.0f}% ({load['client']}); the machine's cores"
              f" {load['machine_busy_percent']:.0f}% busy (other processes"
              f" {load['machine_others_percent_of_one_core']:.0f}% of one core; of what they left, the server"
              f" and its clients used {load['percent_of_the_cpu_left_used']:.0f}%{steal}); load average"
              f" {load['loadavg_before'][0]:.2f} -> {load['loadavg_after'][0]:.2f};"
              f" stored {load['db_submissions_by_status']}")  # fmt: skip
        sq = load["sequential"]
        print(f"    one client, sequential: {sq['uploads_per_s']:.1f} uploads/s, p50"
              f" {sq['latency_p50_s'] * 1000:.0f} ms ({sq['errors']} errors)")  # fmt: skip
        for e in load["error_samples"]:
            print(f"    error: {e}")


def _scaling(rounds: list[dict[int, dict[str, Any]]]) -> dict[str, Any] | None:
    """uploads/s of the second server over the first (e.g. 2 workers over 1), each round's (the two
    measured one after the other) and their median."""
    if not rounds or len(rounds[0]) < 2:
        return None
    (n1, _), (n2, _) = sorted(rounds[0].items())[:2]
    pairs = [(r[n1]["uploads_per_s"], r[n2]["uploads_per_s"]) for r in rounds]
    ratios = [b / a for a, b in pairs if a]
    return {
        "workers": [n1, n2],
        "uploads_per_s": [list(p) for p in pairs],
        "ratios": ratios,
        "ratio": statistics.median(ratios) if ratios else None,
    }


# -- main ----------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a short smoke run (small bundle, 2 rounds, 5 s load)")
    parser.add_argument("--out", default=str(ROOT / "bench/results/verifier.json"))
    parser.add_argument("--bundle-mib", type=float, help="target ciphertext size (default 19.5; 4 with --quick)")
    parser.add_argument("--line-hex", type=int, default=1024, help="hex characters of each added stdout event")
    parser.add_argument("--rounds", type=int, help="floor/pipeline rounds, median reported (default 5; 2 quick)")
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--duration", type=float, help="load duration in seconds (default 20; 5 with --quick)")
    parser.add_argument("--load-bundle-kb", type=float, default=300, help="size of the load test's bundle (kB)")
    parser.add_argument("--seed", type=int, default=20261130)
    parser.add_argument("--work-dir", help="where the temporary folder (keys, databases, uploads) is made "
                        "(default: the system's; /dev/shm takes the disk's fsync out of the figures)")  # fmt: skip
    parser.add_argument("--load-workers", type=int, nargs="+", default=[1, 2],
                        help="the servers of the load test: `serve --workers N` for each N (default 1 2)")  # fmt: skip
    parser.add_argument("--load-rounds", type=int, default=1,
                        help="rounds of the load: each runs every --load-workers server in turn (their ratio's"
                        " median is reported: the machine's other work changes less within a round)")  # fmt: skip
    parser.add_argument("--load-client", choices=("lean", "httpx"), default="lean",
                        help="the load's HTTP client: a lean keep-alive HTTP/1.1 one (default) or httpx")  # fmt: skip
    args = parser.parse_args()
    bundle_mib = args.bundle_mib or (4.0 if args.quick else 19.5)
    rounds = args.rounds or (2 if args.quick else 5)
    duration = args.duration or (5.0 if args.quick else 20.0)
    sequential = 5 if args.quick else 20

    from ale.core import bundle
    from ale.runner.inspect import read_identity

    t_start = time.perf_counter()
    load_before = os.getloadavg()
    tmp = Path(tempfile.mkdtemp(prefix="ale-vbench-", dir=args.work_dir))
    try:
        data, work = tmp / "data", tmp / "work"
        work.mkdir(parents=True)
        recipient = keygen(data)
        identity = read_identity(data / "site-identity.txt")
        site = Site(data, work)
        (tmp / "run").mkdir()
        t0 = time.perf_counter()
        real = real_run(tmp / "run" / "out", recipient)
        real_bytes = real.read_bytes()
        real_s = time.perf_counter() - t0
        files = bundle.unpack(real_bytes, identity)

        t0 = time.perf_counter()
        grower = Grower(files, args.line_hex, args.seed)
        grower.estimate()
        cap = site.base.max_upload_bytes
        big, big_info = grow_to(grower, int(bundle_mib * MIB), cap, recipient)
        small, small_info = grow_to(grower, int(args.load_bundle_kb * 1000), cap, recipient)
        build_s = time.perf_counter() - t0
        print(f"real run: cartpole-balance, 2 episodes -> {len(real_bytes):,} B bundle ({real_s:.1f} s)")
        b = big_info
        print(f"big bundle: {b['ciphertext_bytes']:,} B ({b['ciphertext_bytes'] / MIB:.2f} MiB, cap {cap:,}),"
              f" {b['events']:,} events, trajectory {b['events_plain_bytes'] / 1e6:.1f} MB plain"
              f" / {b['events_zst_bytes'] / 1e6:.1f} MB zstd (built in {build_s:.1f} s)")  # fmt: skip
        print(f"load bundle: {small_info['ciphertext_bytes']:,} B ciphertext, {small_info['events']:,} events")

        from ale_verify.config import usable_cores

        served = Served(site, usable_cores())
        try:
            ver = bench_verification(site, big, identity, rounds, served)
        finally:
            served.close()
        fb = ver["floor_breakdown_median"]
        la = ver["loadavg_1min_per_round"]
        steal = "" if ver["steal_percent"] is None else f"; steal {ver['steal_percent']:.1f}% of the CPUs' time"
        print(f"\nverification of the {big_info['ciphertext_bytes'] / 1e6:.1f} MB bundle (median of {rounds} rounds;"
              f" load average {min(la):.2f}-{max(la):.2f}{steal}):")  # fmt: skip
        print(f"  outcome: {ver['outcome']['status']}, level {ver['outcome']['level']}")
        print(f"  floor    {ver['floor_s'] * 1000:8.1f} ms  (decrypt {fb['decrypt_s'] * 1000:.1f}, zstd outer"
              f" {fb['outer_decompress_s'] * 1000:.1f}, zstd events {fb['inner_decompress_s'] * 1000:.1f},"
              f" sha256 {fb['sha256_s'] * 1000:.1f}; each step the fastest of: decrypt pyrage"
              f" {fb['decrypt_pyrage_s'] * 1000:.1f} / ale.core.age {fb['decrypt_ale_age_s'] * 1000:.1f},"
              f" outer one-shot {fb['outer_one_shot_s'] * 1000:.1f} / streaming"
              f" {fb['outer_streaming_s'] * 1000:.1f} / into a reused buffer {fb['outer_into_s'] * 1000:.1f},"
              f" events one-shot {fb['inner_one_shot_s'] * 1000:.1f} / streaming"
              f" {fb['inner_streaming_s'] * 1000:.1f} / into a reused buffer"
              f" {fb['inner_into_s'] * 1000:.1f})")  # fmt: skip
        print(f"  (with pyrage's decryption, as the floor was until 2026-12-02:"
              f" {fb['total_with_pyrage_s'] * 1000:.1f} ms;"
              f" the pipeline is {ver['pipeline_s'] / fb['total_with_pyrage_s']:.2f}x that)")  # fmt: skip
        print(
            f"  pipeline {ver['pipeline_s'] * 1000:8.1f} ms  as served: on {ver['pipeline_workers']} upload workers,"
            f" from the file to the stored verdict; CPU {ver['pipeline_cpu_s'] * 1000:.0f} ms in the workers"
            f" (cold first run {ver['pipeline_cold_s'] * 1000:.1f} ms; {ver['ciphertext_mb_per_s']:.1f} MB/s)"
        )
        print(f"  pipeline {ver['pipeline_in_process_s'] * 1000:8.1f} ms  in one process (process_upload):"
              f" {ver['ratio_in_process']:.2f}x the floor")  # fmt: skip
        cc = ver["chain_check_cpu"]
        print(f"  CPU: the served pipeline {ver['pipeline_cpu_s'] * 1000:.0f} ms in its workers, the floor"
              f" {ver['floor_cpu_s'] * 1000:.0f} ms ({ver['ratio_cpu']:.2f}x)")  # fmt: skip
        print(f"  chain check of {cc['lines']:,} lines in {cc['chunks']} chunks (CPU, best of rounds): bulk"
              f" {cc['bulk_cpu_s'] * 1000:.1f} ms ({cc['bulk_us_per_line']:.2f} us a line), the exact loop alone"
              f" {cc['exact_cpu_s'] * 1000:.1f} ms ({cc['exact_us_per_line']:.2f} us a line)")  # fmt: skip
        if cc["bulk_reference_cpu_s"] is not None:
            print(f"    line hasher: {cc['linehash']} (ale.core._linehash); the bulk path with its Python reference"
                  f" {cc['bulk_reference_cpu_s'] * 1000:.1f} ms, the C one"
                  f" {cc['bulk_cpu_s'] / cc['bulk_reference_cpu_s']:.2f}x that")  # fmt: skip
        else:
            print(f"    line hasher: {cc['linehash']} (ale.core._linehash was not built: docs/verifier.md)")
        verdict = "meets" if ver["meets_goal"] else "does NOT meet"
        print(f"  ratio pipeline/floor = {ver['ratio']:.2f}x -> {verdict} the {GOAL_RATIO}x goal"
              f" (median of per-round ratios {ver['ratio_paired_median']:.2f}x, best against best"
              f" {ver['ratio_best']:.2f}x)")  # fmt: skip
        print(f"  the host: {_cores.describe(ver['core_scaling'])}; the floor runs on one core, the pipeline on"
              f" {ver['pipeline_workers']}")  # fmt: skip
        print("  steps, called one by one in this process (ms):")
        for name, s in ver["steps_s"].items():
            print(f"    {name:34s} {s * 1000:8.1f}")
        print("  cProfile of one process_upload, top 10 by cumulative time:")
        for row in ver["profile_top_cumulative"]:
            cum, own = row["cumtime_s"], row["tottime_s"]
            print(f"    {cum:7.3f} s cum {own:7.3f} s own {row['ncalls']:>8} x {row['function']}")
        print("  top 10 by own time:")
        for row in ver["profile_top_tottime"]:
            print(f"    {row['tottime_s']:7.3f} s own {row['ncalls']:>8} x {row['function']}")

        small_ver = bench_small(site, small, 5 if args.quick else 15)
        top = sorted(((k, v) for k, v in small_ver["steps_s_median"].items() if k != "total_s"), key=lambda kv: -kv[1])
        print(f"\nload bundle through process_upload in-process: {small_ver['pipeline_s'] * 1000:.1f} ms (median of"
              f" {small_ver['runs']}); largest steps: "
              + ", ".join(f"{k} {v * 1000:.1f}" for k, v in top[:4]))  # fmt: skip

        print(f"load: {args.clients} clients x {duration:.0f} s, {len(small):,} B bundle each upload, databases"
              f" in {tmp} (each 201 is on its disk: SQLite synchronous=FULL, group commit):")  # fmt: skip
        rounds_of_loads = []
        for r in range(args.load_rounds):
            if args.load_rounds > 1:
                print(f" round {r + 1} of {args.load_rounds}:")
            loads = {
                n: bench_load(data, small, args.clients, duration, sequential, n, args.load_client)
                for n in args.load_workers
            }
            _print_loads(loads)
            rounds_of_loads.append(loads)
        scaling = _scaling(rounds_of_loads)
        if scaling is not None:
            n1, n2 = scaling["workers"]
            each = ", ".join(f"{x:.2f}x" for x in scaling["ratios"])
            rounds = f"median {scaling['ratio']:.2f}x (each round, the servers in turn: {each})"
            print(f"  uploads/s with {n2} workers / with {n1}: {each if len(scaling['ratios']) == 1 else rounds}")
        loads = {n: load for round_ in rounds_of_loads for n, load in round_.items()}
        errors = sum(load["errors"] for round_ in rounds_of_loads for load in round_.values())
        print(f"  {'no errors' if errors == 0 else 'ERRORS: the load goal is not met'}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    total_s = time.perf_counter() - t_start
    load_after = os.getloadavg()
    cpus = os.cpu_count() or 1
    if load_before[0] > 0.5 * cpus or load_after[0] > cpus:  # the benchmark itself keeps about one core busy
        print(f"warning: load average {load_before[0]:.2f} at start, {load_after[0]:.2f} at end on {cpus} CPUs:"
              " other work was running; the figures are distorted")  # fmt: skip
    result = {
        "benchmark": "verifier",
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "quick": args.quick,
        "work_dir": str(tmp.parent),
        "machine": _machine(),
        "loadavg_start": list(load_before),
        "loadavg_end": list(load_after),
        "wall_s": total_s,
        "real_run": {"bundle_bytes": len(real_bytes), "events": grower.events.__len__(), "seconds": real_s},
        "big_bundle": big_info,
        "load_bundle": small_info,
        "verification": {k: v for k, v in ver.items() if k != "profile_text"},
        "load_bundle_in_process": small_ver,
        "load": {str(n): load for n, load in loads.items()},  # (the last round's)
        "load_rounds": [{str(n): load for n, load in round_.items()} for round_ in rounds_of_loads],
        "load_scaling": scaling,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out} ({total_s:.0f} s)")


if __name__ == "__main__":
    main()
