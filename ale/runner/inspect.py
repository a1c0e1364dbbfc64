"""``ale inspect`` (and ``ale-verify check``): decrypt a bundle for whoever holds the key, run the
site's checks on it offline, show what it holds and say what could not be checked.

The checks are the site's own (:func:`ale.core.verify.check_files`: the same functions, in the
same order, with the same reason codes), including the runner signature: it must verify, and
given runner public keys (``--runner-public-key``, or the verifier's registered keys for
``ale-verify check``) it must be one of them. What needs the site's records (the challenge
token's HMAC, its user, expiry and one-time use) is listed as not checked, never as passed.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import json
import sys
from collections.abc import Iterable, Mapping
from importlib import resources
from pathlib import Path
from typing import Any, TextIO

from ale import catalog
from ale.core.faithfulness import JudgeKeyLookup
from ale.core.release import ReleaseManifest
from ale.core.signing import key_id
from ale.core.verify import KeyLookup, Report, RunnerKey, VerificationError, check_files, level_for, plain, unpack
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


def runner_public_key(text: str) -> RunnerKey:
    """A runner public key as ``ale runner-key`` prints it (base64 of the raw 32 bytes)."""
    try:
        raw = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) != 32:
        raise IdentityError(f"{text[:60]!r} is not a runner public key (base64 of 32 raw Ed25519 bytes)")
    return RunnerKey(key_id(raw), base64.b64encode(raw).decode(), "given", "given on the command line")


def key_lookup(keys: Iterable[RunnerKey], *more: KeyLookup) -> KeyLookup:
    """Look a key id up among ``keys``, then in each of ``more``."""
    by_id = {k.key_id: k for k in keys}

    def lookup(kid: str) -> RunnerKey | None:
        found = by_id.get(kid)
        for other in more:
            found = found or other(kid)
        return found

    return lookup


@functools.cache
def installed_releases() -> dict[str, ReleaseManifest]:
    """The installed release manifests by the SHA-256 of their bytes (read once; package data)."""
    found = {}
    for entry in (resources.files("ale") / "releases").iterdir():
        if entry.name.endswith(".json"):
            raw = entry.read_bytes()
            found[hashlib.sha256(raw).hexdigest()] = catalog.parse_installed_release(raw)[0]
    return found


def offline_check(
    ciphertext: bytes, identity: str, runner_keys: KeyLookup | None = None, judge_keys: JudgeKeyLookup | None = None
) -> Report:
    releases = installed_releases()
    known = {t.spec.ref: (t.spec, t.digest) for t in catalog.tasks().values()}
    files = unpack(ciphertext, identity)
    return check_files(
        files,
        release_for=lambda sha: (releases[sha], sha) if sha in releases else None,
        known_tasks=known,
        validate=validate_document,
        runner_keys=runner_keys,
        contexts=catalog.judge_contexts(),
        judge_keys=judge_keys,
    )


def _task_json(t: Any) -> dict[str, Any]:
    r = t.result
    return {
        "task": t.task,
        "status": t.status,
        "reason": t.reason,
        "ended": None if t.ended is None else t.ended.entry(),
        "headline": None if r is None else {r.headline_metric: r.headline_value},
        "passed_episodes": None if r is None else r.passed_episodes,
        "episodes": None if r is None else r.num_episodes,
    }


def passed_checks(report: Report) -> list[str]:
    """What the offline checks proved of this bundle, in the pipeline's order."""
    challenge = report.manifest.challenge is not None
    signed = report.docs.integrity.signature is not None
    return [
        "decryption and the age header",
        "exactly one zstd frame",
        "the canonical tar layout and the allow-list",
        "every document parsed, canonical, schema-valid, with no level claims",
        "the trajectory's hash chain" + (" and the challenge nonce bound in its first event" if challenge else ""),
        "network_summary.json recomputed from the trajectory's network events",
        "the integrity root (file digests, Merkle root, chain head)",
        *(["the runner signature verifies"] if signed else []),
        *(["the signing key is a registered runner key"] if signed and report.registration_checked else []),
        "release and task versions, coverage",
        "the faithfulness verdicts and the recomputed scores",
    ]


