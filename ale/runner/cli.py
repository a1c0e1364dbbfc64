"""``ale``: list tasks, run them with an agent, inspect or view a bundle."""

from __future__ import annotations

import argparse
import functools
import os
import shlex
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import attrs
import trio

from ale import __version__, catalog
from ale.judge import cli as judge_cli
from ale.runner import agent_env, runtimes
from ale.runner.options import MAX_JOBS, AgentSpec
from ale.runner.runtime import Runtime

if TYPE_CHECKING:
    from collections.abc import Callable

    from ale.core.release import ReleaseManifest

BUNDLED_AGENTS = {
    "demo": "ale.agents.demo",
    "random": "ale.agents.random_agent",
    "llm": "ale.agents.llm",  # the built-in LLM coding agent: needs --model
}


class CliError(Exception):
    """A problem the user can fix: printed without a traceback, exit status 2."""


def _agent(args: argparse.Namespace) -> AgentSpec:
    declared = {"model": args.model, "effort": args.effort}
    if args.agent_cmd:
        try:
            command = tuple(shlex.split(args.agent_cmd))
        except ValueError as exc:
            raise CliError(f"--agent-cmd: {exc}") from None
        if not command:
            raise CliError("--agent-cmd is empty")
        return AgentSpec(
            name=args.agent_name or Path(command[0]).name,
            command=command,
            declared=declared,
            packages=tuple(args.agent_package or ()),
        )
    module = BUNDLED_AGENTS.get(args.agent)
    if module is None:
        raise CliError(
            f"unknown bundled agent {args.agent!r}; choose from {', '.join(BUNDLED_AGENTS)} or use --agent-cmd"
        )
    # The sandbox's own interpreter; the agent's modules go into its environment (agent_env).
    argv: tuple[str, ...] = (agent_env.PYTHON, "-m", module)
    if args.agent == "llm":
        if not args.model:
            raise CliError("--agent llm needs --model: the model name the LLM endpoint serves")
        argv += ("--model", args.model)
    return AgentSpec(
        name=f"ale-{args.agent}",
        command=argv,
        declared=declared,
        modules=(module,),
        packages=tuple(args.agent_package or ()),
    )


def _release(args: argparse.Namespace) -> tuple[ReleaseManifest, str, str]:
    manifest, digest, name, _raw = _release_and_bytes(args)
    return manifest, digest, name


def _release_and_bytes(args: argparse.Namespace) -> tuple[ReleaseManifest, str, str, bytes]:
    try:
        raw = Path(args.release_file).read_bytes() if args.release_file else catalog.release_bytes(args.release)
    except OSError as exc:
        raise CliError(f"cannot read the release manifest: {exc}") from None
    except FileNotFoundError as exc:
        raise CliError(str(exc)) from None
    # A release file's images lock is in the locks/ folder beside it, as an installed one's.
    locks = Path(args.release_file).parent / catalog.LOCKS if args.release_file else None
    manifest, digest = _parse_release(raw, (lambda n: (locks / n).read_bytes()) if locks else None)
    return manifest, digest, manifest.release, raw


def _parse_release(raw: bytes, read_lock: Callable[[str], bytes] | None = None) -> tuple[ReleaseManifest, str]:
    """``raw`` parsed, its images lock read by ``read_lock`` (default: the installed releases' locks)."""
    from ale.core.parse import ParseError
    from ale.core.release import parse_release

    try:
        return parse_release(raw, read_lock or catalog.lock_bytes)
    except ParseError as exc:
        raise CliError(str(exc)) from None


def _check_recipients(recipients: list[str]) -> None:
    import pyrage

    for r in recipients:
        try:
            pyrage.x25519.Recipient.from_str(r)
        except pyrage.RecipientError:
            raise CliError(f"--recipient {r!r} is not an age X25519 public key (age1...)") from None


