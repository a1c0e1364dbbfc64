"""Synthetic trajectories for the tests: whole runs that follow the grammar (ale.core.grammar).

:class:`RunBuilder` chains events with :class:`~ale.core.trajectory.ChainBuilder`, each producer on
its own increasing clock; :func:`valid_stream` is a one-task batch run whose agent phase holds
``body`` events of the agent, the evaluator and the harness, in turn.
"""

from __future__ import annotations

from typing import Any

from ale.core.trajectory import ChainBuilder

T0 = 1_764_476_918.123456  # 2025-11-30T04:28:38.123456Z
TASK = "cartpole-balance@1.0.0"


class RunBuilder:
    def __init__(self, *, nonce: str | None = "nonce-abc", tasks: tuple[str, ...] = (TASK,)) -> None:
        self.chain = ChainBuilder()
        self.lines: list[bytes] = []
        self.clock: dict[str, float] = {}
        self.tasks = tasks
        self.add("trusted_harness", "run_started", {"nonce": nonce, "run_id": "run-1", "tasks": list(tasks)})

    def add(self, producer: str, kind: str, data: dict[str, Any] | None = None) -> RunBuilder:
        mono = self.clock[producer] = self.clock.get(producer, 0.0) + 1.0
        _, line = self.chain.append(producer, kind, data or {}, wall_time=T0 + len(self.lines), monotonic=mono)
        self.lines.append(line)
        return self

    def harness(self, kind: str, task: str = TASK, **data: Any) -> RunBuilder:
        return self.add("trusted_harness", kind, {"task": task, **data})

    def open_task(self, task: str = TASK) -> RunBuilder:
        self.harness("task_started", task, digest="0" * 64, mode="batch").harness("evaluator_started", task)
        self.add("trusted_evaluator", "evaluator_ready", {"task": task, "evaluator_seq": 1})
        return self.harness("agent_started", task)

    def close_task(self, task: str = TASK, *, episodes: int = 2, session: str = "batch-1") -> RunBuilder:
        self.harness("agent_finished", task).harness("official_evaluation_started", task)
        self.harness("policy_artifact", task, bytes=1, sha256="0" * 64)
        for index in range(episodes):
            self.add("trusted_evaluator", "episode_end", {"task": task, "session_id": session, "index": index})
        self.add("trusted_evaluator", "eval_result", {"task": task, "session_id": session, "complete": True})
        return self.harness("official_evaluation_finished", task).harness("task_finished", task)

    def body(self, n: int, task: str = TASK) -> RunBuilder:
        """``n`` events of the agent phase: agent notes, evaluator RPCs, harness rejections, in turn."""
        for i in range(n):
            if i % 3 == 0:
                self.add("untrusted_agent", "note", {"i": i, "text": "x" * (i % 50)})
            elif i % 3 == 1:
                self.add("trusted_evaluator", "rpc", {"task": task, "i": i, "v": [0.25 * i, -i]})
            else:
                self.harness("rejected_agent_event", task, reason=f"line {i}")
        return self

    def finish(self) -> RunBuilder:
        return self.add("trusted_harness", "run_finished", {"tasks": {t: "completed" for t in self.tasks}})

    def stream(self) -> bytes:
        return b"".join(self.lines)


def valid_stream(body: int = 6, *, nonce: str | None = "nonce-abc") -> bytes:
    return RunBuilder(nonce=nonce).open_task().body(body).close_task().finish().stream()