def _signature_json(report: Report) -> dict[str, Any] | None:
    signature = report.docs.integrity.signature
    if signature is None:
        return None
    runner = report.runner
    return {
        "key_id": signature.key_id,
        "verifies": True,
        "registered": runner is not None if report.registration_checked else None,
        "runner": None if runner is None else {"kind": runner.kind, "label": runner.label},
    }


def _faithfulness_json(report: Report) -> dict[str, Any]:
    """Each reproduction task's own verdict, its rebuilt judge input, and what a site without a
    judge of its own would credit (docs/verifier.md, "Faithfulness")."""
    out = {}
    for ref, entry in sorted(report.docs.faithfulness.tasks.items()):
        if entry.outcome == "open_genre":
            continue
        credit = report.credits.get(ref)
        out[ref] = {
            "outcome": entry.outcome,
            "faithful": entry.faithful,
            "judge_model": entry.judge_model,
            "signed": entry.signature is not None,
            "input_sha256": entry.input_sha256,
            "input_rebuilt": ref in report.inputs,
            "credited_without_rejudging": None if credit is None else credit.status == "judged",
        }
    return out


def report_json(report: Report) -> dict[str, Any]:
    m = report.manifest
    level, notes = level_for(
        challenged=m.challenge is not None,
        official_episode_counts=m.run.official_episode_counts,
        runner=report.runner is not None,
    )
    return {
        "run_id": m.run_id,
        "agent": plain(m.agent),
        "release": plain(m.release),
        "runtime": plain(m.runtime),
        "challenge": plain(m.challenge),
        "trajectory": {
            "events": report.chain.events,
            "chain_head": report.chain.head,
            "per_producer": report.chain.per_producer,
        },
        "tasks": [_task_json(t) for t in report.results.tasks],
        "network": plain(report.docs.network),
        "scores": plain(report.claimed.tasks),
        "aggregate": plain(report.claimed.aggregate),
        "intervals": plain(report.claimed.intervals),  # the claimed 95% intervals (docs/intervals.md), recomputed
        "merkle_root": report.root,
        "signature": _signature_json(report),
        "faithfulness": _faithfulness_json(report),
        "checks": {"passed": passed_checks(report), "not_checked": list(report.not_checked)},
        "level_if_the_site_accepts_it": {"level": level, "notes": notes},
    }


def _write_network(network: Mapping[str, Any], out: TextIO) -> None:
    proxy, requests, usage = network["proxy"], network["requests"], network["usage"]
    if proxy is None:
        out.write("network: none (no LLM gateway)\n")
        return
    upstreams = ", ".join(f"{u['name']} ({u['api']}, {u['host']})" for u in proxy["upstreams"])
    out.write(
        f"network: {proxy['name']} {proxy['version']} to {upstreams}; {requests['total']} requests "
        f"({requests['allowed']} allowed, {requests['denied']} denied), {usage['input_tokens']} input tokens "
        f"({usage['cached_input_tokens']} cached), {usage['output_tokens']} output tokens\n"
    )


def _ci(bounds: Mapping[str, float] | None) -> str:
    return "" if bounds is None else f" (95% interval {bounds['lower']:.3f}-{bounds['upper']:.3f})"