def _recipients(args: argparse.Namespace, out_dir: Path, run_hint: str) -> tuple[list[str], Path | None]:
    import pyrage

    recipients = list(args.recipient or [])
    if not recipients and os.environ.get("ALE_RECIPIENT"):
        recipients = [os.environ["ALE_RECIPIENT"]]
    _check_recipients(recipients)
    if recipients:
        return recipients, None
    identity = pyrage.x25519.Identity.generate()
    key_path = out_dir / f"{run_hint}.key"
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(f"# a local identity for a run without a site\n# public key: {identity.to_public()}\n{identity}\n")
    return [str(identity.to_public())], key_path


def cmd_tasks(args: argparse.Namespace) -> int:
    manifest, _, _ = _release(args)
    required = set(manifest.required_tasks)
    for task in catalog.tasks().values():
        s = task.spec
        mark = "*" if s.ref in required else " "
        print(
            f"{mark} {s.ref:<26} {s.genre:<13} {s.mode:<12} {s.gym_id:<20} "
            f"{s.headline.metric} ({s.headline.direction}), {s.official_episodes} episodes"
        )
    print(f"(* = in the required task set of release {manifest.release})")
    return 0


def _run_tasks(args: argparse.Namespace, manifest: Any) -> list[str]:
    tasks = list(args.tasks)
    if args.all:
        tasks = [ref.split("@")[0] for ref in manifest.required_tasks]
    if not tasks:
        raise CliError("name at least one task (see `ale tasks`) or use --all")
    for t in tasks:
        try:
            catalog.get_task(t)
        except catalog.UnknownTaskError as exc:
            raise CliError(str(exc)) from None
    return tasks


def _writable_out(args: argparse.Namespace) -> Path:
    out_dir = Path(args.out)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        probe = out_dir / ".ale-write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise CliError(f"the output folder {out_dir} is not writable: {exc.strerror}") from None
    return out_dir


def _site_challenge(args: argparse.Namespace) -> tuple[str | None, str | None, str | None]:
    """The site's recipient, the challenge nonce and token (all None without --site)."""
    if not args.site:
        return None, None, None
    from ale.runner.site import Site, SiteError

    token = args.token or os.environ.get("ALE_TOKEN")
    if not token:
        raise CliError("--site needs an API token: --token or $ALE_TOKEN")
    try:
        with Site(args.site, token) as site:
            site_recipient = site.submission_key()
            challenge = site.challenge()
    except SiteError as exc:
        raise CliError(str(exc)) from None
    return site_recipient, challenge["nonce"], challenge["token"]


def _runner_key(args: argparse.Namespace) -> Any:
    if not args.runner_key:
        return None
    from ale.core.signing import SignatureError, load_private_key

    try:
        return load_private_key(Path(args.runner_key).read_bytes())
    except (OSError, SignatureError) as exc:
        raise CliError(f"--runner-key: {exc}") from None


def _drive(harness: Any, progress: Any) -> tuple[Any, int]:
    """Run the harness; the record, or None and the exit status of a run that wrote no bundle."""
    from ale.runner.harness import RunError, RunInterrupted
    from ale.runner.runtime import RuntimeUnavailable

    try:
        return trio.run(harness.run), 0
    except RunInterrupted as exc:
        message, status = f"run interrupted; no bundle was written; {exc}", 130
    except RunError as exc:
        message, status = f"run failed, no bundle was written: {exc}", 1
    except RuntimeUnavailable as exc:
        message, status = f"error: the agent's sandbox cannot run on this machine: {exc}", 2
    progress.close()
    print(f"ale: {message}", file=sys.stderr)
    return None, status


def _report(record: Any, run_score: Any, key_path: Path | None) -> None:
    from ale.runner import bundle_writer

    for o in record.outcomes:
        if o.status != "completed":
            ended = "" if o.ended is None else f" ({o.ended.phase}: {o.ended.category})"
            print(f"{o.task.spec.ref}: not completed{ended}: {o.reason}", file=sys.stderr)
    for line in bundle_writer.summary_lines(run_score):
        print(line, file=sys.stderr)
    for line in bundle_writer.judge_lines(record):
        print(line, file=sys.stderr)
    if key_path is not None:
        print(
            f"note: no --recipient given: the bundle is encrypted to a new local key {key_path} "
            "(a bundle without a site never rises above self_reported)",
            file=sys.stderr,
        )


