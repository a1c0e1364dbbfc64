"""Assemble the submission bundle from a finished run: the eight allow-listed files, encrypted.

The documents are what ``ale.core.documents`` parses (and ``ale/schemas/`` publishes); the
container is ``ale.core.bundle.pack``, whose tar :func:`ale.core.bundle.inspect_tar` accepts
only in exactly that layout. Scores are computed here with the pure core
(:func:`ale.core.results.score_run`) from the very ``task_results.json`` bytes that go into the
bundle, so the verifier re-runs exactly this code.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import zstandard

from ale import __version__
from ale.core import bundle
from ale.core.canonical import canonical_json
from ale.core.documents import (
    ARTIFACTS_SCHEMA,
    FAITHFULNESS_SCHEMA,
    INTEGRITY_SCHEMA,
    JUDGE_INPUT_FORMAT,
    MANIFEST_SCHEMA,
    NETWORK_SCHEMA,
)
from ale.core.intervals import Interval
from ale.core.judge_input import build_input, task_windows
from ale.core.merkle import files_root
from ale.core.network import REQUEST_FIELDS, USAGE_FIELDS
from ale.core.results import RunScore, parse_task_results, score_breakdown_document, score_run
from ale.core.signing import key_id, public_raw, sign_root
from ale.core.trajectory import EVENT_SCHEMA, ChainSummary, format_wall_time, verify_chain
from ale.core.verdict import PROMPT_VERSION, JudgeResult, failed, open_genre, sign_verdict
from ale.judge.client import Endpoint
from ale.judge.phase import context
from ale.runner.harness import RunRecord, task_results_json
from ale.runner.network import NO_NETWORK, proxy_description

__all__ = ["ARTIFACTS_SCHEMA", "FAITHFULNESS_SCHEMA", "INTEGRITY_SCHEMA", "MANIFEST_SCHEMA", "NETWORK_SCHEMA"]
NO_JUDGE = "no faithfulness judge is configured: a reproduction task without a verdict is unfaithful (final 0)"


def _json(value: Any) -> bytes:
    """Bundle JSON files are canonical JSON (RFC 8785) plus a newline."""
    return canonical_json(value) + b"\n"


def _task_result(o: Any, digest: str, model: str | None) -> JudgeResult:
    """A reproduction task's entry: the judge's result, or why there is none (fail-closed)."""
    if o.status != "completed":
        return failed("not_completed", f"not completed ({o.reason}): no faithfulness verdict", model=None,
                      input_sha256=digest)  # fmt: skip
    result: JudgeResult | None = o.judgement
    if result is None:
        return failed("no_judge", NO_JUDGE, model=None, input_sha256=digest)
    if result.input_sha256 != digest:  # the harness judged other bytes than the bundle holds: its defect
        return failed("error", f"the judge input recomputed from the bundle ({digest}) is not the one judged "
                      f"({result.input_sha256}): the verdict is void", model=model, input_sha256=digest)  # fmt: skip
    return result


def faithfulness_verdicts(record: RunRecord, trajectory: bytes) -> dict[str, Any]:
    """faithfulness.json: each reproduction task's input digest recomputed from the trajectory the
    bundle holds (as a verifier recomputes it), its verdict, and a judge key's signature."""
    judge = record.options.judge
    model = judge.model if judge is not None else None
    refs = [o.task.spec.ref for o in record.outcomes if o.task.spec.genre == "reproduction"]
    windows = task_windows(trajectory, refs)
    tasks = {}
    for o in record.outcomes:
        s = o.task.spec
        if s.genre != "reproduction":
            tasks[s.ref] = open_genre().entry()
            continue
        digest = build_input(windows[s.ref], context(o.task), record.run_id).sha256
        entry = _task_result(o, digest, model).entry()
        if judge is not None and judge.signing_key is not None and entry["outcome"] == "judged":
            entry["signature"] = sign_verdict(judge.signing_key, s.ref, entry)
        tasks[s.ref] = entry
    return {"schema": FAITHFULNESS_SCHEMA, "judge_input": JUDGE_INPUT_FORMAT, "tasks": tasks}


