"""``ale rerun SUBMISSION``: an official rerun of a submission's agent.

It reads the submission from the site (``GET /api/v1/submissions/{id}``: the agent's name,
command and declared model and effort, its tasks, its release), runs the same agent on the same
tasks against the same release with official episode counts and a fresh challenge of the site,
signs the bundle with a registered runner key (``--runner-key``: the operator registers it, kind
``official_rerun``) and uploads it. The new submission is ``officially_verified`` when the site's
checks pass. docs/verifier.md, "Official reruns".
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from typing import Any

from ale import catalog
from ale.runner import agent_env, runtimes
from ale.runner.options import AgentSpec

BUNDLED = ("ale.agents.demo", "ale.agents.random_agent", "ale.agents.llm")


class RerunError(Exception):
    """The submission cannot be rerun (the message says why)."""


def _member(doc: Any, key: str, kind: type, what: str) -> Any:
    value = doc.get(key) if isinstance(doc, dict) else None
    if not isinstance(value, kind):
        raise RerunError(f"the site's record of the submission has no {what}")
    return value


def summary_of(record: Any) -> dict[str, Any]:
    """An accepted submission's summary, from the site's public record of it."""
    if not isinstance(record, dict) or record.get("status") != "accepted":
        status = record.get("status") if isinstance(record, dict) else None
        raise RerunError(f"the submission is {str(status)[:40]!r}, not accepted")
    return dict(_member(record, "summary", dict, "summary"))


def agent_of(summary: dict[str, Any], *, packages: tuple[str, ...] = ()) -> AgentSpec:
    """The submission's agent as the rerun runs it: its name, command and declared model and effort;
    a bundled agent's module goes into its environment as ``ale run --agent`` puts it."""
    agent = _member(summary, "agent", dict, "agent")
    name = _member(agent, "name", str, "agent name")
    command = _member(agent, "command", list, "agent command (it was recorded before reruns existed)")
    if not command or not all(isinstance(a, str) for a in command):
        raise RerunError("the site's record of the submission has no agent command")
    declared = _member(agent, "declared", dict, "declared model and effort")
    is_bundled = len(command) >= 3 and command[:2] == [agent_env.PYTHON, "-m"] and command[2] in BUNDLED
    modules = (command[2],) if is_bundled else ()
    return AgentSpec(name=name, command=tuple(command), declared=dict(declared), modules=modules, packages=packages)


def tasks_of(summary: dict[str, Any]) -> list[str]:
    """The ids of every task the submission ran (completed or not), each a task this machine has."""
    info = _member(summary, "task_info", dict, "task list")
    ids = []
    for ref in sorted(info):
        task_id, _, version = ref.partition("@")
        try:
            task = catalog.get_task(task_id)
        except catalog.UnknownTaskError:
            raise RerunError(f"the submission ran {ref[:80]!r}, which this installation does not have") from None
        if task.spec.version != version:
            raise RerunError(f"the submission ran {ref[:80]!r}; this installation has {task.spec.ref}")
        ids.append(task_id)
    if not ids:
        raise RerunError("the submission ran no task")
    return ids


def release_of(summary: dict[str, Any]) -> tuple[Any, str, str]:
    """The submission's release, installed here with the very bytes it was scored against."""
    from ale.core.parse import ParseError

    name = _member(summary, "release", str, "release")
    sha = _member(summary, "release_sha256", str, "release digest")
    if not re.fullmatch(r"[0-9A-Za-z][0-9A-Za-z._-]{0,63}", name) or ".." in name:
        raise RerunError(f"the submission names the release {name[:80]!r}, which is no release name")
    try:
        raw = catalog.release_bytes(name)
    except (FileNotFoundError, OSError):
        raise RerunError(f"release {name!r} is not installed here") from None
    try:
        manifest, digest = catalog.parse_installed_release(raw)
    except ParseError as exc:
        raise RerunError(str(exc)) from None
    if digest != sha:
        raise RerunError(
            f"the installed release {name} is not the one the submission was scored against ({sha[:80]!r})"
        )
    return manifest, digest, manifest.release


def register(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    command: Callable[[argparse.Namespace], int],
    add_llm_arguments: Callable[[argparse.ArgumentParser], None],
    add_judge_arguments: Callable[[argparse.ArgumentParser], None],
) -> None:
    """Add ``ale rerun`` to the ``ale`` command's subcommands (``command``: ale.runner.cli.cmd_rerun)."""
    rerun = sub.add_parser(
        "rerun", help="rerun a submission's agent officially: a fresh challenge, signed by a runner key, uploaded"
    )
    rerun.add_argument("submission", help="the submission's id on the site (sub_...)")
    rerun.add_argument("--site", required=True, help="the verifier's URL")
    rerun.add_argument("--token", help="API token (default: $ALE_TOKEN)")
    rerun.add_argument("--runner-key", help="the registered runner's Ed25519 private key (PEM), required")
    rerun.add_argument(
        "--runtime",
        default=runtimes.DEFAULT,
        metavar="NAME",
        help=f"where it runs: {', '.join(runtimes.names())} (default {runtimes.DEFAULT}; podman runs the "
        "release's images)",
    )
    rerun.add_argument("--agent-package", action="append", metavar="DIST", help="as for ale run (repeatable)")
    rerun.add_argument("--recipient", action="append", help="also encrypt to this age public key (repeatable)")
    rerun.add_argument("--out", default="out", help="folder for the bundle (default ./out)")
    rerun.add_argument("--plain", action="store_true", help="plain progress lines instead of a live display")
    add_llm_arguments(rerun)
    add_judge_arguments(rerun)
    rerun.set_defaults(func=command, episodes=None, agent_time=None)
