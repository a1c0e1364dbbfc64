"""``ale run``: one Trio program that owns every process and deadline of a run.

For each task, in order: start the evaluator (child process, hidden-seed secret handed over by
descriptor); run the agent in its sandbox with the task's budgets; run the official evaluation
over the harness's own endpoint (interactive: an eval session the agent's policy plays through
its handle; batch: the policy artifact evaluated in-process on hidden seeds); stop the
evaluator. Everything that happens is recorded in the hash-chained trajectory by its producer.
Then score (the pure core, as the verifier will) and write the bundle.

gRPC calls leave the event loop through worker threads; no blocking call runs on the loop.
Ctrl-C or SIGTERM stops the agent and the evaluator, flushes the trajectory marked
``run_interrupted`` and writes no bundle.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import json
import os
import secrets
import shutil
import signal
import stat
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import attrs
import trio

from ale import __version__, catalog
from ale.core import grammar
from ale.core.parse import ParseError, parse_json
from ale.core.results import TASK_RESULTS_SCHEMA
from ale.core.trajectory import MAX_LINE_DEPTH
from ale.env.v1 import env_pb2 as pb
from ale.policy import MAX_POLICY_BYTES
from ale.runner import agent_env
from ale.runner._groups import collapse
from ale.runner.network import GATEWAY_PHASES, NO_NETWORK, NetworkError, RunNetwork, open_network
from ale.runner.options import RunOptions
from ale.runner.progress import Progress
from ale.runner.recorder import Recorder, clip_text, open_recorder
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


_T = TypeVar("_T")

#: What the run needs only later (the official evaluation's connection, the bundle writer): loaded
#: in a worker thread while the run goes on instead of before it starts.
LATER_MODULES = ("ale.client._rpc", "ale.runner.bundle_writer", "ale.judge.phase")


def _preload() -> None:
    for name in LATER_MODULES:
        importlib.import_module(name)


class Background(Generic[_T]):
    """A blocking call run in a worker thread while the run goes on (``run`` in a nursery);
    ``result()`` waits for it and raises what it raised."""

    def __init__(self, call: Callable[[], _T]) -> None:
        self._call, self._done = call, trio.Event()
        self._value: _T | None = None
        self._error: Exception | None = None

    async def run(self) -> None:
        try:
            self._value = await trio.to_thread.run_sync(self._call)
        except Exception as exc:  # handed to whoever waits for the result
            self._error = exc
        finally:
            self._done.set()

    async def result(self) -> _T:
        await self._done.wait()
        if self._error is not None:
            raise self._error
        assert self._value is not None
        return self._value


class RunError(Exception):
    """The run cannot go on; the message says why. No bundle is written."""


class RunInterrupted(Exception):
    """Ctrl-C or SIGTERM: the run stopped early; the trajectory is kept, no bundle."""


@attrs.define
class TaskOutcome:
    """What the harness learned about one task; becomes an entry of task_results.json."""

    task: catalog.Task
    status: str = "not_completed"
    reason: str = ""
    result: dict[str, Any] | None = None
    agent: dict[str, Any] = attrs.Factory(dict)
    artifact: dict[str, Any] | None = None
    episodes: int = 0
    network: dict[str, str] = attrs.Factory(lambda: dict(NO_NETWORK))  # each phase's policy (manifest)
    judgement: Any = None  # the judge's ale.core.verdict.JudgeResult (a judged reproduction task)

    def entry(self) -> dict[str, Any]:
        s = self.task.spec
        return {
            "task": s.ref,
            "genre": s.genre,
            "mode": s.mode,
            "official_episodes": s.official_episodes,
            "status": self.status,
            "reason": self.reason,
            "result": self.result,
        }


@attrs.define
class RunRecord:
    run_id: str
    root: Path  # the run folder; the caller removes it once the bundle is written
    options: RunOptions
    trajectory: Path
    outcomes: list[TaskOutcome]
    attestation: dict[str, Any]
    started: float
    finished: float
    chain_head: str
    events: int
    agent_env: agent_env.AgentEnv  # the agent's Python environment, as the harness assembled it
    agent_environment: dict[str, Any]  # what the sandbox ran with (the runtime's word: manifest agent.environment)


def eval_result_json(r: pb.EvalResult) -> dict[str, Any]:
    """The JSON form of an EvalResult (``ale.core.results.EvalResult``)."""
    return {
        "session_id": r.session_id,
        "run_id": r.run_id,
        "task_id": r.task_id,
        "task_version": r.task_version,
        "task_digest": r.task_digest,
        "mode": r.mode,
        "official": r.official,
        "complete": r.complete,
        "num_episodes": r.num_episodes,
        "episodes": [
            {
                "index": e.index,
                "seed_commitment": e.seed_commitment.hex(),
                "episode_return": e.episode_return,
                "length": e.length,
                "success": e.success,
                "safety_counts": dict(sorted(e.safety_counts.items())),
                "terminated": e.terminated,
                "truncated": e.truncated,
                "aborted": e.aborted,
                "abort_reason": e.abort_reason,
                "headline_value": e.headline_value,
            }
            for e in r.episodes
        ],
        "headline_metric": r.headline_metric,
        "headline_direction": r.headline_direction,
        "headline_value": r.headline_value,
        "safety": [{"name": s.name, "count": s.count, "rate": s.rate} for s in r.safety],
        "passed_episodes": r.passed_episodes,
        "evaluator_version": r.evaluator_version,
    }


def task_results_json(run_id: str, outcomes: list[TaskOutcome]) -> dict[str, Any]:
    return {"schema": TASK_RESULTS_SCHEMA, "run_id": run_id, "tasks": [o.entry() for o in outcomes]}


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


def _check_release_images(release: Any, runtime: Runtime) -> None:
    """A release that names its images is run with those images or not at all (a runtime that runs
    no image, the local one, runs the installed code: the manifest says so, and the verifier)."""
    from ale.core.release import image_mismatches

    ran = runtime.image_digests()
    problems = image_mismatches(release.images, ran) if ran else []
    if problems:
        raise RunError(
            f"the {runtime.name} runtime's images are not release {release.release}'s: {'; '.join(problems)} "
            "(build and lock the images from the release's source: ale images build; ale images lock)"
        )


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


async def _left_policy(path: Path, what: str, outcome: TaskOutcome, *, executable: bool) -> os.stat_result | None:
    """The stat of the policy the agent left, or None with the reason recorded on the outcome."""
    shown = f"{WORKSPACE_PATH}/{path.name}"
    try:
        info = await trio.Path(path).lstat()
    except FileNotFoundError:
        outcome.reason = f"the agent left no {what} at {shown}"
        return None
    if not stat.S_ISREG(info.st_mode) or (executable and not info.st_mode & 0o111):
        outcome.reason = f"{shown} is not {'an executable' if executable else 'a'} regular file"
        return None
    return info


#: The longest path a Unix socket can be bound at (sun_path holds 108 bytes with its NUL).
MAX_SOCKET_PATH = 107


def evaluator_sockets(root: Path, task_id: str) -> tuple[Path, Path]:
    """A task's evaluator endpoints: (the agent's, in a folder the sandbox binds it from; the harness's)."""
    return root / "agent-sockets" / task_id / "evaluator.sock", root / "private" / f"{task_id}.harness.sock"