def judge_json(record: RunRecord) -> dict[str, Any] | None:
    judge = record.options.judge
    if judge is None:
        return None
    signer = None if judge.signing_key is None else key_id(public_raw(judge.signing_key))
    return {"model": judge.model, "endpoint": Endpoint.parse(judge.base_url).origin, "prompt": PROMPT_VERSION,
            "key_id": signer}  # fmt: skip


def manifest_json(record: RunRecord) -> dict[str, Any]:
    opts = record.options
    return {
        "schema": MANIFEST_SCHEMA,
        "run_id": record.run_id,
        "harness": {"name": "ale", "version": __version__},
        "release": {
            "name": opts.release_name,
            "manifest_sha256": opts.release_sha256,
            "required_task_set_hash": opts.release.required_task_set_hash,
        },
        "tasks": [
            {
                "id": o.task.spec.id,
                "version": o.task.spec.version,
                "digest": o.task.digest,
                "genre": o.task.spec.genre,
                "mode": o.task.spec.mode,
                "official_episodes": o.task.spec.official_episodes,
                "episodes_run": o.episodes,
                "agent": o.agent,
                "network": o.network,
                "ended": None if o.ended is None else o.ended.entry(),
            }
            for o in record.outcomes
        ],
        "agent": {
            "name": opts.agent.name,
            "command": list(opts.agent.command),
            "declared": dict(opts.agent.declared),
            "environment": record.agent_environment,
        },
        "runtime": record.attestation,
        "challenge": {"nonce": opts.nonce, "token": opts.challenge_token} if opts.nonce else None,
        "trajectory": {"schema": EVENT_SCHEMA, "events": record.events, "chain_head": record.chain_head},
        "run": {
            "completed": True,
            "official_episode_counts": opts.episodes is None,
            "started": format_wall_time(record.started),
            "finished": format_wall_time(record.finished),
            **({} if record.active_s is None else {"active_s": round(record.active_s, 6)}),
        },
        "judge": judge_json(record),
    }


def network_summary_json(record: RunRecord, chain: ChainSummary) -> dict[str, Any]:
    """network_summary.json from the trajectory's network events (ale.core.network), as the
    verifier recomputes it, and the run's phase policies."""
    totals = chain.network
    if totals.get("unreadable"):
        raise ValueError(f"{totals['unreadable']} of the trajectory's network events cannot be read")
    phases = record.outcomes[0].network if record.outcomes else dict(NO_NETWORK)
    if not chain.gateways:
        policy = "no network: the agent's sandbox has an empty network namespace and no proxy"
        proxy = None
    else:
        proxy = proxy_description(chain.gateways[0] or [])
        hosts = ", ".join(f"{u['name']} ({u['host']})" for u in proxy["upstreams"])
        policy = (
            "the agent's sandbox reached only the LLM gateway, open while the agent worked and closed for the "
            f"official evaluation (whose sandbox had no attachment); upstreams: {hosts}"
        )
    return {
        "schema": NETWORK_SCHEMA,
        "proxy": proxy,
        "policy": policy,
        "phases": phases,
        "requests": {name: totals[name] for name in REQUEST_FIELDS},
        "usage": {name: totals[name] for name in USAGE_FIELDS},
    }


def artifacts_manifest_json(record: RunRecord) -> dict[str, Any]:
    return {
        "schema": ARTIFACTS_SCHEMA,
        "artifacts": [{"task": o.task.spec.ref, **o.artifact} for o in record.outcomes if o.artifact is not None],
    }


