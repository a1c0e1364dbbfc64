"""``ale run``: one Trio program that owns every process and deadline of a run.

The run's tasks run side by side, at most ``--jobs`` at once and only as many as the machine's
CPUs and memory hold (:mod:`ale.runner.schedule`); each records into a spool of its own
(:mod:`ale.runner.task_run`, :mod:`ale.runner.spool`), with its own evaluator, sandboxes and LLM
gateway. The run's trajectory is one hash chain: each task's window is appended to it in task
order once every task before it is in (:meth:`~ale.runner.recorder.Recorder.place`), then the
task's judge (a reproduction task of a run with ``--judge-model``) and its ``task_finished``. So the
trajectory has exactly the shape of a run whose tasks ran one after another. Then score (the pure
core, as the verifier will) and write the bundle.

The run keeps a state folder (:mod:`ale.runner.state`): each finished task's spool and record,
durably. ``ale run --resume RUN`` continues an interrupted or failed run, running again only what
did not finish (and what ended for the infrastructure).

gRPC calls leave the event loop through worker threads; no blocking call runs on the loop.
Ctrl-C or SIGTERM stops the agents and the evaluators, flushes the trajectory marked
``run_interrupted`` and writes no bundle.
"""

from __future__ import annotations

import functools
import importlib
import secrets
import shutil
import signal
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Generic, TypeVar

import attrs
import trio
import trio.lowlevel

from ale import __version__, catalog
from ale.core import grammar
from ale.core.results import is_infrastructure
from ale.runner import agent_env, lifeline, resume, schedule, spool
from ale.runner._groups import collapse
from ale.runner.options import RunOptions
from ale.runner.outcome import TaskOutcome as TaskOutcome
from ale.runner.outcome import eval_result_json as eval_result_json
from ale.runner.outcome import task_results_json as task_results_json
from ale.runner.progress import Progress
from ale.runner.recorder import Recorder, open_recorder
from ale.runner.runtime import Runtime
from ale.runner.state import HEARTBEAT_S, Finished, RunState, StateError, folder_for
from ale.runner.state import create as create_state
from ale.runner.state import load as load_state
from ale.runner.tails import EvaluatorTail as EvaluatorTail
from ale.runner.task_run import AGENT_EVENT_KINDS as AGENT_EVENT_KINDS
from ale.runner.task_run import OFFICIAL_BASE_S as OFFICIAL_BASE_S
from ale.runner.task_run import OFFICIAL_PER_EPISODE_S as OFFICIAL_PER_EPISODE_S
from ale.runner.task_run import Deadline as Deadline
from ale.runner.task_run import RunContext, TaskRun, check_socket_paths
from ale.runner.task_run import RunError as RunError
from ale.runner.task_run import _agent_sink as _agent_sink
from ale.runner.task_run import _channel_event as _channel_event
from ale.runner.task_run import official_deadline_s as official_deadline_s

_T = TypeVar("_T")

#: What the run needs only later (the official evaluation's connection, the bundle writer): loaded
#: in a worker thread while the run goes on instead of before it starts.
LATER_MODULES = ("ale.client._rpc", "ale.runner.bundle_writer", "ale.judge.phase")
#: placing a spool yields to the other tasks every so many events
PLACE_BATCH = 2000


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


class RunInterrupted(Exception):
    """Ctrl-C or SIGTERM: the run stopped early; the trajectory is kept, no bundle."""


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
    state: RunState | None = None  # the run's state folder (the caller removes it with state.bundle_written)
    active_s: float | None = None  # the run's runtime: its active spans (RunState.active_s), not finished - started


@attrs.define
class Slot:
    """One task of the run on its way: started, finished (its spool and record durable), placed."""

    task: catalog.Task
    done: trio.Event = attrs.Factory(trio.Event)
    reused: Finished | None = None  # finished in the run this one resumes
    started: bool = False
    outcome: TaskOutcome | None = None  # once finished


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


