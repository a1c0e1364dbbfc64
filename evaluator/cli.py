"""``ale-evaluator``: serve a task's evaluator, list tasks, or run a self-contained demonstration."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import tempfile
import threading
from pathlib import Path

from ale import catalog
from ale.core.parse import JsonLimitError, ParseError, parse_json
from ale_evaluator import __version__
from ale_evaluator.events import EventLog
from ale_evaluator.parallel import MAX_STEP_THREADS
from ale_evaluator.seeds import RunConfig, RunConfigError
from ale_evaluator.server import default_rpc_cpu, keep_to_cpu, start, unix_address
from ale_evaluator.service import TASK_BUDGET, EvaluatorState


class CliError(Exception):
    """A problem the user can fix; printed without a traceback, exit status 2."""


def _read_run_config(args: argparse.Namespace) -> RunConfig:
    if args.run_config_fd is not None:
        try:
            with os.fdopen(args.run_config_fd, "rb", closefd=True) as f:
                raw = f.read(8192)
        except OSError as exc:
            raise CliError(f"cannot read the run configuration from fd {args.run_config_fd}: {exc.strerror}") from None
    elif args.run_config_file is not None:
        try:
            raw = Path(args.run_config_file).read_bytes()
        except OSError as exc:
            raise CliError(f"cannot read the run configuration {args.run_config_file}: {exc.strerror}") from None
    else:
        return RunConfig.generate()
    try:
        return RunConfig.from_json(raw)
    except RunConfigError as exc:
        raise CliError(f"run configuration: {exc}") from None


def _address(socket: str | None, address: str | None, name: str) -> str:
    if bool(socket) == bool(address):
        raise CliError(f"give exactly one of --{name}-socket and --{name}-address")
    return unix_address(socket) if socket else str(address)


def cmd_serve(args: argparse.Namespace, config: RunConfig | None = None) -> int:
    try:
        task = catalog.get_task(args.task)
    except catalog.UnknownTaskError as exc:
        raise CliError(str(exc)) from None
    if config is None:
        config = _read_run_config(args)
    rpc_cpu = default_rpc_cpu() if args.rpc_cpu == "auto" else None if args.rpc_cpu == "none" else int(args.rpc_cpu)
    all_cpus = None
    if rpc_cpu is not None:  # before any thread starts, so that the gRPC threads inherit it
        try:
            all_cpus = keep_to_cpu(rpc_cpu)
        except (ValueError, OSError) as exc:
            raise CliError(f"--rpc-cpu: {exc}") from None
    events_stream = open(args.events, "a", encoding="utf-8", buffering=1) if args.events else None  # noqa: SIM115
    step_threads = None if args.step_threads == "auto" else int(args.step_threads)
    budget = {"task": TASK_BUDGET, "none": None}.get(args.env_step_budget, TASK_BUDGET)
    if args.env_step_budget not in ("task", "none"):
        budget = int(args.env_step_budget)
    state = EvaluatorState(
        task,
        config,
        events=EventLog(events_stream),
        batch_cpus=all_cpus,
        step_threads=step_threads,
        env_step_budget=budget,
    )
    agent = _address(args.agent_socket, args.agent_address, "agent")
    harness = _address(args.harness_socket, args.harness_address, "harness")
    try:
        running = start(state, agent_address=agent, harness_address=harness, workers=args.workers)
    except (OSError, RuntimeError) as exc:
        raise CliError(f"cannot start the evaluator: {exc}") from None
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    state.events.record("evaluator_ready", task_id=task.spec.id, task_version=task.spec.version, run_id=config.run_id)
    print(
        json.dumps(
            {
                "event": "ready",
                "task": task.spec.ref,
                "run_id": config.run_id,
                "agent": running.agent_address,
                "harness": running.harness_address,
                "evaluator_version": __version__,
                "rpc_cpu": rpc_cpu,
                "step_threads": state.step_pool.threads,
            }
        ),
        flush=True,
    )
    stop.wait()
    running.stop(grace=1.0)
    if events_stream:
        events_stream.close()
    return 0


MAX_STANDBY_BYTES = 64 * 1024


def read_standby_job(raw: bytes) -> tuple[list[str], RunConfig]:
    """The ``serve`` arguments and run configuration of a standby job (see :func:`cmd_standby`)."""
    try:
        job = parse_json(raw, what="the standby job", max_bytes=MAX_STANDBY_BYTES, max_depth=4)
    except JsonLimitError as exc:  # never quote the job: it holds the run's secret
        raise CliError(f"the standby job is past its {exc.limit} limit ({MAX_STANDBY_BYTES} bytes, 4 levels)") from None
    except ParseError:
        raise CliError("the standby job is not valid JSON") from None
    if type(job) is not dict or set(job) != {"serve", "run_config"}:
        raise CliError('the standby job must be an object with exactly "serve" and "run_config"')
    argv, run_config = job["serve"], job["run_config"]
    if type(argv) is not list or not all(type(a) is str for a in argv) or len(argv) > 64:
        raise CliError('the standby job\'s "serve" must be a list of at most 64 strings')
    if type(run_config) is not dict:
        raise CliError('the standby job\'s "run_config" must be an object')
    try:
        return argv, RunConfig.from_json(json.dumps(run_config).encode())
    except RunConfigError as exc:
        raise CliError(f"run configuration: {exc}") from None


def cmd_standby(args: argparse.Namespace) -> int:
    """Load the evaluator's code, then wait for a job on ``--job-fd``: one JSON object
    ``{"serve": [serve options...], "run_config": {"run_id", "secret"}}``, read to the end of the
    descriptor. Then serve exactly as ``serve`` with those options. A runner starts a standby
    evaluator ahead of time so that the task's evaluator does not wait for its code to load; a
    descriptor closed without a job (the runner discarded it, or died) ends it with status 0.
    """
    try:
        with os.fdopen(args.job_fd, "rb", closefd=True) as f:
            raw = f.read(MAX_STANDBY_BYTES + 1)
    except OSError as exc:
        raise CliError(f"cannot read the standby job from fd {args.job_fd}: {exc.strerror}") from None
    if not raw:
        return 0
    argv, config = read_standby_job(raw)
    serve = build_parser().parse_args(["serve", *argv])
    if serve.run_config_fd is not None or serve.run_config_file is not None:
        raise CliError("a standby job carries its run configuration itself, not as a serve option")
    return int(cmd_serve(serve, config))


def cmd_tasks(args: argparse.Namespace) -> int:
    for task in catalog.tasks().values():
        s = task.spec
        print(f"{s.ref:<28} {s.genre:<13} {s.mode:<12} {s.gym_id:<20} {s.headline.metric} ({s.headline.direction})")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from ale_evaluator.demo import run_demo

    try:
        task = catalog.get_task(args.task)
    except catalog.UnknownTaskError as exc:
        raise CliError(str(exc)) from None
    with tempfile.TemporaryDirectory(prefix="ale-demo-") as tmp:
        return run_demo(task, Path(tmp), episodes=args.episodes, out=sys.stdout)


def _rpc_cpu(value: str) -> str:
    if value in ("auto", "none") or (value.isdigit() and len(value) <= 4):
        return value
    raise argparse.ArgumentTypeError(f"expected a CPU number, 'auto' or 'none', got {value!r}")


def _step_threads(value: str) -> str:
    if value == "auto" or (value.isdigit() and len(value) <= 2 and 1 <= int(value) <= MAX_STEP_THREADS):
        return value
    raise argparse.ArgumentTypeError(
        f"expected 'auto' or a number of threads from 1 to {MAX_STEP_THREADS}, got {value[:40]!r}"
    )


def _env_step_budget(value: str) -> str:
    if value in ("task", "none") or (value.isdigit() and len(value) <= 15 and int(value) > 0):
        return value
    raise argparse.ArgumentTypeError(f"expected a positive number of steps, 'task' or 'none', got {value[:40]!r}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ale-evaluator", description=__doc__)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--log-level", default="WARNING", help="Python logging level for stderr (default WARNING)")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="serve one task on an agent and a harness endpoint")
    serve.add_argument("--task", required=True, help="task id (see `ale-evaluator tasks`)")
    serve.add_argument("--agent-socket", help="Unix socket path for the agent endpoint (mounted into the sandbox)")
    serve.add_argument("--agent-address", help="gRPC address for the agent endpoint instead, e.g. 127.0.0.1:0")
    serve.add_argument("--harness-socket", help="Unix socket path for the harness endpoint (mode 0600)")
    serve.add_argument("--harness-address", help="gRPC address for the harness endpoint instead")
    serve.add_argument("--run-config-fd", type=int, help='read {"run_id", "secret"} JSON from this descriptor')
    serve.add_argument("--run-config-file", help="read the run configuration from this file")
    serve.add_argument("--events", help="append the evaluator's JSONL event log to this file")
    serve.add_argument("--workers", type=int, default=4, help="gRPC worker threads per endpoint (default 4)")
    serve.add_argument(
        "--rpc-cpu",
        default="auto",
        type=_rpc_cpu,
        help="keep the serving threads on this CPU: a number, 'none', or 'auto' (the last CPU when there are"
        " two or more; default). Batch evaluations still use every CPU.",
    )
    serve.add_argument(
        "--step-threads",
        default="auto",
        type=_step_threads,
        help="threads that step the copies of a MuJoCo vector env, the serving thread included: a number"
        " (1: no helpers) or 'auto' (one per CPU the process may use, at most 8; default)",
    )
    serve.add_argument(
        "--env-step-budget",
        default="task",
        type=_env_step_budget,
        help="the agent's environment steps (its Steps and batch episodes): a number, 'task' (the task's"
        " budgets.env_steps; default) or 'none' (counted, never refused)",
    )
    serve.set_defaults(func=cmd_serve)

    standby = sub.add_parser(
        "standby", help="load the evaluator's code, then serve the task a job on a descriptor names"
    )
    standby.add_argument(
        "--job-fd", type=int, required=True, help='read {"serve": [...], "run_config": {...}} from this descriptor'
    )
    standby.set_defaults(func=cmd_standby)

    tasks = sub.add_parser("tasks", help="list the installed tasks")
    tasks.set_defaults(func=cmd_tasks)

    demo = sub.add_parser("demo", help="serve a task and drive it with the gym client, end to end")
    demo.add_argument("--task", default="cartpole-balance", help="task id (default cartpole-balance)")
    demo.add_argument("--episodes", type=int, default=0, help="official episodes (default: the task's count)")
    demo.set_defaults(func=cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args))
    except CliError as exc:
        print(f"ale-evaluator: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
