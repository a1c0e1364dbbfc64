"""One task of a run: from its ``task_started`` to the end of its official evaluation, into its spool.

In order: the task's folders; its own LLM gateway (a run with upstreams; the task's own token
budgets); its workspace; its evaluator (child process or container, hidden-seed secret handed
over by descriptor); the agent in its sandbox with the task's budgets; the official evaluation over
the harness's own endpoint (interactive: an eval session the agent's policy plays through its
handle; batch: the policy artifact evaluated in-process on hidden seeds); then the evaluator and the
gateway stop. Every event goes into the task's own recorder (its spool, :mod:`ale.runner.spool`);
the harness places the spool in the run's chain and records the task's end (judge, ``task_finished``).

Starting the gateway, the evaluator or a sandbox is retried (:mod:`ale.runner.retry`); a task that
cannot go on ends early (:class:`~ale.runner.outcome.TaskEnded`, ``task_ended_early``) with its
phase and a category (``ale.core.results.END_CATEGORIES``), and the run goes on with its other tasks.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import secrets
import stat
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import trio

from ale import catalog
from ale.core import grammar
from ale.core.parse import ParseError, parse_json
from ale.core.trajectory import MAX_LINE_DEPTH
from ale.env.v1 import env_pb2 as pb
from ale.policy import MAX_POLICY_BYTES
from ale.runner import agent_env, spool
from ale.runner.gateway_proc import GatewayError
from ale.runner.network import GATEWAY_PHASES, NetworkError, RunNetwork, open_network
from ale.runner.options import RunOptions
from ale.runner.outcome import TaskEnded, TaskOutcome, eval_result_json
from ale.runner.progress import Progress
from ale.runner.recorder import Recorder, clip_text, open_recorder
from ale.runner.retry import StartFailed, enter_retried, retried
from ale.runner.runtime import (
    SOCKET_PATH,
    TASK_PATH,
    WORKSPACE_PATH,
    EvaluatorHandle,
    EvaluatorSpec,
    EvaluatorStartError,
    LineSink,
    Network,
    Runtime,
    SandboxError,
    SandboxResult,
    SandboxSpec,
    sandbox_path,
)
from ale.runner.sandbox import SANDBOX_UID
from ale.runner.tails import EvaluatorTail

if TYPE_CHECKING:
    from ale.client import AleEnvClient

AGENT_EVENT_KINDS = frozenset(grammar.AGENT_CHANNEL_KINDS)  # what the agent may write on ALE_EVENT_FD
#: an event-channel line is parsed only up to this size (the runtime cuts longer lines)
MAX_EVENT_LINE = 64 * 1024
POLICY_ENTRYPOINT = "policy"
POLICY_ARTIFACT = "policy.safetensors"
#: The longest path a Unix socket can be bound at (sun_path holds 108 bytes with its NUL).
MAX_SOCKET_PATH = 107


class RunError(Exception):
    """The run cannot go on; the message says why. No bundle is written."""


# -- what a task is given ---------------------------------------------------------------------------


def _task_readme(task: catalog.Task, gateway: bool = False) -> str:
    s = task.spec
    policy = (
        f"an executable {WORKSPACE_PATH}/{POLICY_ENTRYPOINT} (it is run with ALE_ENV_ID, the eval-session handle)"
        if s.mode == "interactive"
        else f"a policy artifact {WORKSPACE_PATH}/{POLICY_ARTIFACT} (docs/policy-format.md)"
    )
    return (
        f"# {s.id} {s.version}: {s.title}\n\n"
        f"Read {TASK_PATH}/paper.md. Talk to the evaluator at unix:{SOCKET_PATH} with `ale.client`.\n"
        f"Leave {policy}.\nBudgets: {s.budgets.wall_time_s} s wall time, {s.budgets.env_steps} environment steps, "
        f"{s.budgets.llm_tokens} LLM tokens. "
        + (
            "The only way out is the LLM gateway while the agent works (OPENAI_BASE_URL, ANTHROPIC_BASE_URL, "
            "ALE_GATEWAY_URL); the policy has none.\n"
            if gateway
            else "There is no network.\n"
        )
    )


def _agent_sink(recorder: Recorder, task_ref: str, prefix: str = "", phase: str = "agent") -> LineSink:
    """Where the agent's output lines go: its stdout and stderr as text, its event channel's lines
    parsed (:func:`_channel_event`); each stream charged to its channel of ``phase``."""

    def sink(stream: str, line: bytes) -> None:
        channel = f"{phase}.{stream}"
        if not recorder.admit(channel, len(line) + 1):
            return
        if stream in ("stdout", "stderr"):
            text = line.decode("utf-8", errors="replace")
            recorder.emit("untrusted_agent", prefix + stream, {"text": text}, channel=channel)
            return
        parsed = _channel_event(line)
        if isinstance(parsed, str):
            data = {"task": task_ref, "reason": parsed}
            recorder.emit("trusted_harness", "rejected_agent_event", data, channel=channel)
            return
        recorder.emit("untrusted_agent", *parsed, channel=channel)  # the grammar has the last word

    return sink


def _channel_event(line: bytes) -> tuple[str, dict[str, Any]] | str:
    """(kind, data) of an event-channel line, or why it is refused."""
    try:
        event = parse_json(line, what="the event line", max_bytes=MAX_EVENT_LINE, max_depth=MAX_LINE_DEPTH)
    except ParseError as exc:
        return clip_text(f"not JSON: {exc}", 512)
    if not isinstance(event, dict) or "kind" not in event:
        return "not a JSON object with a kind"
    kind, data = event["kind"], event.get("data", {})
    if not isinstance(kind, str) or not isinstance(data, dict):
        return "kind must be a string, data an object"
    if kind not in AGENT_EVENT_KINDS:
        refused = grammar.refusal("untrusted_agent", kind)
        why = refused[1] if refused is not None else "it is recorded by the harness, not written on the event channel"
        return clip_text(f"kind {kind!r} is refused: {why}", 512)
    return kind, data


def _prepare_dirs(root: Path, task: catalog.Task, gateway: bool = False) -> tuple[Path, Path]:
    """(task files, workspace) for one task, and the folder of its evaluator's agent socket."""
    task_dir = root / "tasks" / task.spec.id
    task_dir.mkdir(parents=True)
    (task_dir / "paper.md").write_text(task.paper, encoding="utf-8")
    (task_dir / "task.json").write_text(json.dumps(_public_task_json(task), indent=2) + "\n", encoding="utf-8")
    (task_dir / "README.md").write_text(_task_readme(task, gateway), encoding="utf-8")
    for p in [task_dir, *task_dir.iterdir()]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    workspace = root / "workspace" / task.spec.id
    workspace.mkdir(parents=True)
    sockets = evaluator_sockets(root, task.spec.id)[0].parent
    sockets.mkdir(parents=True)
    sockets.chmod(0o755)
    if os.geteuid() == 0:
        os.chown(workspace, SANDBOX_UID, SANDBOX_UID)
    for p in (root / "tasks", root / "workspace", root / "agent-sockets"):
        p.chmod(0o755)
    return task_dir, workspace