def _upstreams(args: argparse.Namespace) -> tuple[Any, ...]:
    """The LLM gateway's upstreams (docs/agent-contract.md, "The LLM gateway"); their keys leave
    this process's environment once read."""
    from ale.runner import gateway_proc

    try:
        upstreams = gateway_proc.configure(
            args.llm_upstream or (), os.environ, use_environment=not args.no_llm_environment
        )
    except gateway_proc.UpstreamError as exc:
        raise CliError(str(exc)) from None
    gateway_proc.forget_keys(upstreams, os.environ)
    return upstreams


def _runtime(name: str) -> Runtime:
    try:
        return runtimes.make(name)
    except runtimes.UnknownRuntime as exc:
        raise CliError(f"--runtime: {exc}") from None


def _jobs(args: argparse.Namespace) -> int | None:
    """``--jobs N``: a positive integer (more than the run's tasks or the machine holds is fine: the
    harness runs no more than those, ale.runner.schedule)."""
    text = getattr(args, "jobs", None)
    if text is None:
        return None
    try:
        jobs = int(text)
    except ValueError:
        raise CliError(f"--jobs must be a positive integer, not {text[:40]!r}") from None
    if jobs <= 0:
        raise CliError(f"--jobs must be a positive integer, not {jobs}")
    return min(jobs, MAX_JOBS)


def cmd_run(args: argparse.Namespace) -> int:
    if args.resume is not None:
        return _resume(args)
    jobs = _jobs(args)
    judge = judge_cli.judge_options(args)  # refused before anything starts
    if judge is not None:
        judge = attrs.evolve(judge, key_env=judge_cli.JUDGE_KEY_ENV if args.judge_upstream else "OPENAI_API_KEY")
    runtime = _runtime(args.runtime)
    manifest, digest, name, raw = _release_and_bytes(args)
    tasks = _run_tasks(args, manifest)
    agent = _agent(args)
    upstreams = _upstreams(args)
    out_dir = _writable_out(args)
    runtime.prestart_evaluator(min(jobs or 1, len(tasks)))  # their code loads while the harness's does
    try:
        made = _make_bundle(
            args, runtime, (manifest, digest, name), tasks, out_dir, agent, upstreams, judge, jobs=jobs or 1,
            release_source=raw,
        )  # fmt: skip
    finally:
        runtime.close()
    return _printed(made)


def _printed(made: Path | int) -> int:
    if isinstance(made, int):
        return made
    print(made)
    return 0


#: ``ale run``'s options that say what the run is, with their defaults: --resume takes them from the run
RUN_DEFINING = {
    "tasks": [], "all": False, "agent": "demo", "agent_cmd": None, "agent_name": None, "agent_package": None,
    "model": None, "effort": None, "episodes": None, "agent_time": None, "site": None, "token": None,
    "llm_upstream": None, "no_llm_environment": False, "runtime": runtimes.DEFAULT, "judge_model": None,
    "judge_upstream": None, "release": catalog.DEFAULT_RELEASE, "release_file": None,
}  # fmt: skip


def _state_folder(run: str, out_dir: Path) -> Path:
    """The state folder ``--resume RUN`` names: a run id's in the --out folder, or a folder given."""
    from ale.runner import state

    if "/" in run or run.endswith(state.SUFFIX):
        folder = Path(run)
    elif state.RUN_ID.fullmatch(run) is None:
        raise CliError(f"--resume {run[:80]!r}: not a run id (run-...) nor a run's state folder")
    else:
        folder = state.folder_for(out_dir, run)
    if not folder.is_dir():
        raise CliError(f"no run to resume at {folder} (a run keeps its state in the --out folder it was started with)")
    return folder