def _write_text(doc: Mapping[str, Any], out: TextIO) -> None:
    out.write(f"run {doc['run_id']}  agent {doc['agent']['name']}  release {doc['release']['name']}\n")
    runtime = doc["runtime"]
    out.write(f"runtime {runtime['runtime']} (sandbox {runtime['sandbox']})\n")
    if runtime.get("images"):  # the OCI runtimes: what ran, by digest
        ran = ", ".join(f"{name} {entry['digest']}" for name, entry in sorted(runtime["images"]["images"].items()))
        out.write(f"images: {ran} (engine {runtime['engine']['server']})\n")
    out.write(f"trajectory: {doc['trajectory']['events']} events, head {doc['trajectory']['chain_head'][:16]}..., ")
    out.write(", ".join(f"{k} {v}" for k, v in sorted(doc["trajectory"]["per_producer"].items())) + "\n")
    for t in doc["tasks"]:
        line = f"  {t['task']}: {t['status']}"
        if t["ended"]:
            line += f" in {t['ended']['phase']}: {t['ended']['category']}"
        if t["headline"]:
            ((metric, value),) = t["headline"].items()
            line += f", {metric} = {value:.4g}, passed {t['passed_episodes']}/{t['episodes']}"
        if t["reason"]:
            line += f" ({t['reason']})"
        out.write(line + "\n")
    _write_network(doc["network"], out)
    bounds = doc["intervals"] or {"tasks": {}, "macro_mean": None}
    for s in doc["scores"]:
        ci = _ci(bounds["tasks"].get(s["task"]))
        out.write(f"  score {s['task']}: gap {s['gap']:.3f} x penalties -> {s['score']:.3f}, ")
        out.write(f"final {s['final']:.3f}{ci}\n")
    agg = doc["aggregate"]
    mean, rate = agg["macro_mean"], agg["pass_rate"]
    covered, missing = len(agg["covered"]), len(agg["missing"])
    mean_text = "n/a" if mean is None else f"{mean:.3f}{_ci(bounds['macro_mean'])}"
    rate_text = "n/a" if rate is None else f"{rate:.2f}"
    out.write(f"macro mean {mean_text}, pass rate {rate_text}, coverage {covered}/{covered + missing}\n")
    for ref, f in doc["faithfulness"].items():
        verdict = "faithful" if f["faithful"] else "unfaithful"
        credited = {True: "a site credits it (signed by a judge key it registered)",
                    False: "a site credits it only by re-judging the rebuilt input", None: "not completed"}  # fmt: skip
        out.write(f"faithfulness {ref}: {verdict} ({f['outcome']}{', signed' if f['signed'] else ''}); input "
                  f"{(f['input_sha256'] or '')[:16]}...; {credited[f['credited_without_rejudging']]}\n")  # fmt: skip
    signature = doc["signature"]
    if signature is None:
        out.write("signature: none (an unsigned bundle is never officially_verified)\n")
    else:
        registered = {True: "a registered runner", False: "not registered", None: "registration not checked"}
        out.write(f"signature: verifies, key {signature['key_id'][:16]}..., {registered[signature['registered']]}\n")
    out.write(f"offline checks passed: {'; '.join(doc['checks']['passed'])}\n")
    for item in doc["checks"]["not_checked"]:
        out.write(f"not checked: {item}\n")
    verdict = doc["level_if_the_site_accepts_it"]
    out.write(f"level if the site's own checks pass too: {verdict['level']}\n")


def inspect_bundle(
    bundle: Path,
    identity_path: Path,
    *,
    as_json: bool = False,
    runner_keys: Iterable[str] = (),
    registered: KeyLookup | None = None,
    prog: str = "ale",
    judge_keys: JudgeKeyLookup | None = None,
) -> int:
    """Check a bundle offline and print what it holds. ``runner_keys`` are public keys (base64)
    the signature may name; ``registered`` looks up more (the verifier's database). With neither,
    a signature is verified but its registration is not checked (and the report says so)."""
    try:
        identity = read_identity(identity_path)
        given = [runner_public_key(k) for k in runner_keys]
        ciphertext = bundle.read_bytes()
    except IdentityError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"{prog}: error: cannot read {bundle}: {exc.strerror}", file=sys.stderr)
        return 2
    lookup = key_lookup(given, *([registered] if registered else [])) if given or registered else None
    try:
        report = offline_check(ciphertext, identity, lookup, judge_keys)
    except VerificationError as exc:
        print(f"{prog}: the bundle fails verification ({exc.reason}): {exc}", file=sys.stderr)
        return 1
    doc = report_json(report)
    if as_json:
        print(json.dumps(doc, indent=2, sort_keys=True))
    else:
        _write_text(doc, sys.stdout)
    return 0
