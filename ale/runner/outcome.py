"""What the harness learned about one task (:class:`TaskOutcome`), how a task ends early
(:class:`TaskEnded`), and the outcome's JSON forms: the entry of ``task_results.json`` and the
record a run's state folder keeps of a finished task (:mod:`ale.runner.state`)."""

from __future__ import annotations

from typing import Any

import attrs

from ale import catalog
from ale.core.documents import AgentPhase, PhaseNetwork
from ale.core.parse import ParseError, converter, structure
from ale.core.results import TASK_RESULTS_SCHEMA, Ended, ResultInconsistency, TaskResult, check_result
from ale.env.v1 import env_pb2 as pb
from ale.runner.network import NO_NETWORK

#: the manifest's agent entry of a task whose agent never ran (docs/formats.md)
NO_AGENT: dict[str, Any] = {"exit_status": None, "stopped_for": "", "wall_time_s": 0.0, "env_steps": 0, "oom_kills": 0}


class TaskEnded(Exception):
    """The task ends early: in ``phase``, for ``category`` (ale.core.results.END_CATEGORIES)."""

    def __init__(self, phase: str, category: str, reason: str) -> None:
        super().__init__(reason)
        self.ended = Ended(phase, category)  # type: ignore[arg-type]  # checked against the closed set here
        self.reason = reason


@attrs.define
class TaskOutcome:
    """What the harness learned about one task; becomes an entry of task_results.json."""

    task: catalog.Task
    status: str = "not_completed"
    reason: str = ""
    result: dict[str, Any] | None = None
    agent: dict[str, Any] = attrs.Factory(lambda: dict(NO_AGENT))
    artifact: dict[str, Any] | None = None
    episodes: int = 0
    network: dict[str, str] = attrs.Factory(lambda: dict(NO_NETWORK))  # each phase's policy (manifest)
    ended: Ended | None = None  # how a task that did not complete ended
    judgement: Any = None  # the judge's ale.core.verdict.JudgeResult (a judged reproduction task)

    def end(self, phase: str, category: str, reason: str | None = None) -> None:
        """Mark the task not completed: ended in ``phase`` for ``category`` (``reason``: why, if new)."""
        self.status = "not_completed"
        self.ended = Ended(phase, category)  # type: ignore[arg-type]
        if reason is not None:
            self.reason = reason

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
            "ended": None if self.ended is None else self.ended.entry(),
        }

    def finished_data(self) -> dict[str, Any]:
        """The ``task_finished`` event's data."""
        ended = None if self.ended is None else self.ended.entry()
        return {"task": self.task.spec.ref, "status": self.status, "reason": self.reason, "ended": ended}

    # -- the state folder's record of a finished task ---------------------------------------------

    def record(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "reason": self.reason,
            "result": self.result,
            "agent": self.agent,
            "artifact": self.artifact,
            "episodes": self.episodes,
            "network": self.network,
            "ended": None if self.ended is None else self.ended.entry(),
        }

    @classmethod
    def from_record(cls, task: catalog.Task, record: Any, run_id: str) -> TaskOutcome:
        """The outcome a state folder recorded, checked as a bundle's documents are (ValueError)."""
        if not isinstance(record, dict) or set(record) != set(cls(task).record()):
            raise ValueError("the outcome does not have the record's members")
        try:
            entry = {**cls(task).entry(), **{k: record[k] for k in ("status", "reason", "result", "ended")}}
            check_result(structure(entry, TaskResult, what="the recorded outcome"))
            if record["status"] == "not_completed" and record["ended"] is None:
                raise ValueError("a task that did not complete says how it ended")
            structure(record["agent"], AgentPhase, what="the recorded agent phase")
            structure(record["network"], PhaseNetwork, what="the recorded network policies")
            if record["artifact"] is not None:
                _artifact(record["artifact"])
        except (ParseError, ResultInconsistency) as exc:
            raise ValueError(str(exc)) from None
        result = record["result"]
        if result is not None and (result["run_id"], f"{result['task_id']}@{result['task_version']}") != (
            run_id,
            task.spec.ref,
        ):
            raise ValueError("the recorded result is another run's or another task's")
        if type(record["episodes"]) is not int or record["episodes"] < 0:
            raise ValueError("episodes must be a non-negative integer")
        ended = None if record["ended"] is None else converter.structure(record["ended"], Ended)
        return cls(
            task=task,
            status=record["status"],
            reason=record["reason"],
            result=result,
            agent=record["agent"],
            artifact=record["artifact"],
            episodes=record["episodes"],
            network=record["network"],
            ended=ended,
        )


def _artifact(value: Any) -> None:
    ok = (
        isinstance(value, dict)
        and set(value) == {"path", "bytes", "sha256"}
        and type(value["path"]) is str
        and type(value["bytes"]) is int
        and type(value["sha256"]) is str
    )
    if not ok:
        raise ValueError("the recorded policy artifact is not {path, bytes, sha256}")


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


__all__ = ["NO_AGENT", "TaskEnded", "TaskOutcome", "eval_result_json", "task_results_json"]