def gateway_sockets(root: Path) -> tuple[Path, Path]:
    """The run's gateway: (its agent socket, in a folder of its own; its control socket, private)."""
    return root / "gateway" / "agent.sock", root / "private" / "gateway.control.sock"


def _check_socket_paths(root: Path, tasks: tuple[str, ...], gateway: bool) -> None:
    """Refuse a run folder whose sockets could not be bound (a long TMPDIR or --workdir), up front."""
    paths = [p for ref in tasks for p in evaluator_sockets(root, catalog.get_task(ref).spec.id)]
    paths += gateway_sockets(root) if gateway else ()
    for path in paths:
        if len(os.fsencode(path)) > MAX_SOCKET_PATH:
            raise RunError(
                f"the run folder {root} is too deep for Unix sockets: {path} would be {len(os.fsencode(path))} "
                f"bytes, at most {MAX_SOCKET_PATH}; use a shorter TMPDIR or --workdir"
            )


class Harness:
    def __init__(self, options: RunOptions, runtime: Runtime, progress: Progress) -> None:
        self.options = options
        self.runtime = runtime
        self.progress = progress
        self.run_id = f"run-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{secrets.token_hex(4)}"
        self._signalled = False
        self._assembling: Background[agent_env.AgentEnv] | None = None  # the agent's environment, started by run
        self._prestart_next = False  # another task follows the current one
        self._network: RunNetwork | None = None  # the run's LLM gateway, while it runs

    def _env(self, task: catalog.Task) -> dict[str, str]:
        s = task.spec
        return {
            "ALE_EVALUATOR": f"unix:{SOCKET_PATH}",
            "ALE_TASK_ID": s.id,
            "ALE_TASK_VERSION": s.version,
            "ALE_TASK_DIR": TASK_PATH,
            "ALE_WORKSPACE": WORKSPACE_PATH,
            "ALE_MODE": s.mode,
            "ALE_BUDGET_WALL_TIME_S": str(int(self._agent_time(task))),
            "ALE_BUDGET_ENV_STEPS": str(s.budgets.env_steps),
            "ALE_BUDGET_LLM_TOKENS": str(s.budgets.llm_tokens),
            "HOME": WORKSPACE_PATH,
            "PATH": sandbox_path(),
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONUNBUFFERED": "1",
        }

    def _agent_time(self, task: catalog.Task) -> float:
        return self.options.agent_time_s or float(task.spec.budgets.wall_time_s)

    async def run(self) -> RunRecord:
        """Run every task; raise RunInterrupted on Ctrl-C/SIGTERM, RunError when it cannot go on.

        On either, the run folder is removed and the trajectory, marked ``run_interrupted`` or
        ``run_failed``, is kept beside the current folder; no bundle can be written.
        """
        for ref in self.options.tasks:
            catalog.get_task(ref)
        root = await trio.to_thread.run_sync(self._setup)
        attesting = Background(self.runtime.attestation)
        self._assembling = Background(
            functools.partial(agent_env.ensure, self.options.agent.modules, packages=self.options.agent.packages)
        )
        private = root / "private"
        trajectory = private / "events.jsonl"
        started = time.time()
        outcomes: list[TaskOutcome] = []
        finished = False
        try:
            with collapse():
                async with open_recorder(trajectory, tasks=len(self.options.tasks)) as rec:
                    rec.emit("trusted_harness", "run_started", self._run_started())
                    try:
                        with collapse():
                            async with trio.open_nursery() as nursery:
                                nursery.start_soon(self._watch_signals, nursery.cancel_scope)
                                nursery.start_soon(attesting.run)
                                nursery.start_soon(self._assembling.run)
                                nursery.start_soon(trio.to_thread.run_sync, _preload)
                                await self._run_tasks(root, private, rec, outcomes)
                                attestation = await attesting.result()
                                environment = await self._agent_env()
                                nursery.cancel_scope.cancel()
                        if self._signalled:
                            raise KeyboardInterrupt
                    except KeyboardInterrupt:
                        rec.emit(
                            "trusted_harness", "run_interrupted", {"completed_tasks": len(outcomes), "incomplete": True}
                        )
                        raise
                    except RunError as exc:
                        rec.emit("trusted_harness", "run_failed", {"reason": str(exc)})
                        raise
                    rec.emit(
                        "trusted_harness", "run_finished", {"tasks": {o.task.spec.ref: o.status for o in outcomes}}
                    )
                    head, events = rec.head, rec.chain.seq
            finished = True
        except KeyboardInterrupt:
            raise RunInterrupted(await trio.to_thread.run_sync(self._keep_incomplete, trajectory)) from None
        except RunError as exc:
            kept = await trio.to_thread.run_sync(self._keep_incomplete, trajectory)
            raise RunError(f"{exc}\n({kept})") from None
        finally:
            with trio.CancelScope(shield=True):
                target = root / "workspace" if finished else root
                await trio.to_thread.run_sync(lambda: shutil.rmtree(target, ignore_errors=True))
                await trio.to_thread.run_sync(self.runtime.close)
        return RunRecord(
            run_id=self.run_id,
            root=root,
            options=self.options,
            trajectory=trajectory,
            outcomes=outcomes,
            attestation=attestation,
            started=started,
            finished=time.time(),
            chain_head=head,
            events=events,
            agent_env=environment,
            agent_environment=self.runtime.agent_environment(environment),
        )

    async def _run_tasks(self, root: Path, private: Path, rec: Recorder, outcomes: list[TaskOutcome]) -> None:
        """Every task in order, with the run's gateway (if any) up for all of them."""
        tasks = [catalog.get_task(ref) for ref in self.options.tasks]
        llm_tokens = [t.spec.budgets.llm_tokens for t in tasks]
        try:
            sockets = gateway_sockets(root)
            async with open_network(self.run_id, self.options.upstreams, llm_tokens, sockets, private, rec) as network:
                self._network = network
                for i, task in enumerate(tasks):
                    self._prestart_next = i + 1 < len(tasks)
                    outcomes.append(await self._run_task(task, root, private, rec))
        except NetworkError as exc:
            raise RunError(str(exc)) from None
        finally:
            self._network = None

    def _run_started(self) -> dict[str, Any]:
        return {
            "nonce": self.options.nonce,
            "run_id": self.run_id,
            "harness_version": __version__,
            "tasks": [catalog.get_task(t).spec.ref for t in self.options.tasks],
            "release": self.options.release_name,
            "release_sha256": self.options.release_sha256,
            "agent": {
                "name": self.options.agent.name,
                "command": list(self.options.agent.command),
                "packages": list(self.options.agent.packages),
            },
            "llm_upstreams": [{"name": u.name, "api": u.api} for u in self.options.upstreams],
            "runtime": self.runtime.name,
            "sandbox": self.runtime.sandbox,
        }

    def _setup(self) -> Path:
        """Blocking set-up, run in a worker thread: check the runtime (and that it runs the release's
        images, where the release names them), make the run folder."""
        self.runtime.check()
        _check_release_images(self.options.release, self.runtime)
        root = Path(tempfile.mkdtemp(prefix="ale-run-", dir=self.options.workdir))
        try:
            _check_socket_paths(root, self.options.tasks, bool(self.options.upstreams))
        except RunError:
            root.rmdir()
            raise
        root.chmod(0o711)  # the sandbox uid may traverse to its bind sources, not list them
        (root / "private").mkdir(mode=0o700)
        return root

    async def _agent_env(self) -> agent_env.AgentEnv:
        """The agent's Python environment (assembled in the background since the run started)."""
        assert self._assembling is not None
        try:
            return await self._assembling.result()
        except agent_env.AgentEnvError as exc:
            raise RunError(f"cannot assemble the agent's Python environment: {exc}") from None

    def _keep_incomplete(self, trajectory: Path) -> str:
        target = Path.cwd() / f"{self.run_id}.incomplete.jsonl"
        try:
            shutil.copyfile(trajectory, target)
        except OSError:
            return f"the trajectory stays at {trajectory}"
        return f"the incomplete trajectory is at {target}"

    async def _watch_signals(self, scope: trio.CancelScope) -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for _ in signals:
                self._signalled = True
                self.progress.note("interrupted: stopping the agent and the evaluator")
                scope.cancel()
                return

    async def _run_task(self, task: catalog.Task, root: Path, private: Path, rec: Recorder) -> TaskOutcome:
        s = task.spec
        outcome = TaskOutcome(task=task)
        task_dir, workspace = await trio.to_thread.run_sync(_prepare_dirs, root, task, self._network is not None)
        config = json.dumps({"run_id": self.run_id, "secret": secrets.token_hex(32)}).encode()
        agent_socket, harness_socket = evaluator_sockets(root, s.id)
        spec = EvaluatorSpec(
            task_id=s.id,
            run_config=config,
            agent_socket=agent_socket,
            harness_socket=harness_socket,
            events_path=private / f"{s.id}.evaluator.jsonl",
        )
        self.progress.phase(s.id, "evaluator", "starting")
        judging = self.options.judge is not None and s.genre == "reproduction"
        if judging:
            rec.start_tap()  # the judge input is built from the lines written from here on
        rec.emit("trusted_harness", "task_started", {"task": s.ref, "digest": task.digest, "mode": s.mode})
        rec.open_channel("evaluator", s.ref)
        try:
            with collapse():
                async with self.runtime.open_workspace(workspace, self.options.limits):
                    await self._task_body(task, spec, rec, task_dir, workspace, outcome)
        except (EvaluatorStartError, SandboxError, OSError) as exc:
            raise RunError(f"{s.id}: {exc}") from None
        rec.close_channel("evaluator")
        if judging:
            await self._judge(task, rec.take_tap(), rec, private, outcome)
        rec.emit(
            "trusted_harness", "task_finished", {"task": s.ref, "status": outcome.status, "reason": outcome.reason}
        )
        self.progress.phase(s.id, "done" if outcome.status == "completed" else "not completed", outcome.reason)
        return outcome

    async def _task_body(
        self,
        task: catalog.Task,
        spec: EvaluatorSpec,
        rec: Recorder,
        task_dir: Path,
        workspace: Path,
        outcome: TaskOutcome,
    ) -> None:
        async with self.runtime.open_evaluator(spec) as ev, trio.open_nursery() as nursery:
            rec.emit("trusted_harness", "evaluator_started", {"task": task.spec.ref})
            tail = EvaluatorTail(spec.events_path, rec, task.spec.ref)
            nursery.start_soon(tail.run)
            if self._prestart_next:  # the next task's evaluator loads its code while this one runs
                await trio.to_thread.run_sync(self.runtime.prestart_evaluator)
            await self._agent_phase(task, ev, tail, task_dir, workspace, rec, outcome)
            self._check_alive(ev, task)
            if task.spec.genre == "reproduction":
                from ale.judge.phase import record_snapshot  # loaded since the run started (LATER_MODULES)

                await record_snapshot(task, workspace, rec)
            await self._official_phase(task, ev, tail, task_dir, workspace, rec, outcome)
            self._check_alive(ev, task)
            nursery.cancel_scope.cancel()
        await tail.drain()  # what the evaluator wrote until it stopped

    async def _judge(
        self, task: catalog.Task, lines: list[bytes], rec: Recorder, private: Path, outcome: TaskOutcome
    ) -> None:
        """The faithfulness judge on a completed reproduction task (ale.judge.phase)."""
        from ale.judge.phase import judge_task

        if outcome.status != "completed" or self.options.judge is None:
            return
        self.progress.phase(task.spec.id, "judge", self.options.judge.model)
        outcome.judgement = await judge_task(task, lines, rec, self.options.judge, run_id=self.run_id, folder=private)

    @staticmethod
    def _check_alive(ev: EvaluatorHandle, task: catalog.Task) -> None:
        if not ev.alive():
            raise RunError(f"the evaluator of {task.spec.id} died mid-run:\n{ev.stderr_tail()}")

    async def _agent_phase(
        self,
        task: catalog.Task,
        ev: EvaluatorHandle,
        tail: EvaluatorTail,
        task_dir: Path,
        workspace: Path,
        rec: Recorder,
        outcome: TaskOutcome,
    ) -> None:
        s = task.spec
        budget_s = self._agent_time(task)
        command = self.options.agent.command
        network = self._network
        self.progress.phase(s.id, "agent", f"{self.options.agent.name}: {budget_s:.0f} s budget")
        if network is not None:
            await network.open_for(s.ref)
            outcome.network = dict(GATEWAY_PHASES)
        rec.emit(
            "trusted_harness",
            "agent_started",
            {"task": s.ref, "command": list(command), "wall_time_budget_s": budget_s},
        )
        rec.open_channel("agent", s.ref)
        result = await self.runtime.run_sandboxed(
            self._agent_spec(task, ev, task_dir, workspace, budget_s, await self._agent_env()),
            _agent_sink(rec, s.ref),
            should_stop=self._agent_watch(task, ev, tail, time.monotonic(), budget_s),
        )
        rec.close_channel("agent")
        if network is not None:
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
            raise RunError(f"the evaluator of {s.id} died while the agent ran:\n{ev.stderr_tail()}")
        if network is not None and not network.alive():
            raise RunError(f"{s.id}: {network.died()}")

    def _agent_spec(
        self,
        task: catalog.Task,
        ev: EvaluatorHandle,
        task_dir: Path,
        workspace: Path,
        budget_s: float,
        environment: agent_env.AgentEnv,
    ) -> SandboxSpec:
        """The agent's sandbox: attached to the gateway when the run has one."""
        network = self._network
        env = self._env(task) | (network.sandbox_env() if network is not None else {})
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
        self, task: catalog.Task, ev: EvaluatorHandle, tail: EvaluatorTail, started: float, budget_s: float
    ) -> Callable[[], Awaitable[str]]:
        """The agent phase's should_stop: the env-step budget, the evaluator's and the gateway's deaths."""
        s, network = task.spec, self._network

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
            await network.close_for()
        else:
            await network.abandon()

    async def _official_phase(
        self,
        task: catalog.Task,
        ev: EvaluatorHandle,
        tail: EvaluatorTail,
        task_dir: Path,
        workspace: Path,
        rec: Recorder,
        outcome: TaskOutcome,
    ) -> None:
        s = task.spec
        n = self.options.episodes or s.official_episodes
        outcome.episodes = n
        deadline_s = official_deadline_s(task, n, self.options.eval_time_s)
        self.progress.phase(s.id, "official evaluation", f"{n} episodes on hidden seeds, {deadline_s:.0f} s deadline")
        rec.emit("trusted_harness", "official_evaluation_started", {"task": s.ref, "mode": s.mode, "episodes": n})
        from ale.client._rpc import AleEnvClient, AleEnvError  # loaded since the run started (LATER_MODULES)

        client = AleEnvClient(ev.harness_target, timeout=60)
        deadline = Deadline(time.monotonic() + deadline_s, deadline_s)
        try:
            if s.mode == "batch":
                result = await self._official_batch(task, client, workspace, n, outcome, rec, deadline)
            else:
                result = await self._official_interactive(
                    task, ev, client, task_dir, workspace, n, outcome, rec, deadline
                )
        except AleEnvError as exc:
            self._check_alive(ev, task)
            raise RunError(f"{s.id}: the evaluator refused the official evaluation: {exc}") from None
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
            outcome.status = "completed"
        else:
            outcome.reason = outcome.reason or "the official evaluation did not complete"
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
        self,
        task: catalog.Task,
        client: AleEnvClient,
        workspace: Path,
        n: int,
        outcome: TaskOutcome,
        rec: Recorder,
        deadline: Deadline,
    ) -> pb.EvalResult | None:
        path = workspace / POLICY_ARTIFACT
        info = await _left_policy(path, "policy artifact", outcome, executable=False)
        if info is None:
            return None
        if info.st_size > MAX_POLICY_BYTES:
            outcome.reason = f"the policy artifact is {info.st_size} bytes; the limit is {MAX_POLICY_BYTES}"
            return None
        policy = await trio.to_thread.run_sync(path.read_bytes)
        outcome.artifact = {
            "path": f"{WORKSPACE_PATH}/{POLICY_ARTIFACT}",
            "bytes": len(policy),
            "sha256": hashlib.sha256(policy).hexdigest(),
        }
        rec.emit("trusted_harness", "policy_artifact", {"task": task.spec.ref, **outcome.artifact})
        from ale.client._rpc import AleEnvError

        try:
            batch = await trio.to_thread.run_sync(
                lambda: client.submit_batch_eval(policy, official=True, num_episodes=n)
            )
        except AleEnvError as exc:
            if exc.code.name == "INVALID_ARGUMENT":
                outcome.reason = f"the evaluator refused the policy artifact: {exc.details}"
                return None
            raise
        while True:
            wait_ms = int(min(1.0, deadline.remaining()) * 1000)
            status = await trio.to_thread.run_sync(
                functools.partial(client.get_batch_eval_status, batch.batch_id, wait_ms=wait_ms)
            )
            self.progress.update(task.spec.id, f"{status.episodes_done}/{status.num_episodes} episodes")
            if status.state in (pb.BATCH_STATE_DONE, pb.BATCH_STATE_FAILED):
                break
            if deadline.remaining() <= 0:
                outcome.reason = deadline.missed(status.episodes_done, status.num_episodes)
                break
        if status.state == pb.BATCH_STATE_FAILED:
            outcome.reason = f"the batch evaluation failed: {status.error}"
        # Finalizing stops a batch still running: its missing episodes count as the worst value.
        return await trio.to_thread.run_sync(lambda: client.get_eval_result(batch.batch_id, finalize=True))

    async def _official_interactive(
        self,
        task: catalog.Task,
        ev: EvaluatorHandle,
        client: AleEnvClient,
        task_dir: Path,
        workspace: Path,
        n: int,
        outcome: TaskOutcome,
        rec: Recorder,
        deadline: Deadline,
    ) -> pb.EvalResult | None:
        if await _left_policy(workspace / POLICY_ENTRYPOINT, "policy entrypoint", outcome, executable=True) is None:
            return None
        created = await trio.to_thread.run_sync(lambda: client.create_env(official=True))
        session = await trio.to_thread.run_sync(lambda: client.start_eval_session(created.env_id, num_episodes=n))
        rec.emit("trusted_harness", "eval_session_opened", {"task": task.spec.ref, "episodes": session.num_episodes})
        env = self._env(task) | {"ALE_ENV_ID": session.env_id, "ALE_NUM_EPISODES": str(session.num_episodes)}
        rec.open_channel("policy", task.spec.ref)

        async def should_stop() -> str:
            snapshot = await trio.to_thread.run_sync(lambda: client.get_eval_result(session.session_id))
            self.progress.update(task.spec.id, f"{len(snapshot.episodes)}/{n} episodes")
            return "evaluator_died" if not ev.alive() else ""

        result = await self.runtime.run_sandboxed(
            SandboxSpec(
                command=(f"{WORKSPACE_PATH}/{POLICY_ENTRYPOINT}",),
                workspace=workspace,
                workspace_writable=False,
                task_dir=task_dir,
                evaluator_socket=ev.agent_socket,
                env=env,
                limits=self.options.limits,
                wall_time_s=deadline.remaining(),
                agent_env=await self._agent_env(),
            ),
            _agent_sink(rec, task.spec.ref, "policy_", "policy"),
            should_stop=should_stop,
        )
        rec.close_channel("policy")
        if result.dropped_output_bytes:
            rec.emit(
                "trusted_harness",
                "output_truncated",
                {"task": task.spec.ref, "dropped_bytes": result.dropped_output_bytes},
            )
        rec.emit(
            "trusted_harness",
            "policy_finished",
            {
                "task": task.spec.ref,
                "exit_status": result.exit_status,
                "stopped_for": result.stopped_for,
                "oom_kills": result.oom_kills,
            },
        )
        self._check_alive(ev, task)
        final = await trio.to_thread.run_sync(lambda: client.get_eval_result(session.session_id, finalize=True))
        reasons = []
        if result.stopped_for == "wall_time":
            done = sum(not e.aborted for e in final.episodes)
            reasons.append(deadline.missed(done, n))
        aborted = sum(e.aborted for e in final.episodes)
        if aborted:
            reasons.append(f"{aborted} of {n} episodes were aborted")
        outcome.reason = "; ".join(reasons)
        return final


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
