"""``ale run``'s judge options and ``ale judge`` (eval, input, record-set); docs/judge.md.

Light to import: the ``ale`` command loads this module to build its parser; the work is imported
when a command runs.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ale.runner.options import JudgeOptions

DEFAULT_BASE_URL = "https://api.openai.com/v1"
JUDGE_KEY_ENV = "ALE_JUDGE_API_KEY"


class JudgeCliError(Exception):
    """A problem the user can fix (printed as ``ale: error: ...``, exit status 2)."""


# -- ale run --judge-model ------------------------------------------------------------------------


def add_judge_arguments(p: argparse.ArgumentParser, *, signing: bool) -> None:
    p.add_argument(
        "--judge-model",
        metavar="MODEL",
        help="judge each reproduction task's faithfulness with this model on an OpenAI-compatible endpoint "
        "($OPENAI_BASE_URL, default https://api.openai.com/v1, with $OPENAI_API_KEY)",
    )
    p.add_argument(
        "--judge-upstream",
        metavar="URL",
        help=f"the judge's endpoint (base URL of /chat/completions) instead of $OPENAI_BASE_URL; its key is "
        f"${JUDGE_KEY_ENV} (none when unset), never $OPENAI_API_KEY",
    )
    if signing:
        p.add_argument(
            "--judge-key",
            metavar="PEM",
            help="an Ed25519 judge key (`ale runner-key` makes one): sign each verdict, for a site that registered it",
        )


def judge_options(args: argparse.Namespace, env: dict[str, str] | None = None) -> JudgeOptions | None:
    """The judge of ``ale run`` from its options and the environment; None without --judge-model."""
    from ale.gateway.config import ConfigError, parse_config
    from ale.judge.client import Endpoint, EndpointError
    from ale.runner.options import JudgeOptions

    env = dict(os.environ if env is None else env)
    signing = getattr(args, "judge_key", None)
    if not args.judge_model:
        if args.judge_upstream or signing:
            raise JudgeCliError("--judge-upstream and --judge-key need --judge-model")
        return None
    if args.judge_upstream:
        base_url, key = args.judge_upstream, env.get(JUDGE_KEY_ENV) or None
    else:
        base_url, key = env.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL, env.get("OPENAI_API_KEY") or None
    try:
        endpoint = Endpoint.parse(base_url)
    except EndpointError as exc:
        raise JudgeCliError(str(exc)) from None
    config = {"run_id": "check", "placeholder_key": "ale-judge-check", "policy": "open",
              "upstreams": [{"name": "judge", "api": "openai", "base_url": endpoint.base_url, "api_key": key,
                             "ca_file": None}],
              "budgets": {"requests": 1, "input_tokens": 1, "output_tokens": 1}}  # fmt: skip
    try:  # what the judge's gateway would refuse to start with, refused now
        import json

        parse_config(json.dumps(config).encode())
    except ConfigError as exc:
        raise JudgeCliError(f"the judge's endpoint: {exc}".replace("upstream 'judge': ", "")) from None
    return JudgeOptions(model=args.judge_model, base_url=endpoint.base_url, api_key=key,
                        signing_key=_signing_key(signing))  # fmt: skip


def _signing_key(path: str | None) -> Any:
    if not path:
        return None
    from ale.core.signing import SignatureError, load_private_key

    try:
        return load_private_key(Path(path).read_bytes())
    except (OSError, SignatureError) as exc:
        raise JudgeCliError(f"--judge-key: {exc}") from None


# -- ale judge ------------------------------------------------------------------------------------


def cmd_eval(args: argparse.Namespace) -> int:
    from ale.judge.client import Transport, ask
    from ale.judge.labelled import SetError, agreement, default_set, evaluate, load_set

    options = judge_options(args)
    if options is None:
        raise JudgeCliError("name the judge: --judge-model MODEL")
    try:
        cases = load_set(Path(args.set) if args.set else default_set())
    except SetError as exc:
        raise JudgeCliError(str(exc)) from None
    if args.case:
        cases = [c for c in cases if any(c.case == name or c.case.startswith(name + "/") for name in args.case)]
    transport = Transport(options.base_url, options.api_key, timeout=options.timeout_s)

    def judge(judge_input: Any, case: Any) -> Any:
        result = ask(transport, options.model, judge_input, judge_input_rubric(case)).result
        mark = "credited" if result.faithful else "not credited"
        print(f"{case.case:<48} {case.label:<9} {result.outcome:<11} {mark}", file=sys.stderr, flush=True)
        return result

    try:
        judged = evaluate(cases, judge)
    except SetError as exc:
        raise JudgeCliError(str(exc)) from None
    score = agreement((j.case.label, j.credited) for j in judged)
    unjudged = sum(j.result.outcome != "judged" for j in judged)

    def show(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.3f}"

    print(f"judge {options.model} at {transport.endpoint.origin} on {len(judged)} cases "
          f"({sum(j.case.label == 'faithful' for j in judged)} faithful, "
          f"{sum(j.case.label == 'shortcut' for j in judged)} shortcut; {unjudged} without a verdict, "
          f"counted as not credited)")  # fmt: skip
    print(f"tp {score.tp}  fp {score.fp}  fn {score.fn}  tn {score.tn}")
    print(f"precision {show(score.precision)}  recall {show(score.recall)}  F1 {show(score.f1)}")
    return 0


def judge_input_rubric(case: Any) -> Any:
    from ale import catalog

    return catalog.get_task(case.task.split("@")[0]).rubric


def cmd_input(args: argparse.Namespace) -> int:
    from ale import catalog
    from ale.core import bundle
    from ale.core.judge_input import JudgeInputError, build_input, task_windows
    from ale.core.parse import ParseError, parse_json
    from ale.judge.phase import context
    from ale.runner.inspect import IdentityError, read_identity

    try:
        files = bundle.unpack(Path(args.bundle).read_bytes(), read_identity(Path(args.identity)))
        manifest = parse_json(files["manifest.json"], what="manifest.json")
        events = bundle.decompress(files["events.jsonl.zst"], bundle.Limits(max_decompressed=256 * bundle.MiB))
        tasks = {t.spec.ref: t for t in catalog.tasks().values() if t.spec.genre == "reproduction"}
        refs = [f"{t['id']}@{t['version']}" for t in manifest["tasks"]]
        windows = task_windows(events, [r for r in refs if r in tasks])
    except (OSError, IdentityError, bundle.BundleError, ParseError, JudgeInputError, KeyError, TypeError) as exc:
        raise JudgeCliError(f"cannot read {args.bundle}: {exc}") from None
    inputs = {ref: build_input(w, context(tasks[ref]), manifest["run_id"]) for ref, w in windows.items()}
    if args.task:
        if args.task not in inputs:
            raise JudgeCliError(f"{args.task} is not a reproduction task of this bundle ({', '.join(inputs)})")
        sys.stdout.buffer.write(inputs[args.task].text)
        return 0
    for ref, ji in inputs.items():
        print(f"{ref} {ji.sha256} {len(ji.text)} bytes")
    return 0


def cmd_record_set(args: argparse.Namespace) -> int:
    from ale.agents.scripted import CASES
    from ale.judge.labelled import SetError, dump_set, record_case

    names = args.case or sorted(CASES)
    unknown = [n for n in names if n not in CASES]
    if unknown:
        raise JudgeCliError(f"unknown cases {', '.join(unknown)}; known: {', '.join(sorted(CASES))}")
    recorded = []
    for name in names:
        try:
            case = record_case(name, episodes=args.episodes)
        except SetError as exc:
            raise JudgeCliError(str(exc)) from None
        print(f"{name}: {case.label}, {len(case.events)} events, input {case.input_sha256}", file=sys.stderr)
        recorded.append(case)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(dump_set(recorded))
    print(out)
    return 0


def add_parser(sub: Any) -> None:
    judge = sub.add_parser("judge", help="the faithfulness judge: its agreement on the labelled set, its input")
    commands = judge.add_subparsers(dest="judge_command", required=True)
    ev = commands.add_parser("eval", help="ask a judge about every labelled case; print precision, recall, F1")
    add_judge_arguments(ev, signing=False)
    ev.add_argument("--set", metavar="FILE", help="a labelled set (default: the one shipped with ale)")
    ev.add_argument("--case", action="append", metavar="NAME", help="only this case or task (repeatable)")
    ev.set_defaults(func=cmd_eval)
    inp = commands.add_parser("input", help="the judge inputs of a bundle's reproduction tasks (digests, or bytes)")
    inp.add_argument("bundle", help="the .ale bundle")
    inp.add_argument("--identity", required=True, help="age identity file (AGE-SECRET-KEY-1...)")
    inp.add_argument("--task", metavar="ID@VERSION", help="write this task's judge input to stdout")
    inp.set_defaults(func=cmd_input)
    rec = commands.add_parser("record-set", help="run the scripted agents and write a labelled set")
    rec.add_argument("--out", required=True, help="where to write the set (.jsonl.zst)")
    rec.add_argument("--case", action="append", metavar="TASK/NAME", help="only this case (repeatable)")
    rec.add_argument("--episodes", type=int, default=5, help="official episodes per run (default 5)")
    rec.set_defaults(func=cmd_record_set)