def build_files(record: RunRecord, trajectory: bytes, runner_key: Any = None) -> tuple[dict[str, bytes], RunScore]:
    """The eight files of the bundle, and the scores they claim."""
    results_raw = _json(task_results_json(record.run_id, record.outcomes))
    faithfulness = faithfulness_verdicts(record, trajectory)
    verdicts = {ref: v["faithful"] for ref, v in faithfulness["tasks"].items()}
    run_score = score_run(parse_task_results(results_raw), record.options.release, verdicts)
    files = {
        "manifest.json": _json(manifest_json(record)),
        "events.jsonl.zst": zstandard.ZstdCompressor(level=10, write_checksum=True).compress(trajectory),
        "task_results.json": results_raw,
        "score_breakdown.json": _json(score_breakdown_document(run_score, record.options.release)),
        "faithfulness.json": _json(faithfulness),
        "network_summary.json": _json(network_summary_json(record, verify_chain(trajectory))),
        "artifacts_manifest.json": _json(artifacts_manifest_json(record)),
    }
    digests = {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}
    root = files_root(digests)
    files["integrity.json"] = _json(
        {
            "schema": INTEGRITY_SCHEMA,
            "files": digests,
            "merkle_root": root,
            "chain_head": record.chain_head,
            "signature": None if runner_key is None else sign_root(runner_key, root),
        }
    )
    return files, run_score


def write_bundle(
    record: RunRecord, recipients: list[str], out_dir: Path, *, runner_key: Any = None
) -> tuple[Path, RunScore]:
    trajectory = record.trajectory.read_bytes()
    files, run_score = build_files(record, trajectory, runner_key)
    ciphertext = bundle.pack(files, recipients)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{record.run_id}{bundle.BUNDLE_SUFFIX}"
    tmp = path.with_suffix(".partial")
    tmp.write_bytes(ciphertext)
    tmp.replace(path)
    return path, run_score


def judge_lines(record: RunRecord) -> list[str]:
    """What the run's judge said of each reproduction task (or that there was none)."""
    reproduction = [o for o in record.outcomes if o.task.spec.genre == "reproduction"]
    if not reproduction:
        return []
    judge = record.options.judge
    if judge is None:
        return [f"note: {NO_JUDGE}"]
    lines = []
    for o in reproduction:
        result = o.judgement
        if result is None:
            lines.append(f"{o.task.spec.ref}: not judged (the task did not complete)")
            continue
        verdict = "faithful" if result.faithful else "UNFAITHFUL"
        lines.append(f"{o.task.spec.ref}: judge {judge.model}: {verdict} ({result.outcome}): {result.rationale[:300]}")
    lines.append("note: a site credits these verdicts only by re-judging, or when a judge key it registered signed "
                 "them (--judge-key)")  # fmt: skip
    return lines


def _ci(bounds: Interval | None) -> str:
    return "" if bounds is None else f" (95% interval {bounds.lower:.3f}-{bounds.upper:.3f})"


def summary_lines(run_score: RunScore) -> list[str]:
    lines = []
    bounds = run_score.intervals
    for s in run_score.tasks:
        gate = "" if s.faithful is None else (" faithful" if s.faithful else " UNFAITHFUL")
        ci = _ci(bounds.tasks.get(s.task) if bounds is not None else None)
        lines.append(
            f"{s.task}: {s.metric} = {s.measured:.4g} (paper {s.paper_value:.4g}), gap {s.gap:.3f}, "
            f"penalties {json.dumps({k: round(v, 3) for k, v in s.penalties.items()})}, final {s.final:.3f}{ci},"
            f"{gate} pass rate {s.pass_rate:.2f}"
        )
    agg = run_score.aggregate
    mean = "n/a" if agg.macro_mean is None else f"{agg.macro_mean:.3f}"
    mean += _ci(bounds.macro_mean if bounds is not None else None)
    lines.append(
        f"macro mean {mean} over {len(agg.covered)} of {len(agg.covered) + len(agg.missing)} required tasks"
        + ("" if agg.coverage_complete else f" (missing: {', '.join(agg.missing)})")
    )
    return lines
