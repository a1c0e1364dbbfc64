"""The AleEnv service: eight unary RPCs over shared evaluator state, one servicer per endpoint.

Both endpoints run the same code; the endpoint's role decides what it may do.
The harness endpoint may do everything. The agent endpoint may not create
official environments, start eval sessions, read eval results or submit
official batches (PERMISSION_DENIED), and may touch a harness-owned
environment only while it is an official environment inside an open eval
session, and then only GetSpec, Reset and Step (the policy's handle).

The task's mode decides the official path: an eval session for an interactive
task, an official batch for a batch task. The harness's first official call
ends the agent's phase: the agent's batch jobs are stopped and it may queue no
more. Each endpoint has its own batch queue and worker, so the agent can never
hold up the official evaluation, and the agent's environment steps (its own
Steps and its batch episodes) count against the task's env-step budget.
"""

from __future__ import annotations

import functools
import logging
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import attrs
import grpc
from google.protobuf.message import Message

from ale.catalog import Task
from ale.env.v1 import env_pb2 as pb
from ale.policy import load_policy
from ale.protocol import (
    SERVICE_NAME,
    check_request,
    decode_tensor,
    echo,
    encode_space,
    encode_tensor,
    parse_request,
)
from ale_evaluator import __version__
from ale_evaluator.batch import BatchJob, check_policy_fits
from ale_evaluator.budget import StepBudget
from ale_evaluator.domains import DOMAINS, Domain
from ale_evaluator.envs import EnvGroup, EvalSession
from ale_evaluator.episodes import EpisodeRecord
from ale_evaluator.errors import RpcError, denied, exhausted, invalid, not_found, precondition, refusal
from ale_evaluator.events import SUMMARISED, EventLog
from ale_evaluator.parallel import StepPool, default_step_threads, init_helper_thread
from ale_evaluator.seeds import RunConfig

log = logging.getLogger(__name__)

AGENT, HARNESS = "agent", "harness"
MAX_WAIT_MS = 10_000
#: ``env_step_budget`` default: the task's ``budgets.env_steps``.
TASK_BUDGET = -1
#: Why the agent's batch jobs stopped when the harness began the official evaluation.
AGENT_PHASE_OVER = "cancelled: the agent phase is over (the official evaluation started)"
BATCH_STATES = {
    pb.BATCH_STATE_PENDING: "pending",
    pb.BATCH_STATE_RUNNING: "running",
    pb.BATCH_STATE_DONE: "done",
    pb.BATCH_STATE_FAILED: "failed",
}
#: How often a running batch writes a ``batch_progress`` event (and one when it ends).
PROGRESS_INTERVAL_S = 1.0


@attrs.frozen
class Limits:
    max_envs: int = 64  # live env_ids; the least recently used agent env is closed past this
    max_copies: int = 256  # K per CreateEnv
    max_total_copies: int = 2048
    max_episodes: int = 10_000  # per eval session or batch
    max_pending_batches: int = 4  # per endpoint: the agent's queue and the harness's are separate
    max_finished_batches: int = 32  # finished agent batches kept for GetBatchEvalStatus; the oldest go first
    max_policy_bytes: int = 8 * 1024 * 1024


def _domain_for(task: Task) -> Domain:
    domain = DOMAINS.get(task.spec.domain)
    if domain is None:
        raise ValueError(f"task {task.spec.id}: unknown domain {task.spec.domain!r}")
    if domain.headline_metric != task.spec.headline.metric or domain.safety_metrics != task.spec.safety_metrics:
        raise ValueError(f"task {task.spec.id}: its metrics do not match domain {domain.name!r}")
    return domain


