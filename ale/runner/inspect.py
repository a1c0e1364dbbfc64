"""``ale inspect``: decrypt a bundle for whoever holds the key, check it offline, show what it holds."""

from __future__ import annotations

import functools
import hashlib
import json
import sys
from importlib import resources
from pathlib import Path
from typing import Any

from ale import catalog
from ale.core.release import ReleaseManifest, parse_release
from ale.core.verify import Report, VerificationError, check_files, unpack
from ale.schemas import validate_document


class IdentityError(ValueError):
    pass


def read_identity(path: Path) -> str:
    """The first ``AGE-SECRET-KEY-1...`` line of an age identity file."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise IdentityError(f"cannot read the identity file {path}: {exc}") from None
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("AGE-SECRET-KEY-1"):
            return line
    raise IdentityError(f"{path} holds no age identity (a line starting AGE-SECRET-KEY-1)")


@functools.cache
def installed_releases() -> dict[str, ReleaseManifest]:
    """The installed release manifests by the SHA-256 of their bytes (read once; package data)."""
    found = {}
    for entry in (resources.files("ale") / "releases").iterdir():
        if entry.name.endswith(".json"):
            raw = entry.read_bytes()
            found[hashlib.sha256(raw).hexdigest()] = parse_release(raw)[0]
    return found


def offline_check(ciphertext: bytes, identity: str) -> Report:
    releases = installed_releases()
    known = {t.spec.ref: (t.spec, t.digest) for t in catalog.tasks().values()}
    files = unpack(ciphertext, identity)
    return check_files(
        files,
        release_for=lambda sha: (releases[sha], sha) if sha in releases else None,
        known_tasks=known,
        validate=validate_document,
    )


def _task_json(t: Any) -> dict[str, Any]:
    r = t.result
    return {
        "task": t.task,
        "status": t.status,
        "reason": t.reason,
        "headline": None if r is None else {r.headline_metric: r.headline_value},
        "passed_episodes": None if r is None else r.passed_episodes,
        "episodes": None if r is None else r.num_episodes,
    }


def report_json(report: Report) -> dict[str, Any]:
    agg = report.claimed.get("aggregate", {})
    return {
        "run_id": report.manifest.get("run_id"),
        "agent": report.manifest.get("agent"),
        "release": report.manifest.get("release"),
        "runtime": report.manifest.get("runtime"),
        "challenge": report.manifest.get("challenge"),
        "trajectory": {
            "events": report.chain.events,
            "chain_head": report.chain.head,
            "per_producer": report.chain.per_producer,
        },
        "tasks": [_task_json(t) for t in report.results.tasks],
        "scores": report.claimed.get("tasks"),
        "aggregate": agg,
        "merkle_root": report.integrity.get("merkle_root"),
        "checks": "all offline checks passed (decryption, archive safety, schemas, chain, integrity, versions, scores)",
    }


def inspect_bundle(bundle: Path, identity_path: Path, *, as_json: bool = False) -> int:
    try:
        identity = read_identity(identity_path)
        ciphertext = bundle.read_bytes()
    except IdentityError as exc:
        print(f"ale: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"ale: error: cannot read {bundle}: {exc.strerror}", file=sys.stderr)
        return 2
    try:
        report = offline_check(ciphertext, identity)
    except VerificationError as exc:
        print(f"ale: the bundle fails verification ({exc.reason}): {exc}", file=sys.stderr)
        return 1
    doc = report_json(report)
    if as_json:
        print(json.dumps(doc, indent=2, sort_keys=True))
        return 0
    out = sys.stdout
    out.write(f"run {doc['run_id']}  agent {doc['agent']['name']}  release {doc['release']['name']}\n")
    runtime = doc["runtime"] or {}
    out.write(f"runtime {runtime.get('runtime')} (sandbox {runtime.get('sandbox')})\n")
    out.write(f"trajectory: {doc['trajectory']['events']} events, head {doc['trajectory']['chain_head'][:16]}..., ")
    out.write(", ".join(f"{k} {v}" for k, v in sorted(doc["trajectory"]["per_producer"].items())) + "\n")
    for t in doc["tasks"]:
        line = f"  {t['task']}: {t['status']}"
        if t["headline"]:
            ((metric, value),) = t["headline"].items()
            line += f", {metric} = {value:.4g}, passed {t['passed_episodes']}/{t['episodes']}"
        if t["reason"]:
            line += f" ({t['reason']})"
        out.write(line + "\n")
    for s in doc["scores"] or []:
        out.write(f"  score {s['task']}: gap {s['gap']:.3f} x penalties -> {s['score']:.3f}, final {s['final']:.3f}\n")
    agg = doc["aggregate"]
    mean, rate = agg.get("macro_mean"), agg.get("pass_rate")
    covered, missing = len(agg.get("covered", [])), len(agg.get("missing", []))
    mean_text = "n/a" if mean is None else f"{mean:.3f}"
    rate_text = "n/a" if rate is None else f"{rate:.2f}"
    out.write(f"macro mean {mean_text}, pass rate {rate_text}, coverage {covered}/{covered + missing}\n")
    out.write(f"{doc['checks']}\n")
    return 0