def _public_task_json(task: catalog.Task) -> dict[str, Any]:
    from ale.core.parse import converter

    return {"digest": task.digest, **converter.unstructure(task.spec)}


def evaluator_sockets(root: Path, task_id: str) -> tuple[Path, Path]:
    """A task's evaluator endpoints: (the agent's, in a folder the sandbox binds it from; the harness's)."""
    return root / "agent-sockets" / task_id / "evaluator.sock", root / "private" / f"{task_id}.harness.sock"


def gateway_sockets(root: Path, task_id: str) -> tuple[Path, Path]:
    """A task's gateway: (its agent socket, in a folder of its own; its control socket, private)."""
    return root / "gateway" / task_id / "agent.sock", root / "private" / f"{task_id}.gateway.control.sock"


def check_socket_paths(root: Path, tasks: tuple[str, ...], gateway: bool) -> None:
    """Refuse a run folder whose sockets could not be bound (a long TMPDIR or --workdir), up front."""
    paths = []
    for ref in tasks:
        task_id = catalog.get_task(ref).spec.id
        paths += [*evaluator_sockets(root, task_id), *(gateway_sockets(root, task_id) if gateway else ())]
    for path in paths:
        if len(os.fsencode(path)) > MAX_SOCKET_PATH:
            raise RunError(
                f"the run folder {root} is too deep for Unix sockets: {path} would be {len(os.fsencode(path))} "
                f"bytes, at most {MAX_SOCKET_PATH}; use a shorter TMPDIR or --workdir"
            )