class EvaluatorState:
    """What both endpoints share: environments, sessions, batches, the run's secret."""

    def __init__(
        self,
        task: Task,
        config: RunConfig,
        *,
        events: EventLog | None = None,
        limits: Limits | None = None,
        batch_cpus: frozenset[int] | None = None,
        step_threads: int | None = None,
        env_step_budget: int | None = TASK_BUDGET,
    ) -> None:
        """``batch_cpus``: the CPUs the batch threads and the step helpers may use (when the RPC path
        keeps to one, they must not: batches are long computations that should have every core, and
        a helper on the serving thread's CPU would only take turns with it). ``step_threads``: how
        many threads step a MuJoCo vector env's copies (the serving thread included; 1: it alone;
        default: one per CPU in ``batch_cpus``, see ``ale_evaluator.parallel``). ``env_step_budget``:
        the agent's environment steps (default: the task's budget; None: counted, never refused)."""
        self.task = task
        self.domain = _domain_for(task)
        self.config = config
        self.events = events or EventLog(None)
        self.limits = limits or Limits()
        self.lock = threading.Lock()
        self.groups: OrderedDict[str, EnvGroup] = OrderedDict()
        self.sessions: dict[str, EvalSession] = {}
        self.batches: dict[str, BatchJob] = {}
        self.closed_ids: dict[str, str] = {}
        # One queue and worker per endpoint: the harness's jobs never wait for the agent's.
        self.batch_pools = {
            role: ThreadPoolExecutor(
                max_workers=1,
                thread_name_prefix=f"ale-batch-{role}",
                initializer=init_helper_thread,
                initargs=(f"ale-batch-{role}", batch_cpus),
            )
            for role in (AGENT, HARNESS)
        }
        budget = task.spec.budgets.env_steps if env_step_budget == TASK_BUDGET else env_step_budget
        self.budget = StepBudget(budget)
        self.agent_phase_over = ""  # why, once the harness began the official evaluation
        self.step_pool = StepPool(step_threads or default_step_threads(batch_cpus), batch_cpus)
        self.version = __version__

    def shutdown(self) -> None:
        for job in list(self.batches.values()):
            job.stop("cancelled: the evaluator is shutting down")
        for pool in self.batch_pools.values():
            pool.shutdown(wait=True, cancel_futures=True)
        with self.lock:
            for group in self.groups.values():
                with group.lock:
                    group.close("the evaluator shut down")
            self.groups.clear()
        self.step_pool.shutdown()
        self.events.close()

    def spec(self, group: EnvGroup | None) -> pb.EnvSpec:
        t = self.task.spec
        spec = pb.EnvSpec(
            task_id=t.id,
            task_version=t.version,
            gym_id=t.gym_id,
            genre=t.genre,
            mode=t.mode,
            headline_metric=t.headline.metric,
            headline_direction=t.headline.direction,
            safety_metrics=list(t.safety_metrics),
            official_episodes=t.official_episodes,
            evaluator_version=self.version,
            task_digest=self.task.digest,
        )
        if group is not None:
            env = group.envs[0]
            encode_space(env.observation_space, spec.observation_space)
            encode_space(env.action_space, spec.action_space)
            spec.num_envs = group.num_envs
            spec.autoreset_mode = group.autoreset
            spec.max_episode_steps = env.spec.max_episode_steps or 0 if env.spec else 0
            spec.official = group.official
        else:
            from ale_evaluator.envs import make_env

            env = make_env(self.task)
            try:
                encode_space(env.observation_space, spec.observation_space)
                encode_space(env.action_space, spec.action_space)
                spec.max_episode_steps = env.spec.max_episode_steps or 0 if env.spec else 0
            finally:
                env.close()
        return spec

    def log_episode_ends(self, session_id: str, records: Mapping[int, EpisodeRecord], before: set[int]) -> None:
        """An ``episode_end`` event for each record not in ``before`` (commitment only, never the seed)."""
        for index in sorted(set(records) - before):
            rec = records[index]
            self.events.record(
                "episode_end",
                session_id=session_id,
                index=index,
                seed_commitment=rec.seed_commitment,
                length=rec.length,
                aborted=rec.aborted,
                abort_reason=rec.abort_reason,
            )

    # -- phases and batches -----------------------------------------------------------------

    def end_agent_phase(self) -> None:
        """The harness began the official evaluation: stop the agent's batch jobs, refuse new ones."""
        with self.lock:
            if self.agent_phase_over:
                return
            self.agent_phase_over = AGENT_PHASE_OVER
            jobs = [job for job in self.batches.values() if job.owner == AGENT]
        for job in jobs:
            job.stop(AGENT_PHASE_OVER)

    def forget_finished_agent_batches(self, *, keep: int) -> None:
        """Drop the oldest finished agent batches past ``keep`` (call with the lock held), so that an
        agent submitting many small batches cannot grow the evaluator's memory without bound.
        Official and harness batches are never dropped; the dict keeps submission order."""
        finished = [bid for bid, job in self.batches.items() if job.owner == AGENT and not job.active]
        for bid in finished[: max(0, len(finished) - keep)]:
            del self.batches[bid]

    def batch_progress(self, job: BatchJob, *, final: bool = False) -> None:
        """A ``batch_progress`` event: every job's progress, and the agent's step total with its own."""
        now = time.monotonic()
        if not final and now - job.last_progress < PROGRESS_INTERVAL_S:
            return
        job.last_progress = now
        fields: dict[str, Any] = {
            "batch_id": job.batch_id,
            "official": job.official,
            "endpoint": job.owner,
            "state": BATCH_STATES[job.ending[0] if final else job.state],
            "episodes_done": len(job.records),
            "num_episodes": job.num_episodes,
            "env_steps": job.env_steps,
        }
        if job.owner == AGENT:
            fields["agent_env_steps_total"] = self.budget.used
        if final and job.ending[1]:
            fields["error"] = job.ending[1]
        self.events.record("batch_progress", **fields)

    def on_batch_record(self, job: BatchJob, rec: EpisodeRecord) -> None:
        """Called on the batch thread as each episode of ``job`` ends."""
        if job.official:
            self.log_episode_ends(job.batch_id, {rec.index: rec}, set())
        if job.owner == AGENT and not self.budget.charge(rec.length):
            job.stop(f"stopped: {self.budget.refusal()}")
        self.batch_progress(job)

    # -- registry ---------------------------------------------------------------------------

    def add_group(self, group: EnvGroup) -> None:
        with self.lock:
            total = sum(g.num_envs for g in self.groups.values())
            while len(self.groups) >= self.limits.max_envs or total + group.num_envs > self.limits.max_total_copies:
                victim = next((g for g in self.groups.values() if g.owner == AGENT and not g.official), None)
                if victim is None:
                    raise exhausted("too many live environments; the evaluator cannot make room")
                self._close_group(victim, "closed to make room: least recently used")
                total -= victim.num_envs
            self.groups[group.env_id] = group

    def _close_group(self, group: EnvGroup, why: str) -> None:
        self.groups.pop(group.env_id, None)
        self.closed_ids[group.env_id] = why
        with group.lock:
            group.close(why)

    def group(self, env_id: str, role: str) -> EnvGroup:
        with self.lock:
            group = self.groups.get(env_id)
            if group is None:
                why = self.closed_ids.get(env_id)
                raise not_found(f"environment {echo(env_id)} was {why}" if why else f"unknown env_id {echo(env_id)}")
            self.groups.move_to_end(env_id)
        group.last_used = time.monotonic()
        if role == AGENT and group.owner == HARNESS:
            session = group.session
            if not (group.official and session is not None and not session.finalized):
                raise denied("this environment belongs to the harness endpoint")
        return group