def _resume(args: argparse.Namespace) -> int:
    """``ale run --resume RUN``: the run continued as it was started (ale.runner.resume)."""
    from ale.core.parse import ParseError
    from ale.runner import gateway_proc, resume, state
    from ale.runner.options import RunOptions

    given = [
        "task names" if name == "tasks" else f"--{name.replace('_', '-')}"
        for name, default in RUN_DEFINING.items()
        if getattr(args, name, default) not in (default, None, [])
    ]
    if given:
        raise CliError(f"--resume continues the run as it was started: {', '.join(given)} cannot be given with it")
    jobs = _jobs(args)
    out_dir = _writable_out(args)
    folder = _state_folder(args.resume, out_dir)
    try:
        kept = state.load(folder)
        doc = resume.parse(kept.run["options"])
    except (state.StateError, ParseError) as exc:
        raise CliError(f"cannot resume from {folder}: {exc}") from None
    if doc.release.manifest is not None:
        manifest, digest = _parse_release(doc.release.manifest.encode())
        raw = doc.release.manifest.encode()
    else:
        try:
            raw = catalog.release_bytes(doc.release.name)
        except (OSError, FileNotFoundError) as exc:
            raise CliError(f"the run's release {doc.release.name!r} cannot be read: {exc}") from None
        manifest, digest = _parse_release(raw)
    if digest != doc.release.sha256:
        raise CliError(f"the run's release manifest is not the one it started with ({doc.release.sha256})")
    for ref in doc.tasks:
        _run_tasks(argparse.Namespace(tasks=[ref], all=False), manifest)
    try:
        restored = resume.restore(doc, os.environ, jobs=jobs)
    except (gateway_proc.UpstreamError, ValueError) as exc:
        raise CliError(f"cannot resume {kept.run_id}: {exc}") from None
    gateway_proc.forget_keys(restored["upstreams"], os.environ)
    judge = restored["judge"]
    if getattr(args, "judge_key", None):
        if judge is None:
            raise CliError("--judge-key: the run has no judge (--judge-model)")
        judge = attrs.evolve(judge, signing_key=judge_cli._signing_key(args.judge_key))
    runtime = _runtime(doc.runtime)
    options = RunOptions(
        **{**restored, "judge": judge}, release=manifest, release_sha256=digest, release_name=manifest.release,
        release_source=raw, state_parent=folder.parent, resume=kept.run_id,
    )  # fmt: skip
    print(f"resuming {kept.run_id}: {', '.join(options.tasks)} ({folder})", file=sys.stderr)
    runtime.prestart_evaluator(min(options.jobs, len(options.tasks)))
    try:
        made = _execute(args, runtime, options, out_dir, doc.site_recipient)
    finally:
        runtime.close()
    return _printed(made)


def _make_bundle(
    args: argparse.Namespace,
    runtime: Runtime,
    release: tuple[Any, str, str],
    tasks: list[str],
    out_dir: Path,
    agent: AgentSpec,
    upstreams: Any,
    judge: Any = None,
    *,
    jobs: int = 1,
    release_source: bytes = b"",
) -> Path | int:
    """Run and write the bundle: its path, or the exit status of a run that wrote none."""
    from ale.runner.options import RunOptions

    manifest, digest, name = release
    _check_recipients(args.recipient or ([os.environ["ALE_RECIPIENT"]] if os.environ.get("ALE_RECIPIENT") else []))
    site_recipient, nonce, challenge_token = _site_challenge(args)
    options = RunOptions(
        tasks=tuple(tasks),
        agent=agent,
        release=manifest,
        release_sha256=digest,
        release_name=name,
        episodes=args.episodes,
        agent_time_s=args.agent_time,
        nonce=nonce,
        challenge_token=challenge_token,
        upstreams=upstreams,
        judge=judge,
        jobs=jobs,
        state_parent=out_dir,
        release_source=release_source,
        site_recipient=site_recipient,
    )
    return _execute(args, runtime, options, out_dir, site_recipient)