def _attempt_path(path: Path, attempt: int) -> Path:
    """An attempt's own log (the first keeps the usual name): a failed start's lines stay apart."""
    return path if attempt == 1 else path.with_name(f"{path.stem}.{attempt}{path.suffix}")


def _unlink(*paths: Path) -> None:
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


async def _left_policy(path: Path, what: str, outcome: TaskOutcome, *, executable: bool) -> os.stat_result | None:
    """The stat of the policy the agent left, or None with the reason recorded on the outcome."""
    shown = f"{WORKSPACE_PATH}/{path.name}"
    try:
        info = await trio.Path(path).lstat()
    except FileNotFoundError:
        outcome.end("agent", _no_policy_category(outcome.agent), f"the agent left no {what} at {shown}")
        return None
    if not stat.S_ISREG(info.st_mode) or (executable and not info.st_mode & 0o111):
        outcome.end("official", "policy/load", f"{shown} is not {'an executable' if executable else 'a'} regular file")
        return None
    return info


def _no_policy_category(agent: dict[str, Any]) -> str:
    """Why an agent that left no policy ended: the budget it was stopped at, its exit, or neither."""
    stopped = agent.get("stopped_for")
    if stopped in ("wall_time", "env_steps", "disk"):
        return {"wall_time": "agent/timeout", "env_steps": "agent/env_steps", "disk": "agent/disk"}[stopped]
    if agent.get("exit_status") not in (0, None) or stopped:
        return "agent/exit"
    return "agent/no_policy"


#: The official evaluation's allowance: a fixed start-up margin plus this much per official episode
#: (a 1000-step episode at 4 ms a step over gRPC), never more than the agent's own wall-time budget.
OFFICIAL_BASE_S = 120.0
OFFICIAL_PER_EPISODE_S = 4.0


def official_deadline_s(task: catalog.Task, episodes: int, override: float | None = None) -> float:
    """How long the official evaluation of ``episodes`` episodes may take (docs/decisions.md)."""
    if override is not None:
        return override
    return min(float(task.spec.budgets.wall_time_s), OFFICIAL_BASE_S + OFFICIAL_PER_EPISODE_S * episodes)


@attrs.frozen
class Deadline:
    """When the official evaluation must be over (``at``, monotonic), ``seconds`` after it began."""

    at: float
    seconds: float

    def remaining(self) -> float:
        return max(0.0, self.at - time.monotonic())

    def missed(self, done: int, total: int) -> str:
        """The failure reason recorded when the deadline passed with ``done`` of ``total`` episodes."""
        return f"the official evaluation passed its deadline of {self.seconds:g} s with {done} of {total} episodes done"


# -- a task ---------------------------------------------------------------------------------------


@attrs.frozen
class RunContext:
    """What a run gives each of its tasks."""

    options: RunOptions
    runtime: Runtime
    progress: Progress
    run_id: str
    root: Path
    private: Path
    agent_env: Callable[[], Awaitable[agent_env.AgentEnv]]  # the agent's environment, once assembled
    waiting: Callable[[], int]  # how many tasks wait to start (their evaluators can be prestarted), at most