def _new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(16)}"


class LongPollGate:
    """How many long polls (GetBatchEvalStatus with wait_ms) may hold one endpoint's threads at once.

    gRPC's synchronous server runs every call on a fixed pool of threads; a poll waiting for a
    batch holds its thread. Past ``slots`` waiting polls, a poll is answered at once with the
    current status, so long polls can never take every thread from the endpoint's other calls.
    """

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self._free = threading.BoundedSemaphore(slots)
        self._lock = threading.Lock()
        self.waiting = 0

    def wait(self, event: threading.Event, seconds: float) -> bool:
        """Wait for ``event`` up to ``seconds`` if a slot is free; False if none was."""
        if not self._free.acquire(blocking=False):
            return False
        with self._lock:
            self.waiting += 1
        try:
            event.wait(seconds)
        finally:
            with self._lock:
                self.waiting -= 1
            self._free.release()
        return True


class AleEnvServicer:
    """The eight RPCs for one endpoint role. Handlers take and return protobuf messages."""

    def __init__(self, state: EvaluatorState, role: str, *, long_poll_slots: int = 2) -> None:
        assert role in (AGENT, HARNESS)
        self.state = state
        self.role = role
        self.long_polls = LongPollGate(long_poll_slots)

    def _harness_only(self, what: str) -> None:
        if self.role != HARNESS:
            raise denied(f"{what} is reserved for the harness endpoint")

    def _official(self, mode: str) -> None:
        """The harness begins (or goes on with) the official evaluation, which must be ``mode``'s."""
        st = self.state
        st.end_agent_phase()
        t = st.task.spec
        if t.mode == mode:
            return
        if t.mode == "batch":
            raise precondition(
                f"task {t.id} is a batch task: its official evaluation is SubmitBatchEval{{official: true}}, "
                "not an eval session"
            )
        raise precondition(
            f"task {t.id} is an interactive task: its official evaluation is an eval session "
            "(CreateEnv{official: true}, then StartEvalSession), not an official batch"
        )

    def _agent_may_work(self, what: str) -> None:
        """Refuse the agent new environment work after its phase or past its env-step budget."""
        st = self.state
        if st.agent_phase_over:
            raise precondition(f"{what}: the agent phase is over (the official evaluation started)")
        if st.budget.exceeded:
            raise exhausted(f"{what}: {st.budget.refusal()}")

    # -- RPCs -------------------------------------------------------------------------------

    def CreateEnv(self, req: pb.CreateEnvRequest) -> pb.CreateEnvResponse:
        st = self.state
        if req.task_id and req.task_id != st.task.spec.id:
            raise not_found(f"this evaluator serves task {st.task.spec.id!r}, not {echo(req.task_id)}")
        if req.official:
            self._harness_only("creating an official environment")
        k = req.num_envs or 1
        if k > st.limits.max_copies:
            raise invalid(f"num_envs {k} exceeds the limit of {st.limits.max_copies}")
        if req.autoreset_mode not in (pb.AUTORESET_MODE_DISABLED, pb.AUTORESET_MODE_SAME_STEP):
            raise invalid(f"unknown autoreset_mode {req.autoreset_mode}")
        if req.official and (k != 1 or req.autoreset_mode != pb.AUTORESET_MODE_DISABLED):
            raise invalid("an official environment has num_envs=1 and autoreset disabled")
        if req.official:
            self._official("interactive")
        group = EnvGroup(
            env_id=_new_id("env"),
            task=st.task,
            domain=st.domain,
            num_envs=k,
            autoreset=req.autoreset_mode,
            official=req.official,
            owner=self.role,
            step_pool=st.step_pool,
        )
        spec = st.spec(group)
        try:
            st.add_group(group)
        except RpcError:
            group.close("refused")
            raise
        return pb.CreateEnvResponse(env_id=group.env_id, spec=spec)

    def GetSpec(self, req: pb.GetSpecRequest) -> pb.GetSpecResponse:
        if not req.env_id:
            return pb.GetSpecResponse(spec=self.state.spec(None))
        group = self.state.group(req.env_id, self.role)
        with group.lock:
            if group.closed:
                raise not_found(f"environment {echo(req.env_id)} was {group.closed}")
            return pb.GetSpecResponse(spec=self.state.spec(group))

    def Reset(self, req: pb.ResetRequest) -> pb.ResetResponse:
        group = self.state.group(req.env_id, self.role)
        reply = pb.ResetResponse()
        with group.lock:
            if group.closed:
                raise not_found(f"environment {echo(req.env_id)} was {group.closed}")
            if group.official:
                session = group.session
                if session is None:
                    raise precondition("an official environment runs only inside an eval session")
                before = set(session.records)
                try:
                    obs = session.reset()
                finally:
                    self.state.log_episode_ends(session.session_id, session.records, before)
                reply.seed_ignored = req.HasField("seed")
                session.progress(reply.eval)
            else:
                obs = group.reset(req.seed if req.HasField("seed") else None)
        encode_tensor(obs, reply.observation)
        return reply

    def Step(self, req: pb.StepRequest) -> pb.StepResponse:
        st = self.state
        group = st.group(req.env_id, self.role)
        action = decode_tensor(req.action, what="action", shape=group.action_shape)
        counted = self.role == AGENT and not group.official  # the agent's own steps, not the official ones
        if counted and st.budget.exceeded:
            raise exhausted(st.budget.refusal())
        reply = pb.StepResponse()
        with group.lock:
            if group.closed:
                raise not_found(f"environment {echo(req.env_id)} was {group.closed}")
            session = group.session
            if group.official and (session is None or session.finalized):
                raise precondition("an official environment runs only inside an open eval session")
            out, ended = group.step(action)
            if session is not None:
                before = set(session.records)
                session.on_step(ended)
                st.log_episode_ends(session.session_id, session.records, before)
                session.progress(reply.eval)
        if counted:
            st.budget.charge(group.num_envs)
        encode_tensor(out.observation, reply.observation)
        encode_tensor(out.reward, reply.reward)
        encode_tensor(out.terminated, reply.terminated)
        encode_tensor(out.truncated, reply.truncated)
        encode_tensor(out.cost, reply.cost)
        if out.final_observation is not None:
            encode_tensor(out.final_observation, reply.final_observation)
        return reply

    def StartEvalSession(self, req: pb.StartEvalSessionRequest) -> pb.StartEvalSessionResponse:
        self._harness_only("StartEvalSession")
        self._official("interactive")
        st = self.state
        group = st.group(req.env_id, self.role)
        n = req.num_episodes or st.task.spec.official_episodes
        if n > st.limits.max_episodes:
            raise invalid(f"num_episodes {n} exceeds the limit of {st.limits.max_episodes}")
        with group.lock:
            if not group.official:
                raise precondition("eval sessions run on an official environment (CreateEnv official=true)")
            if group.session is not None:
                raise precondition("this official environment already has an eval session")
            session = EvalSession(session_id=_new_id("session"), group=group, config=st.config, num_episodes=n)
            group.session = session
        with st.lock:
            st.sessions[session.session_id] = session
        st.events.record("eval_session_start", session_id=session.session_id, env_id=group.env_id, num_episodes=n)
        return pb.StartEvalSessionResponse(session_id=session.session_id, env_id=group.env_id, num_episodes=n)

    def GetEvalResult(self, req: pb.GetEvalResultRequest) -> pb.GetEvalResultResponse:
        self._harness_only("GetEvalResult")
        st = self.state
        with st.lock:
            session = st.sessions.get(req.session_id)
            job = st.batches.get(req.session_id)
        if session is not None:
            group = session.group
            with group.lock:
                if req.finalize and not session.finalized:
                    before = set(session.records)
                    session.finalize()
                    st.log_episode_ends(session.session_id, session.records, before)
                result = session.result(st.version)
            if req.finalize:
                with st.lock:
                    if group.env_id in st.groups:
                        st._close_group(group, "closed: its eval session was finalized")
        elif job is not None:
            if req.finalize and job.active:
                job.stop("cancelled: the harness finalized the evaluation before it finished")
            result = job.result(st.version)
        else:
            raise not_found(f"unknown session_id {echo(req.session_id)}")
        if req.finalize:
            st.events.record(
                "eval_result",
                session_id=req.session_id,
                complete=result.complete,
                headline_value=result.headline_value,
                passed_episodes=result.passed_episodes,
            )
        return pb.GetEvalResultResponse(result=result)

    def SubmitBatchEval(self, req: pb.SubmitBatchEvalRequest) -> pb.SubmitBatchEvalResponse:
        st = self.state
        if req.official:
            self._harness_only("an official batch evaluation")
            self._official("batch")
        elif self.role == AGENT:
            self._agent_may_work("SubmitBatchEval")
        policy = load_policy(req.policy, max_bytes=st.limits.max_policy_bytes)
        check_policy_fits(policy, st.task)
        n = req.num_episodes or st.task.spec.official_episodes
        if n > st.limits.max_episodes:
            raise invalid(f"num_episodes {n} exceeds the limit of {st.limits.max_episodes}")
        job = BatchJob(
            batch_id=_new_id("batch"),
            task=st.task,
            domain=st.domain,
            policy=policy,
            num_episodes=n,
            official=req.official,
            owner=self.role,
            config=st.config,
            base_seed=req.seed,
            step_pool=st.step_pool,
        )
        job.on_record = functools.partial(st.on_batch_record, job)
        job.on_finish = functools.partial(st.batch_progress, job, final=True)
        with st.lock:
            if self.role == AGENT and st.agent_phase_over:  # the phase ended while the policy was checked
                raise precondition("SubmitBatchEval: the agent phase is over (the official evaluation started)")
            pending = sum(j.owner == self.role and j.active for j in st.batches.values())
            if pending >= st.limits.max_pending_batches:
                raise exhausted(
                    f"{pending} batch evaluations of the {self.role} endpoint are already queued; "
                    "wait for one to finish"
                )
            if self.role == AGENT:
                st.forget_finished_agent_batches(keep=st.limits.max_finished_batches - 1)
            st.batches[job.batch_id] = job
            # Queued under the lock, so that end_agent_phase sees every agent job it must stop.
            st.batch_pools[self.role].submit(job.run)
        st.events.record("batch_submitted", batch_id=job.batch_id, official=req.official, num_episodes=n)
        return pb.SubmitBatchEvalResponse(batch_id=job.batch_id, num_episodes=n)

    def GetBatchEvalStatus(self, req: pb.GetBatchEvalStatusRequest) -> pb.GetBatchEvalStatusResponse:
        st = self.state
        with st.lock:
            job = st.batches.get(req.batch_id)
        if job is None:
            raise not_found(f"unknown batch_id {echo(req.batch_id)}")
        if self.role == AGENT and job.owner == HARNESS:
            raise denied("this batch evaluation belongs to the harness endpoint")
        if req.wait_ms > MAX_WAIT_MS:
            raise invalid(f"wait_ms {req.wait_ms} exceeds the limit of {MAX_WAIT_MS}")
        if req.wait_ms and not job.finished.is_set():
            self.long_polls.wait(job.finished, req.wait_ms / 1000)
        reply = pb.GetBatchEvalStatusResponse(
            state=job.state,
            episodes_done=len(job.records),
            num_episodes=job.num_episodes,
            error=job.error,
        )
        if job.state == pb.BATCH_STATE_DONE and not job.official:
            reply.result.CopyFrom(job.result(st.version))
        return reply


