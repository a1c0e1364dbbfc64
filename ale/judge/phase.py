"""The harness's two judge steps of a reproduction task (docs/judge.md, "In a run").

* :func:`record_snapshot`, after the agent finished: the workspace's code artifacts into the
  trajectory (``artifact_snapshot``, then one ``artifact_file`` per included text file).
* :func:`judge_task`, after the official evaluation and once the evaluator is stopped, when the run
  has a judge: the judge input built from the task's window of the trajectory (the very lines the
  recorder wrote, from ``task_started`` on), ``judge_started``, the exchange through the judge's own
  gateway in a worker thread, the gateway's events relayed as ``trusted_network_proxy`` events,
  ``judge_finished``. Every failure is an unfaithful result; none stops the run.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import trio

from ale.core.judge_input import TaskContext, build_input, snapshot_events, task_windows
from ale.core.verdict import failed
from ale.judge.client import ATTEMPTS, Exchange, Transport, ask
from ale.judge.gateway import UPSTREAM, GatewayError, JudgeGateway, budgets, relayed
from ale.judge.snapshot import walk

if TYPE_CHECKING:
    from ale.catalog import Task
    from ale.core.judge_input import JudgeInput
    from ale.core.rubric import Rubric
    from ale.core.verdict import JudgeResult
    from ale.runner.options import JudgeOptions
    from ale.runner.recorder import Recorder


def context(task: Task) -> TaskContext:
    """What the judge input needs of a task (its rubric: reproduction tasks only)."""
    from ale.catalog import judge_context

    return judge_context(task)


async def record_snapshot(task: Task, workspace: Path, rec: Recorder) -> None:
    entries, unlisted = await trio.to_thread.run_sync(walk, workspace)
    summary, *files = snapshot_events(task.spec.ref, entries, unlisted)
    rec.emit("trusted_harness", "artifact_snapshot", summary)
    for data in files:
        rec.emit("trusted_harness", "artifact_file", data)


def _exchange(session: JudgeGateway, options: JudgeOptions, judge_input: JudgeInput, rubric: Rubric) -> Exchange:
    try:
        try:
            socket_path = session.start()
        except GatewayError as exc:
            result = failed("error", f"the judge's gateway did not start: {exc}", model=options.model,
                            input_sha256=judge_input.sha256)  # fmt: skip
            return Exchange(result, 0, 0, 0, ())
        transport = Transport(f"http://localhost/{UPSTREAM}", session.placeholder, unix_socket=socket_path,
                              timeout=options.timeout_s)  # fmt: skip
        return ask(transport, options.model, judge_input, rubric)
    finally:
        session.stop()
        session.close()


async def judge_task(
    task: Task, lines: list[bytes], rec: Recorder, options: JudgeOptions, *, run_id: str, folder: Path
) -> JudgeResult:
    """Judge one task from its recorded lines; the result goes into faithfulness.json."""
    ctx = context(task)
    window = task_windows(lines, [ctx.ref])[ctx.ref]
    judge_input = build_input(window, ctx, run_id)
    limits = budgets(len(judge_input.text), ATTEMPTS)
    endpoint = Transport(options.base_url, None).endpoint
    rec.emit(
        "trusted_harness",
        "judge_started",
        {"task": ctx.ref, "model": options.model, "endpoint": endpoint.origin, "input_sha256": judge_input.sha256,
         "input_bytes": len(judge_input.text), "budgets": limits},
    )  # fmt: skip
    session = JudgeGateway(folder, run_id, endpoint.base_url, options.api_key, limits, name=f"judge-{task.spec.id}")
    try:
        exchange = await trio.to_thread.run_sync(
            _exchange, session, options, judge_input, ctx.rubric, abandon_on_cancel=True
        )
    finally:
        session.kill()
    _relay(session, rec, ctx.ref)
    result = exchange.result
    rec.emit(
        "trusted_harness",
        "judge_finished",
        {"task": ctx.ref, **{k: v for k, v in result.entry().items() if k != "signature"},
         "requests": exchange.requests,
         "usage": {"input_tokens": exchange.input_tokens, "output_tokens": exchange.output_tokens}},
    )  # fmt: skip
    return result


def _relay(session: JudgeGateway, rec: Recorder, task: str) -> None:
    """The judge gateway's lines as ``trusted_network_proxy`` events; a line that cannot be read is
    an ``unreadable_gateway_event`` marked ``"gateway": "judge"``, as the agent's gateway's are
    (:class:`ale.runner.tails.GatewayTail`), never a ``refused_event`` (the grammar refused nothing)."""
    for line in session.events():
        parsed = relayed(line, task) if isinstance(line, dict) else line
        if isinstance(parsed, str):
            data = {"task": task, "gateway": UPSTREAM, "reason": parsed}
            rec.emit("trusted_harness", "unreadable_gateway_event", data)
            continue
        kind, data, wall, mono = parsed
        rec.emit("trusted_network_proxy", kind, data, wall_time=wall, monotonic=mono)