def _execute(
    args: argparse.Namespace, runtime: Runtime, options: Any, out_dir: Path, site_recipient: str | None
) -> Path | int:
    """Run ``options`` and write the bundle: its path, or the exit status of a run that wrote none."""
    from ale.runner.harness import Harness
    from ale.runner.progress import LiveProgress, PlainProgress

    _check_recipients(args.recipient or ([os.environ["ALE_RECIPIENT"]] if os.environ.get("ALE_RECIPIENT") else []))
    runner_key = _runner_key(args)
    plain = args.plain or not sys.stderr.isatty() or os.environ.get("CI")
    progress = PlainProgress() if plain else LiveProgress(list(options.tasks))
    record, status = _drive(Harness(options, runtime, progress), progress)
    if record is None:
        return status
    from ale.runner import bundle_writer  # loaded while the run went on (harness.LATER_MODULES)

    try:
        progress.phase("run", "bundle", "scoring and encrypting")
        if site_recipient is not None:
            recipients, key_path = [site_recipient, *(args.recipient or [])], None
        else:
            recipients, key_path = _recipients(args, out_dir, record.run_id)
        path, run_score = bundle_writer.write_bundle(record, recipients, out_dir, runner_key=runner_key)
        if record.state is not None:
            record.state.bundle_written(path)
    finally:
        progress.close()
        shutil.rmtree(record.root, ignore_errors=True)
    _report(record, run_score, key_path)
    return path


def cmd_rerun(args: argparse.Namespace) -> int:
    """``ale rerun SUBMISSION`` (ale.runner.rerun): the submission's agent rerun officially, uploaded."""
    from ale.runner.rerun import RerunError, agent_of, release_of, summary_of, tasks_of
    from ale.runner.site import Site, SiteError

    token = args.token or os.environ.get("ALE_TOKEN")
    if not token:
        raise CliError("--token or $ALE_TOKEN: the rerun asks the site for a challenge and uploads")
    if not args.runner_key:
        raise CliError("--runner-key: an official rerun is signed by a registered runner key")
    try:
        with Site(args.site, token) as site:
            record = site.submission(args.submission)
        summary = summary_of(record)
        agent = agent_of(summary, packages=tuple(args.agent_package or ()))
        tasks = tasks_of(summary)
        release = release_of(summary)
    except SiteError as exc:
        raise CliError(str(exc)) from None
    except RerunError as exc:
        raise CliError(f"cannot rerun {args.submission}: {exc}") from None
    runtime = _runtime(args.runtime)
    upstreams = _upstreams(args)
    judge = judge_cli.judge_options(args)  # the faithfulness judge, as for ale run
    out_dir = _writable_out(args)
    print(f"rerunning {args.submission}: {agent.name} on {', '.join(tasks)} ({release[2]})", file=sys.stderr)
    runtime.prestart_evaluator()
    try:
        made = _make_bundle(args, runtime, release, tasks, out_dir, agent, upstreams, judge)
    finally:
        runtime.close()
    if isinstance(made, int):
        return made
    try:
        with Site(args.site, token) as site:
            verdict = site.submit(made)
    except SiteError as exc:
        raise CliError(f"the rerun's bundle {made} was not uploaded: {exc}") from None
    print(f"{verdict.get('status')}: level {verdict.get('level')} ({verdict.get('url')}), rerun of {args.submission}")
    for r in verdict.get("reasons") or []:
        print(f"  {r.get('reason')}: {r.get('message')}")
    print(made)
    return 0 if verdict.get("status") == "accepted" else 1


def cmd_submit(args: argparse.Namespace) -> int:
    import json

    from ale.runner.site import Site, SiteError

    bundle = Path(args.bundle)
    if not bundle.is_file():
        raise CliError(f"no bundle at {bundle}")
    token = args.token or os.environ.get("ALE_TOKEN")
    if not token:
        raise CliError("an API token is needed: --token or $ALE_TOKEN (log in on the site to make one)")
    try:
        with Site(args.site, token) as site:
            verdict = site.submit(bundle)
    except SiteError as exc:
        raise CliError(str(exc)) from None
    if args.json:
        print(json.dumps(verdict, indent=2, sort_keys=True))
    else:
        print(f"{verdict.get('status')}: level {verdict.get('level')} ({verdict.get('url')})")
        for r in verdict.get("reasons") or []:
            print(f"  {r.get('reason')}: {r.get('message')}")
    return 0 if verdict.get("status") == "accepted" else 1