# -- gRPC plumbing ------------------------------------------------------------------------------

METHODS: dict[str, tuple[type[Message], type[Message]]] = {
    "CreateEnv": (pb.CreateEnvRequest, pb.CreateEnvResponse),
    "GetSpec": (pb.GetSpecRequest, pb.GetSpecResponse),
    "Reset": (pb.ResetRequest, pb.ResetResponse),
    "Step": (pb.StepRequest, pb.StepResponse),
    "StartEvalSession": (pb.StartEvalSessionRequest, pb.StartEvalSessionResponse),
    "GetEvalResult": (pb.GetEvalResultRequest, pb.GetEvalResultResponse),
    "SubmitBatchEval": (pb.SubmitBatchEvalRequest, pb.SubmitBatchEvalResponse),
    "GetBatchEvalStatus": (pb.GetBatchEvalStatusRequest, pb.GetBatchEvalStatusResponse),
}


LOGGED_IDS = ("env_id", "session_id", "batch_id")


def generic_handler(servicer: AleEnvServicer) -> grpc.GenericRpcHandler:
    """Handlers that parse requests themselves, so undecodable bytes get INVALID_ARGUMENT.

    Every call ends as a reply, a refusal (``ale_evaluator.errors.refusal``: the evaluator's own
    RpcError, or a codec's error about the caller's input), or INTERNAL for anything else, which
    is a bug: logged with its traceback, never shown to the caller. A failure to write the event
    log is such a bug too.
    """

    state = servicer.state
    events = state.events
    role = servicer.role

    def wrap(name: str, req_cls: type[Message], fn: Callable[[Any], Message]) -> grpc.RpcMethodHandler:
        summarise = name in SUMMARISED
        counts_steps = name == "Step" and role == AGENT
        id_fields = tuple(f for f in LOGGED_IDS if f in req_cls.DESCRIPTOR.fields_by_name)

        def handler(raw: bytes, context: grpc.ServicerContext) -> bytes:
            started = time.perf_counter()
            request: Message | None = None
            reply: Message | None = None
            code, message = grpc.StatusCode.OK, ""
            try:
                request = parse_request(req_cls, raw)
                check_request(request)
                reply = fn(request)
            except Exception as exc:
                refused = refusal(exc)
                if refused is None:
                    log.exception("%s endpoint: %s failed", role, name)
                    code = grpc.StatusCode.INTERNAL
                    message = f"internal evaluator error in {name}; see the evaluator log"
                else:
                    code, message = refused.code, refused.message
            if events.enabled:
                try:
                    steps = reply.reward.shape[0] if isinstance(reply, pb.StepResponse) and reply.reward.shape else 0
                    events.rpc(
                        role,
                        name,
                        code.name,
                        summarise=summarise,
                        duration_s=time.perf_counter() - started,
                        env_steps=steps,
                        agent_env_steps_total=state.budget.used if counts_steps else None,
                        **({f: getattr(request, f) for f in id_fields} if request is not None else {}),
                    )
                except Exception:
                    log.exception("%s endpoint: %s: the event log could not be written", role, name)
                    code, message = grpc.StatusCode.INTERNAL, "internal evaluator error: see the evaluator log"
            if code is not grpc.StatusCode.OK or reply is None:
                context.abort(code, message)
            assert reply is not None  # context.abort raised otherwise
            serialized: bytes = reply.SerializeToString()
            return serialized

        return grpc.unary_unary_rpc_method_handler(handler)

    handlers = {name: wrap(name, req, getattr(servicer, name)) for name, (req, _) in METHODS.items()}
    return grpc.method_handlers_generic_handler(SERVICE_NAME, handlers)