class Harness:
    def __init__(self, options: RunOptions, runtime: Runtime, progress: Progress) -> None:
        self.options = options
        self.runtime = runtime
        self.progress = progress
        self.run_id = options.resume or f"run-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{secrets.token_hex(4)}"
        self._signalled = False
        self._failure: RunError | None = None
        self._assembling: Background[agent_env.AgentEnv] | None = None  # the agent's environment, started by run
        self._slots: list[Slot] = []
        self.state: RunState | None = None

    async def run(self) -> RunRecord:
        """Run every task; raise RunInterrupted on Ctrl-C/SIGTERM, RunError when it cannot go on.

        On either, the run folder is removed and the trajectory, marked ``run_interrupted`` or
        ``run_failed``, is kept beside the current folder; no bundle can be written. The state
        folder stays (under ``state_parent``), for ``ale run --resume``.
        """
        tasks = [catalog.get_task(ref) for ref in self.options.tasks]
        root = await trio.to_thread.run_sync(self._setup, tasks)
        attesting = Background(self.runtime.attestation)
        self._assembling = Background(
            functools.partial(agent_env.ensure, self.options.agent.modules, packages=self.options.agent.packages)
        )
        private = root / "private"
        trajectory = private / "events.jsonl"
        assert self.state is not None
        outcomes: list[TaskOutcome] = []
        finished = False
        try:
            with collapse():
                async with open_recorder(trajectory, tasks=len(tasks)) as rec:
                    rec.emit("trusted_harness", "run_started", self._run_started())
                    try:
                        with collapse():
                            async with trio.open_nursery() as nursery:
                                nursery.start_soon(self._watch_signals, nursery.cancel_scope)
                                nursery.start_soon(self._heartbeat)
                                nursery.start_soon(attesting.run)
                                nursery.start_soon(self._assembling.run)
                                nursery.start_soon(trio.to_thread.run_sync, _preload)
                                await self._run_tasks(root, private, rec, outcomes, nursery.cancel_scope)
                                attestation = await attesting.result()
                                environment = await self._agent_env()
                                nursery.cancel_scope.cancel()
                        if self._signalled:
                            raise KeyboardInterrupt
                        if self._failure is not None:
                            raise self._failure
                        await trio.to_thread.run_sync(self._keep_attested, attestation, environment)
                        self._fail_for_infrastructure(outcomes)
                    except KeyboardInterrupt:
                        with trio.CancelScope(shield=True):
                            await self._place_the_rest(rec, outcomes, "the run was interrupted")
                        done = sum(1 for o in outcomes if o.ended is None or o.ended.category != "cancelled")
                        data = {"completed_tasks": done, "incomplete": True}
                        rec.emit("trusted_harness", "run_interrupted", data)
                        raise
                    except RunError as exc:
                        with trio.CancelScope(shield=True):
                            await self._place_the_rest(rec, outcomes, "the run failed")
                        rec.emit("trusted_harness", "run_failed", {"reason": str(exc)})
                        raise
                    rec.emit(
                        "trusted_harness", "run_finished", {"tasks": {o.task.spec.ref: o.status for o in outcomes}}
                    )
                    head, events = rec.head, rec.chain.seq
            finished = True
        except KeyboardInterrupt:
            kept = await trio.to_thread.run_sync(self._keep_incomplete, trajectory)
            raise RunInterrupted(f"{kept}{self._resume_hint()}") from None
        except RunError as exc:
            kept = await trio.to_thread.run_sync(self._keep_incomplete, trajectory)
            raise RunError(f"{exc}\n({kept}){self._resume_hint()}") from None
        finally:
            with trio.CancelScope(shield=True):
                stopped = time.time()
                await trio.to_thread.run_sync(self._beat, stopped)  # where this segment stopped
                target = root / "workspace" if finished else root
                await trio.to_thread.run_sync(lambda: shutil.rmtree(target, ignore_errors=True))
                await trio.to_thread.run_sync(self.runtime.close)
                if not finished or self.options.state_parent is None:
                    self.state.release()  # (a finished run's lets go once its bundle is written)
        return RunRecord(
            run_id=self.run_id,
            root=root,
            options=self.options,
            trajectory=trajectory,
            outcomes=outcomes,
            attestation=attestation,
            started=self.state.started,
            finished=stopped,
            active_s=self.state.active_s(stopped),
            chain_head=head,
            events=events,
            agent_env=environment,
            agent_environment=self.runtime.agent_environment(environment),
            state=self.state if self.options.state_parent is not None else None,
        )

    def _resume_hint(self) -> str:
        if self.options.state_parent is None or self.state is None:
            return ""
        done = sum(1 for s in self._slots if s.reused is not None or s.outcome is not None)
        return (
            f"\n{done} of {len(self._slots)} tasks finished and are kept in {self.state.folder}; continue the run "
            f"with: ale run --resume {self.run_id} --out {self.options.state_parent}"
        )

    # -- the tasks -----------------------------------------------------------------------------------

    async def _run_tasks(
        self, root: Path, private: Path, rec: Recorder, outcomes: list[TaskOutcome], scope: trio.CancelScope
    ) -> None:
        """Start the tasks as the admission rule lets them, and place each in turn once it finished."""
        offer, demand = schedule.machine(), schedule.Demand.of(self.options.limits)
        admission = schedule.Admission(self.options.jobs, offer)
        to_run = sum(1 for s in self._slots if s.reused is None)
        at_once = schedule.concurrency(self.options.jobs, to_run, demand, offer)

        def waiting() -> int:  # tasks that wait to start, as many as may start at once
            return min(at_once, sum(1 for s in self._slots if not s.started and s.reused is None))

        ctx = RunContext(
            options=self.options, runtime=self.runtime, progress=self.progress, run_id=self.run_id, root=root,
            private=private, agent_env=self._agent_env, waiting=waiting,
        )  # fmt: skip
        if to_run > 1 and self.options.jobs > 1:
            self.progress.note(
                f"running up to {at_once} of {to_run} tasks at once (--jobs {self.options.jobs}; this machine offers "
                f"{offer.describe()}, each task's sandbox may take {demand.cpus:g} CPUs and "
                f"{demand.memory_bytes / schedule.GIB:.1f} GiB)"
            )
        if at_once > 1:  # the first tasks' evaluators load their code while the harness starts them
            await trio.to_thread.run_sync(self.runtime.prestart_evaluator, at_once)
        async with trio.open_nursery() as runners:
            runners.start_soon(self._launch, ctx, admission, demand, runners, scope)
            for slot in self._slots:
                await slot.done.wait()
                if slot.outcome is None and slot.reused is None:
                    return  # it failed the run (self._failure): the run's scope is cancelled
                outcomes.append(await self._place(slot, rec, private))

    async def _launch(
        self, ctx: RunContext, admission: schedule.Admission, demand: schedule.Demand, nursery: trio.Nursery,
        scope: trio.CancelScope,
    ) -> None:  # fmt: skip
        for slot in self._slots:
            if slot.reused is not None:
                continue
            await admission.enter(demand)
            slot.started = True
            nursery.start_soon(self._run_slot, ctx, slot, admission, demand, scope)

    async def _run_slot(
        self, ctx: RunContext, slot: Slot, admission: schedule.Admission, demand: schedule.Demand,
        scope: trio.CancelScope,
    ) -> None:  # fmt: skip
        assert self.state is not None
        task, state = slot.task, self.state
        try:
            try:
                spool_path = await trio.to_thread.run_sync(state.begin_task, task.spec.id)
            except OSError as exc:
                raise RunError(f"cannot write the run's state folder {state.folder}: {exc}") from None
            began = time.time()
            outcome, head = await TaskRun(ctx, task, spool_path).run()
            span = (began, time.time())
            try:
                await trio.to_thread.run_sync(state.finish_task, task, outcome, head, span)
            except OSError as exc:
                raise RunError(f"cannot keep {task.spec.id}'s spool in the run's state folder: {exc}") from None
            slot.outcome = outcome
            ended = "" if outcome.ended is None else f"{outcome.ended.phase}: {outcome.ended.category}: "
            done = "done" if outcome.status == "completed" else "not completed"
            self.progress.phase(task.spec.id, done, ended + outcome.reason)
        except RunError as exc:
            if self._failure is None:
                self._failure = exc
            scope.cancel()
        finally:
            admission.leave(demand)
            slot.done.set()

    async def _spool_lines(self, slot: Slot, *, complete: bool = True) -> spool.Spool:
        assert self.state is not None
        if slot.reused is not None:
            return slot.reused.spool
        task, path = slot.task, self.state.task_folder(slot.task.spec.id)
        name = "spool.jsonl" if complete else "spool.partial"

        def read() -> spool.Spool:
            raw = (path / name).read_bytes()
            return spool.check(raw, run_id=self.run_id, task_ref=task.spec.ref, digest=task.digest, complete=complete)

        return await trio.to_thread.run_sync(read)

    async def _place(self, slot: Slot, rec: Recorder, private: Path) -> TaskOutcome:
        """Append the task's window to the run's chain, judge it, record its end."""
        s = slot.task.spec
        outcome = slot.reused.outcome if slot.reused is not None else slot.outcome
        assert outcome is not None
        try:
            checked = await self._spool_lines(slot)
        except (OSError, spool.SpoolError) as exc:  # our own spool, just written: a defect, not the agent's
            raise RunError(f"{s.id}: its spool cannot be placed: {exc}") from None
        judging = self.options.judge is not None and s.genre == "reproduction"
        if judging:
            rec.start_tap()  # the judge input is built from the lines written from here on
        await self._place_lines(rec, checked.lines)
        if judging and outcome.status == "completed":
            await self._judge(slot.task, rec.take_tap(), rec, private, outcome)
        elif judging:
            rec.take_tap()
        rec.emit("trusted_harness", "task_finished", outcome.finished_data())
        return outcome

    @staticmethod
    async def _place_lines(rec: Recorder, lines: list[bytes]) -> None:
        for start in range(0, len(lines), PLACE_BATCH):
            rec.place(lines[start : start + PLACE_BATCH])
            await trio.lowlevel.checkpoint()  # the other tasks' supervision goes on

    async def _place_the_rest(self, rec: Recorder, outcomes: list[TaskOutcome], why: str) -> None:
        """An interrupted or failed run: the windows of the tasks that follow the placed ones, in
        order, as far as they got: a finished task's whole (not judged), a task that was running
        its partial window ended early as ``cancelled``; up to the first task that did not start."""
        for slot in self._slots[len(outcomes) :]:
            if rec.grammar.phase != grammar.RUN:
                return  # a window being placed or judged when it stopped: the stream ends with it
            outcome = slot.reused.outcome if slot.reused is not None else slot.outcome
            try:
                checked = await self._spool_lines(slot, complete=outcome is not None)
            except (OSError, spool.SpoolError):
                return
            await self._place_lines(rec, checked.lines)
            if outcome is None:
                outcome = TaskOutcome(task=slot.task, reason=why)
                outcome.end(spool.end_phase(rec.grammar.phase), "cancelled")
                ended = {"phase": outcome.ended.phase, "category": outcome.ended.category} if outcome.ended else {}
                rec.emit("trusted_harness", "task_ended_early", {"task": slot.task.spec.ref, **ended, "reason": why})
            rec.emit("trusted_harness", "task_finished", outcome.finished_data())
            outcomes.append(outcome)

    async def _judge(
        self, task: catalog.Task, lines: list[bytes], rec: Recorder, private: Path, outcome: TaskOutcome
    ) -> None:
        """The faithfulness judge on a completed reproduction task (ale.judge.phase)."""
        from ale.judge.phase import judge_task

        if self.options.judge is None:
            return
        self.progress.phase(task.spec.id, "judge", self.options.judge.model)
        outcome.judgement = await judge_task(task, lines, rec, self.options.judge, run_id=self.run_id, folder=private)

    def _fail_for_infrastructure(self, outcomes: list[TaskOutcome]) -> None:
        """A task that ended for the infrastructure was given no fair run: the run fails (its
        finished tasks are kept, and ``--resume`` runs the others again)."""
        failed = [o for o in outcomes if o.ended is not None and is_infrastructure(o.ended.category)]
        if failed:
            listed = "; ".join(f"{o.task.spec.id}: {o.ended.category if o.ended else ''}: {o.reason}" for o in failed)
            raise RunError(
                f"{len(failed)} of {len(outcomes)} tasks ended for the infrastructure, not the agent: {listed}"
            )

    # -- setting up ------------------------------------------------------------------------------------

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

    def _setup(self, tasks: list[catalog.Task]) -> Path:
        """Blocking set-up, run in a worker thread: check the runtime (and that it runs the release's
        images, where the release names them), make the run folder, open the run's state. First,
        what a killed harness left running goes (:func:`ale.runner.lifeline.sweep`): a resumed run
        continues with none of its earlier processes."""
        swept = lifeline.sweep()
        if swept.killed or swept.folders:
            self.progress.note(
                f"removed what a killed harness left: {len(swept.killed)} processes, {len(swept.folders)} run folders"
            )
        self.runtime.check()
        _check_release_images(self.options.release, self.runtime)
        root = Path(tempfile.mkdtemp(prefix="ale-run-", dir=self.options.workdir))
        lifeline.ledger().folder(root)  # a sweep removes it should this harness be killed
        try:
            check_socket_paths(root, self.options.tasks, bool(self.options.upstreams))
            root.chmod(0o711)  # the sandbox uid may traverse to its bind sources, not list them
            (root / "private").mkdir(mode=0o700)
            self._open_state(root, tasks)
        except (RunError, OSError) as exc:
            shutil.rmtree(root, ignore_errors=True)
            if isinstance(exc, RunError):
                raise
            raise RunError(f"cannot set up the run: {exc}") from None
        return root

    def _open_state(self, root: Path, tasks: list[catalog.Task]) -> None:
        parent = self.options.state_parent or root / "private"
        folder = folder_for(parent, self.run_id)
        document = resume.options_document(self.options, self.runtime.name)
        if self.options.resume is None:
            self.state = create_state(folder, self.run_id, document)
            self.state.hold()
            self._slots = [Slot(task) for task in tasks]
            return
        try:
            self.state = load_state(folder)
            self.state.hold()  # (before anything of it is trusted: a live harness may still write it)
        except StateError as exc:
            raise RunError(f"cannot resume {self.run_id}: {exc}") from None
        differ = resume.differences(self.state.run["options"], document)
        if differ:
            raise RunError(f"cannot resume {self.run_id}: this run's {', '.join(differ)} differ from the run's")
        for task in tasks:
            found = self.state.finished(task)
            slot = Slot(task)
            if isinstance(found, Finished):
                slot.reused = found
                slot.done.set()
                self.progress.phase(task.spec.id, "finished before", "kept from the run's state")
            elif found != "not finished":
                self.progress.note(f"{task.spec.id}: runs again: its state is not trusted: {found}")
            self._slots.append(slot)
        self.state.begin_segment(time.time())  # the run's time while it was stopped is not its runtime

    def _keep_attested(self, attestation: dict[str, Any], environment: agent_env.AgentEnv) -> None:
        """The state keeps what the run's tasks ran on; a resumed run's must be the same."""
        assert self.state is not None
        kept = self.state.run.get("attestation"), self.state.run.get("agent_environment")
        now = attestation, environment.digest
        if kept == (None, None):
            self.state.note(attestation=attestation, agent_environment=environment.digest)
        elif kept != now:
            what = "runtime's attestation" if kept[0] != now[0] else "agent's environment"
            raise RunError(
                f"the {what} is not what the run's earlier tasks ran on (the installed code, the machine's "
                "isolation or the agent's packages changed since): the run cannot be continued; start a new one"
            )

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

    async def _heartbeat(self) -> None:
        """Keep this segment's end in the state folder (a SIGKILLed run's runtime ends at its last)."""
        while True:
            await trio.sleep(HEARTBEAT_S)
            await trio.to_thread.run_sync(self._beat, time.time())

    def _beat(self, now: float) -> None:
        if self.state is not None:
            try:
                self.state.heartbeat(now)
            except OSError as exc:  # the run goes on: only its recorded runtime may come out short
                self.progress.note(f"cannot keep the run's time in its state folder: {exc}")

    async def _watch_signals(self, scope: trio.CancelScope) -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for _ in signals:
                self._signalled = True
                self.progress.note("interrupted: stopping the agents and the evaluators")
                scope.cancel()
                return