def cmd_runner_key(args: argparse.Namespace) -> int:
    from ale.core.signing import new_private_key_pem

    pem, public, key_id = new_private_key_pem()
    try:
        fd = os.open(args.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        raise CliError(f"cannot create {args.path}: {exc.strerror}") from None
    with os.fdopen(fd, "wb") as fh:
        fh.write(pem)
    print(f"public key (register it on the site): {public}\nkey id: {key_id}")
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    from ale.runner.inspect import inspect_bundle

    return inspect_bundle(Path(args.bundle), Path(args.identity), as_json=args.json, runner_keys=args.runner_public_key)


def cmd_view(args: argparse.Namespace) -> int:
    from ale.runner.view import ViewError, view_command

    out = Path(args.out) if args.out else None
    try:
        return view_command(
            Path(args.bundle), Path(args.identity), out=out, serve_it=args.serve, port=args.port,
            runner_keys=args.runner_public_key,
        )  # fmt: skip
    except ViewError as exc:
        raise CliError(str(exc)) from None


def add_llm_arguments(p: argparse.ArgumentParser) -> None:
    """The LLM gateway's options (``ale run``, ``ale rerun``)."""
    p.add_argument(
        "--llm-upstream",
        action="append",
        metavar="NAME=URL[,api=API][,key-env=VAR][,ca-file=PATH]",
        help="an LLM API the agent may reach through the run's gateway (repeatable), e.g. "
        "openai=https://api.openai.com/v1 (key from $OPENAI_API_KEY) or local=http://127.0.0.1:8080/v1,api=openai; "
        "api: openai or anthropic (default: NAME when it is one of them); key-env: the variable holding its "
        "key (default OPENAI_API_KEY / ANTHROPIC_API_KEY for those names, else NAME_API_KEY)",
    )
    p.add_argument(
        "--no-llm-environment",
        action="store_true",
        help="do not make upstreams of OPENAI_BASE_URL / OPENAI_API_KEY / ANTHROPIC_BASE_URL / ANTHROPIC_API_KEY",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ale", description="ALE Robotics: run tasks, inspect bundles.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    def release_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("--release", default=catalog.DEFAULT_RELEASE, help="installed release manifest name")
        p.add_argument("--release-file", help="a release manifest JSON file instead of an installed one")

    tasks = sub.add_parser("tasks", help="list the tasks of the installed release")
    release_args(tasks)
    tasks.set_defaults(func=cmd_tasks)

    run = sub.add_parser("run", help="run tasks with an agent and write an encrypted bundle")
    run.add_argument("tasks", nargs="*", help="task ids (see `ale tasks`)")
    run.add_argument("--all", action="store_true", help="run the release's whole required task set")
    run.add_argument(
        "--agent",
        default="demo",
        help="a bundled agent: demo (default), random, or llm (the LLM coding agent; needs --model)",
    )
    run.add_argument("--agent-cmd", help="your agent: a command line run inside the sandbox")
    run.add_argument("--agent-name", help="the agent's name on the board (default: the command's name)")
    run.add_argument(
        "--agent-package",
        action="append",
        metavar="DIST",
        help="an installed Python distribution (e.g. openai, anthropic) put into the agent's environment "
        "with what it requires, at the installed version (repeatable; docs/agent-contract.md)",
    )
    run.add_argument("--model", help="declared: the model the agent uses")
    run.add_argument("--effort", help="declared: the effort tier")
    run.add_argument("--recipient", action="append", help="age X25519 public key to encrypt to (repeatable)")
    run.add_argument("--out", default="out", help="folder for the bundle (default ./out)")
    run.add_argument("--episodes", type=int, help="override the official episode count (the run is then unofficial)")
    run.add_argument("--agent-time", type=float, help="override the agent's wall-time budget, in seconds")
    run.add_argument("--site", help="a verifier's URL: fetch its submission key and a challenge before the run")
    run.add_argument("--token", help="API token for --site (default: $ALE_TOKEN)")
    run.add_argument("--runner-key", help="a registered runner's Ed25519 private key (PEM): sign the bundle")
    add_llm_arguments(run)
    run.add_argument("--plain", action="store_true", help="plain progress lines instead of a live display")
    run.add_argument(
        "--jobs",
        metavar="N",
        help="run up to N tasks side by side (default 1), and never more than this machine's CPUs and memory "
        "hold for each task's sandbox limits (docs/decisions.md)",
    )
    run.add_argument(
        "--resume",
        metavar="RUN",
        help="continue an interrupted or failed run (its id: the state folder RUN.state in --out; or that "
        "folder): its finished tasks are not run again; the run's own options are taken from its state",
    )
    run.add_argument(
        "--runtime",
        default=runtimes.DEFAULT,
        metavar="NAME",
        help=f"where the evaluator and the agent's sandbox run: {', '.join(runtimes.names())} "
        f"(default {runtimes.DEFAULT}: a child process and bubblewrap); the manifest records it",
    )
    judge_cli.add_judge_arguments(run, signing=True)
    release_args(run)
    run.set_defaults(func=cmd_run)

    submit = sub.add_parser("submit", help="upload a bundle to a verifier and print its verdict")
    submit.add_argument("bundle", help="the .ale bundle")
    submit.add_argument("--site", required=True, help="the verifier's URL")
    submit.add_argument("--token", help="API token (default: $ALE_TOKEN)")
    submit.add_argument("--json", action="store_true", help="print the verdict as JSON")
    submit.set_defaults(func=cmd_submit)

    runner_key = sub.add_parser("runner-key", help="make an Ed25519 key for a registered runner")
    runner_key.add_argument("path", help="where to write the private key (PEM, mode 0600)")
    runner_key.set_defaults(func=cmd_runner_key)

    view = sub.add_parser("view", help="check a bundle as inspect does and write (or serve) its run as one HTML page")
    view.add_argument("bundle", help="the .ale bundle")
    view.add_argument("--identity", required=True, help="age identity file (AGE-SECRET-KEY-1...)")
    view.add_argument("--out", help="the HTML file to write (default: the bundle's name with .html; none with --serve)")
    view.add_argument("--serve", action="store_true", help="serve the page on 127.0.0.1 until Ctrl-C")
    view.add_argument("--port", type=int, default=0, help="the port for --serve (default 0: any free port)")
    view.add_argument("--runner-public-key", action="append", default=[], metavar="BASE64", help="as for inspect")
    view.set_defaults(func=cmd_view)

    inspect = sub.add_parser("inspect", help="decrypt a bundle, run the site's checks offline, show what it holds")
    inspect.add_argument("bundle", help="the .ale bundle")
    inspect.add_argument("--identity", required=True, help="age identity file (AGE-SECRET-KEY-1...)")
    inspect.add_argument(
        "--runner-public-key",
        action="append",
        default=[],
        metavar="BASE64",
        help="a registered runner's public key (as `ale runner-key` prints it; repeatable): a signature must "
        "name one of them. Without any, a signature is verified but its registration is not checked",
    )
    inspect.add_argument("--json", action="store_true", help="print the report as JSON")
    inspect.set_defaults(func=cmd_inspect)

    from ale.images.cli import register as register_images
    from ale.runner.rerun import register as register_rerun

    register_images(sub)
    register_rerun(sub, cmd_rerun, add_llm_arguments, functools.partial(judge_cli.add_judge_arguments, signing=True))
    judge_cli.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "episodes", None) is not None and args.episodes <= 0:
        print("ale: error: --episodes must be positive", file=sys.stderr)
        return 2
    try:
        return int(args.func(args))
    except (CliError, judge_cli.JudgeCliError) as exc:
        print(f"ale: error: {exc}", file=sys.stderr)
        return 2


def program() -> NoReturn:
    """``ale`` as a program: :func:`main`, then the process ends at once. Every file it wrote is
    closed by then and its temporary folders are gone, so finalising the modules it loaded (gRPC,
    numpy, the simulator's) is skipped: it took longer than writing the bundle."""
    try:
        status = main()
    except SystemExit as exc:  # argparse's --help and usage errors
        status = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 2
        if not isinstance(exc.code, int | None):
            print(exc.code, file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    program()