class TaskRun:
    """One task, recorded into its spool (``spool_path``); :meth:`run` returns its outcome and the
    spool's chain head. Ctrl-C or a failed run cancels it: the spool keeps what was recorded."""

    def __init__(self, ctx: RunContext, task: catalog.Task, spool_path: Path) -> None:
        self.ctx, self.task, self.spool_path = ctx, task, spool_path
        self.options = ctx.options
        self.runtime = ctx.runtime
        self.progress = ctx.progress
        self.ref = task.spec.ref
        self.network: RunNetwork | None = None
        self._evaluator: EvaluatorHandle = None  # type: ignore[assignment]  # once started (_open)

    async def run(self) -> tuple[TaskOutcome, str]:
        s = self.task.spec
        outcome = TaskOutcome(task=self.task)
        if self.options.upstreams:
            outcome.network = dict(GATEWAY_PHASES)  # the run's policy, the same for every task
        tasks = len(self.options.tasks)
        async with open_recorder(self.spool_path, tasks=tasks, durable=True) as rec:
            rec.emit("trusted_harness", "run_started", spool.header(self.ctx.run_id, s.ref))
            rec.emit("trusted_harness", "task_started", {"task": s.ref, "digest": self.task.digest, "mode": s.mode})
            rec.open_channel("evaluator", s.ref)
            self.progress.phase(s.id, "evaluator", "starting")
            try:
                await self._body(rec, outcome)
            except TaskEnded as end:
                outcome.status, outcome.ended, outcome.reason = "not_completed", end.ended, end.reason
                data = {"task": s.ref, **end.ended.entry(), "reason": clip_text(end.reason, 8192)}
                rec.emit("trusted_harness", "task_ended_early", data)
            rec.close_channel("evaluator")
            head = rec.head
        if outcome.status != "completed" and outcome.ended is None:  # (a result that did not complete)
            outcome.end("official", "evaluation/incomplete")
        return outcome, head

    def _env(self) -> dict[str, str]:
        s = self.task.spec
        return {
            "ALE_EVALUATOR": f"unix:{SOCKET_PATH}",
            "ALE_TASK_ID": s.id,
            "ALE_TASK_VERSION": s.version,
            "ALE_TASK_DIR": TASK_PATH,
            "ALE_WORKSPACE": WORKSPACE_PATH,
            "ALE_MODE": s.mode,
            "ALE_BUDGET_WALL_TIME_S": str(int(self._agent_time())),
            "ALE_BUDGET_ENV_STEPS": str(s.budgets.env_steps),
            "ALE_BUDGET_LLM_TOKENS": str(s.budgets.llm_tokens),
            "HOME": WORKSPACE_PATH,
            "PATH": sandbox_path(),
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONUNBUFFERED": "1",
        }

    def _agent_time(self) -> float:
        return self.options.agent_time_s or float(self.task.spec.budgets.wall_time_s)

    def _retry_kw(self, rec: Recorder) -> dict[str, Any]:
        return {"policy": self.options.retry, "rec": rec, "task_ref": self.ref, "note": self.progress.note}

    async def _body(self, rec: Recorder, outcome: TaskOutcome) -> None:
        ctx = self.ctx
        try:
            task_dir, workspace = await trio.to_thread.run_sync(
                _prepare_dirs, ctx.root, self.task, bool(self.options.upstreams)
            )
        except OSError as exc:
            raise TaskEnded("setup", "infrastructure/harness", f"cannot prepare the task's folders: {exc}") from None
        tails: list[EvaluatorTail] = []
        try:
            # leaving the stack stops the evaluator, removes the workspace's storage, stops the gateway
            async with AsyncExitStack() as stack:
                await self._open(stack, rec, workspace, tails)
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(tails[0].run)
                    if waiting := ctx.waiting():  # the next tasks' evaluators load their code while this one runs
                        await trio.to_thread.run_sync(self.runtime.prestart_evaluator, waiting)
                    await self._phases(self._evaluator, tails[0], task_dir, workspace, rec, outcome)
                    nursery.cancel_scope.cancel()
        except OSError as exc:  # a workspace that would not unmount (the next run sweeps it)
            ended = TaskEnded(spool.end_phase(rec.grammar.phase), "infrastructure/harness", f"cleaning up: {exc}")
            await self._drain(tails)
            raise ended from None
        except TaskEnded:
            await self._drain(tails)
            raise
        await self._drain(tails)

    @staticmethod
    async def _drain(tails: list[EvaluatorTail]) -> None:
        """What the evaluator wrote until it stopped."""
        if tails:
            await tails[0].drain()

    async def _open(self, stack: AsyncExitStack, rec: Recorder, workspace: Path, tails: list[EvaluatorTail]) -> None:
        """The task's gateway (with upstreams), workspace storage and evaluator, into ``stack``."""
        s, ctx = self.task.spec, self.ctx
        if self.options.upstreams:
            self.network = await self._open_gateway(stack, rec)
        try:
            await stack.enter_async_context(self.runtime.open_workspace(workspace, self.options.limits))
        except OSError as exc:
            raise TaskEnded(
                "setup", "infrastructure/harness", f"cannot give the workspace its storage: {exc}"
            ) from None
        config = json.dumps({"run_id": ctx.run_id, "secret": secrets.token_hex(32)}).encode()
        agent_socket, harness_socket = evaluator_sockets(ctx.root, s.id)
        events = ctx.private / f"{s.id}.evaluator.jsonl"

        def evaluator(attempt: int) -> Any:
            _unlink(agent_socket, harness_socket)  # what a failed attempt bound
            spec = EvaluatorSpec(s.id, config, agent_socket, harness_socket, _attempt_path(events, attempt))
            return self.runtime.open_evaluator(spec)

        try:
            self._evaluator = await enter_retried(
                stack, "evaluator_start", evaluator, errors=(EvaluatorStartError,), **self._retry_kw(rec)
            )
        except StartFailed as exc:
            raise TaskEnded("setup", "infrastructure/evaluator_start", f"the evaluator did not start: {exc}") from None
        rec.emit("trusted_harness", "evaluator_started", {"task": s.ref})
        tails.append(EvaluatorTail(self._evaluator.events_path, rec, s.ref))

    async def _open_gateway(self, stack: AsyncExitStack, rec: Recorder) -> RunNetwork:
        ctx, s = self.ctx, self.task.spec
        sockets = gateway_sockets(ctx.root, s.id)
        log = ctx.private / f"{s.id}.gateway.jsonl"

        def gateway(attempt: int) -> Any:
            return open_network(
                ctx.run_id, self.options.upstreams, s.budgets.llm_tokens, sockets, _attempt_path(log, attempt), rec
            )

        try:
            network = await enter_retried(
                stack, "gateway_start", gateway, errors=(NetworkError, GatewayError), **self._retry_kw(rec)
            )
        except StartFailed as exc:
            raise TaskEnded("setup", "infrastructure/gateway_start", f"the LLM gateway did not start: {exc}") from None
        assert network is not None
        return network  # type: ignore[no-any-return]

    async def _phases(
        self, ev: EvaluatorHandle, tail: EvaluatorTail, task_dir: Path, workspace: Path, rec: Recorder,
        outcome: TaskOutcome,
    ) -> None:  # fmt: skip
        await self._agent_phase(ev, tail, task_dir, workspace, rec, outcome)
        self._check_alive(ev, "official")
        if self.task.spec.genre == "reproduction":
            from ale.judge.phase import record_snapshot  # loaded since the run started (LATER_MODULES)

            await record_snapshot(self.task, workspace, rec)
        await self._official_phase(ev, tail, task_dir, workspace, rec, outcome)
        self._check_alive(ev, "official")

    def _check_alive(self, ev: EvaluatorHandle, phase: str) -> None:
        if not ev.alive():
            raise TaskEnded(phase, "infrastructure/evaluator_died",
                            f"the evaluator of {self.task.spec.id} died mid-run:\n{ev.stderr_tail()}")  # fmt: skip

    async def _sandboxed(
        self,
        what_phase: str,
        spec: SandboxSpec,
        sink: LineSink,
        should_stop: Callable[[], Awaitable[str]],
        rec: Recorder,
    ) -> SandboxResult:
        """Run a sandbox; its start retried (a SandboxError: nothing of the agent ran)."""

        async def attempt(_n: int) -> SandboxResult:
            return await self.runtime.run_sandboxed(spec, sink, should_stop=should_stop)

        try:
            return await retried("sandbox_start", attempt, errors=(SandboxError,), **self._retry_kw(rec))
        except StartFailed as exc:
            raise TaskEnded(what_phase, "infrastructure/sandbox_start", f"the sandbox did not start: {exc}") from None

    async def _agent_phase(
        self, ev: EvaluatorHandle, tail: EvaluatorTail, task_dir: Path, workspace: Path, rec: Recorder,
        outcome: TaskOutcome,
    ) -> None:  # fmt: skip
        s = self.task.spec
        budget_s = self._agent_time()
        command = self.options.agent.command
        network = self.network
        self.progress.phase(s.id, "agent", f"{self.options.agent.name}: {budget_s:.0f} s budget")
        if network is not None:
            try:
                await network.open_for(s.ref)
            except NetworkError as exc:
                raise TaskEnded("agent", "infrastructure/gateway_died", f"{s.id}: {exc}") from None
        environment = await self.ctx.agent_env()
        rec.emit(
            "trusted_harness",
            "agent_started",
            {"task": s.ref, "command": list(command), "wall_time_budget_s": budget_s},
        )
        rec.open_channel("agent", s.ref)
        try:
            spec = self._agent_spec(ev, task_dir, workspace, budget_s, environment)
            watch = self._agent_watch(ev, tail, time.monotonic(), budget_s)
            result = await self._sandboxed("agent", spec, _agent_sink(rec, s.ref), watch, rec)
        finally:
            rec.close_channel("agent")
            if network is not None:
                with trio.CancelScope(shield=True):
                    await self._end_agent_network(network)
        outcome.agent = {
            "exit_status": result.exit_status,
            "stopped_for": result.stopped_for,
            "wall_time_s": round(result.wall_time_s, 3),
            "env_steps": tail.agent_env_steps,
            "oom_kills": result.oom_kills,
        }
        if result.dropped_output_bytes:
            rec.emit(
                "trusted_harness", "output_truncated", {"task": s.ref, "dropped_bytes": result.dropped_output_bytes}
            )
        rec.emit("trusted_harness", "agent_finished", {"task": s.ref, **outcome.agent})
        if result.stopped_for == "evaluator_died":
            raise TaskEnded("agent", "infrastructure/evaluator_died",
                            f"the evaluator of {s.id} died while the agent ran:\n{ev.stderr_tail()}")  # fmt: skip
        if network is not None and not network.alive():
            raise TaskEnded("agent", "infrastructure/gateway_died", f"{s.id}: {network.died()}")

    def _agent_spec(
        self, ev: EvaluatorHandle, task_dir: Path, workspace: Path, budget_s: float, environment: agent_env.AgentEnv
    ) -> SandboxSpec:
        """The agent's sandbox: attached to the task's gateway when the run has upstreams."""
        network = self.network
        env = self._env() | (network.sandbox_env() if network is not None else {})
        return SandboxSpec(
            command=self.options.agent.command,
            workspace=workspace,
            workspace_writable=True,
            task_dir=task_dir,
            evaluator_socket=ev.agent_socket,
            env=env,
            limits=self.options.limits,
            wall_time_s=budget_s,
            agent_env=environment,
            network=Network.NONE if network is None else Network.GATEWAY,
            gateway_socket=None if network is None else network.agent_socket,
        )

    def _agent_watch(
        self, ev: EvaluatorHandle, tail: EvaluatorTail, started: float, budget_s: float
    ) -> Callable[[], Awaitable[str]]:
        """The agent phase's should_stop: the env-step budget, the evaluator's and the gateway's deaths."""
        s, network = self.task.spec, self.network

        async def should_stop() -> str:
            await tail.poll()
            self.progress.update(
                s.id,
                f"{time.monotonic() - started:.0f}/{budget_s:.0f} s, "
                f"{tail.agent_env_steps}/{s.budgets.env_steps} env steps"
                + ("" if network is None else f", {network.progress()}"),
            )
            if not ev.alive():
                return "evaluator_died"
            if network is not None and not network.alive():
                return "gateway_died"
            return "env_steps" if tail.agent_env_steps > s.budgets.env_steps else ""

        return should_stop

    @staticmethod
    async def _end_agent_network(network: RunNetwork) -> None:
        """Close the gateway for the official evaluation (or, if it died, keep what it wrote)."""
        if network.alive():
            try:
                await network.close_for()
            except NetworkError:
                await network.abandon()
        else:
            await network.abandon()

    async def _official_phase(
        self, ev: EvaluatorHandle, tail: EvaluatorTail, task_dir: Path, workspace: Path, rec: Recorder,
        outcome: TaskOutcome,
    ) -> None:  # fmt: skip
        s = self.task.spec
        n = self.options.episodes or s.official_episodes
        outcome.episodes = n
        deadline_s = official_deadline_s(self.task, n, self.options.eval_time_s)
        self.progress.phase(s.id, "official evaluation", f"{n} episodes on hidden seeds, {deadline_s:.0f} s deadline")
        rec.emit("trusted_harness", "official_evaluation_started", {"task": s.ref, "mode": s.mode, "episodes": n})
        from ale.client._rpc import AleEnvClient, AleEnvError  # loaded since the run started (LATER_MODULES)

        client = AleEnvClient(ev.harness_target, timeout=60)
        deadline = Deadline(time.monotonic() + deadline_s, deadline_s)
        try:
            if s.mode == "batch":
                result = await self._official_batch(client, workspace, n, outcome, rec, deadline)
            else:
                result = await self._official_interactive(ev, client, task_dir, workspace, n, outcome, rec, deadline)
        except AleEnvError as exc:
            self._check_alive(ev, "official")
            raise TaskEnded("official", "infrastructure/evaluator_error",
                            f"{s.id}: the evaluator refused the official evaluation: {exc}") from None  # fmt: skip
        finally:
            client.close()
        await tail.drain()  # the evaluator's events of the official evaluation come before its end
        if result is None:
            if outcome.agent.get("oom_kills"):
                outcome.reason += (
                    f" (the kernel killed {outcome.agent['oom_kills']} of the agent's processes at the sandbox's "
                    f"memory limit, {self.options.limits.sandbox_memory_bytes // 2**20} MiB)"
                )
            rec.emit("trusted_harness", "official_evaluation_skipped", {"task": s.ref, "reason": outcome.reason})
            return
        outcome.result = eval_result_json(result)
        if result.complete and result.official:
            outcome.status, outcome.ended = "completed", None
        else:
            outcome.reason = outcome.reason or "the official evaluation did not complete"
            if outcome.ended is None:
                outcome.end("official", "evaluation/incomplete")
        rec.emit(
            "trusted_harness",
            "official_evaluation_finished",
            {
                "task": s.ref,
                "complete": result.complete,
                "headline_metric": result.headline_metric,
                "headline_value": result.headline_value,
                "passed_episodes": result.passed_episodes,
                "num_episodes": result.num_episodes,
            },
        )

    async def _official_batch(
        self, client: AleEnvClient, workspace: Path, n: int, outcome: TaskOutcome, rec: Recorder, deadline: Deadline
    ) -> pb.EvalResult | None:
        path = workspace / POLICY_ARTIFACT
        info = await _left_policy(path, "policy artifact", outcome, executable=False)
        if info is None:
            return None
        if info.st_size > MAX_POLICY_BYTES:
            outcome.end("official", "policy/load",
                        f"the policy artifact is {info.st_size} bytes; the limit is {MAX_POLICY_BYTES}")  # fmt: skip
            return None
        policy = await trio.to_thread.run_sync(path.read_bytes)
        outcome.artifact = {
            "path": f"{WORKSPACE_PATH}/{POLICY_ARTIFACT}",
            "bytes": len(policy),
            "sha256": hashlib.sha256(policy).hexdigest(),
        }
        rec.emit("trusted_harness", "policy_artifact", {"task": self.task.spec.ref, **outcome.artifact})
        from ale.client._rpc import AleEnvError

        try:
            batch = await trio.to_thread.run_sync(
                lambda: client.submit_batch_eval(policy, official=True, num_episodes=n)
            )
        except AleEnvError as exc:
            if exc.code.name == "INVALID_ARGUMENT":
                outcome.end("official", "policy/load", f"the evaluator refused the policy artifact: {exc.details}")
                return None
            raise
        while True:
            wait_ms = int(min(1.0, deadline.remaining()) * 1000)
            status = await trio.to_thread.run_sync(
                functools.partial(client.get_batch_eval_status, batch.batch_id, wait_ms=wait_ms)
            )
            self.progress.update(self.task.spec.id, f"{status.episodes_done}/{status.num_episodes} episodes")
            if status.state in (pb.BATCH_STATE_DONE, pb.BATCH_STATE_FAILED):
                break
            if deadline.remaining() <= 0:
                outcome.end(
                    "official", "evaluation/deadline", deadline.missed(status.episodes_done, status.num_episodes)
                )
                break
        if status.state == pb.BATCH_STATE_FAILED:
            outcome.end("official", "evaluation/incomplete", f"the batch evaluation failed: {status.error}")
        # Finalizing stops a batch still running: its missing episodes count as the worst value.
        return await trio.to_thread.run_sync(lambda: client.get_eval_result(batch.batch_id, finalize=True))

    async def _official_interactive(
        self, ev: EvaluatorHandle, client: AleEnvClient, task_dir: Path, workspace: Path, n: int, outcome: TaskOutcome,
        rec: Recorder, deadline: Deadline,
    ) -> pb.EvalResult | None:  # fmt: skip
        ref = self.task.spec.ref
        if await _left_policy(workspace / POLICY_ENTRYPOINT, "policy entrypoint", outcome, executable=True) is None:
            return None
        created = await trio.to_thread.run_sync(lambda: client.create_env(official=True))
        session = await trio.to_thread.run_sync(lambda: client.start_eval_session(created.env_id, num_episodes=n))
        rec.emit("trusted_harness", "eval_session_opened", {"task": ref, "episodes": session.num_episodes})
        env = self._env() | {"ALE_ENV_ID": session.env_id, "ALE_NUM_EPISODES": str(session.num_episodes)}
        rec.open_channel("policy", ref)

        async def should_stop() -> str:
            snapshot = await trio.to_thread.run_sync(lambda: client.get_eval_result(session.session_id))
            self.progress.update(self.task.spec.id, f"{len(snapshot.episodes)}/{n} episodes")
            return "evaluator_died" if not ev.alive() else ""

        spec = SandboxSpec(
            command=(f"{WORKSPACE_PATH}/{POLICY_ENTRYPOINT}",),
            workspace=workspace,
            workspace_writable=False,
            task_dir=task_dir,
            evaluator_socket=ev.agent_socket,
            env=env,
            limits=self.options.limits,
            wall_time_s=deadline.remaining(),
            agent_env=await self.ctx.agent_env(),
        )
        try:
            result = await self._sandboxed(
                "official", spec, _agent_sink(rec, ref, "policy_", "policy"), should_stop, rec
            )
        finally:
            rec.close_channel("policy")
        if result.dropped_output_bytes:
            rec.emit("trusted_harness", "output_truncated", {"task": ref, "dropped_bytes": result.dropped_output_bytes})
        rec.emit(
            "trusted_harness",
            "policy_finished",
            {"task": ref, "exit_status": result.exit_status, "stopped_for": result.stopped_for,
             "oom_kills": result.oom_kills},
        )  # fmt: skip
        self._check_alive(ev, "official")
        final = await trio.to_thread.run_sync(lambda: client.get_eval_result(session.session_id, finalize=True))
        reasons = []
        if result.stopped_for == "wall_time":
            done = sum(not e.aborted for e in final.episodes)
            reasons.append(deadline.missed(done, n))
        aborted = sum(e.aborted for e in final.episodes)
        if aborted:
            reasons.append(f"{aborted} of {n} episodes were aborted")
        outcome.reason = "; ".join(reasons)
        if result.stopped_for == "wall_time" and not final.complete:
            outcome.end("official", "evaluation/deadline")
        return final
